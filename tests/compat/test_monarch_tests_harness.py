"""benchmarks/monarch_tests.py: how it filters Monarch's test files, and its pytest plugin.

The filtering is pure (the public aliases Monarch's interpreter would report are given here),
so these tests need neither Monarch nor its repository. The plugin is run by a real pytest in
a child process, as the harness runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import monarch_tests as mt

SOURCE = textwrap.dedent(
    '''\
    import pytest
    import monarch.actor
    from monarch._src.actor.host_mesh import this_host, _spawn_admin
    from monarch._rust_bindings.monarch_hyperactor.mailbox import Envelope
    from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
    from monarch.actor import (
        Actor,
        endpoint,
    )
    from helper import uses_private, plain


    class Counter(Actor):
        @endpoint
        def value(self) -> int:
            return 1

        def _undeliverable(self, message: Envelope) -> bool:
            return True


    def spawn_admin_helper():
        return _spawn_admin()


    def test_portable():
        mesh = this_host().spawn_procs().spawn("c", Counter)
        assert monarch.actor.Actor is Actor
        assert mesh.value.call_one().get() == 1


    def test_uses_private_helper():
        spawn_admin_helper()


    @pytest.mark.oss_skip
    def test_oss_skipped():
        pass


    def test_needs_cuda():
        import torch
        torch.zeros(1, device="cuda")


    def test_patches_private():
        from unittest.mock import patch
        with patch("monarch._src.actor.host_mesh.this_host"):
            pass


    def test_helper_module():
        uses_private()


    def test_helper_plain():
        plain()


    def test_supervision():
        with pytest.raises(SupervisionError):
            raise SupervisionError("x")


    def test_script():
        code = "from monarch.actor import this_host; import monarch.config"
        assert "monarch" in code


    class TestGroup:
        def test_ok(self):
            assert this_host is not None

        def test_not_ok(self):
            _spawn_admin()
    '''
)

HELPER = textwrap.dedent(
    """\
    from monarch._src.job.job import JobState


    def uses_private():
        return JobState


    def plain():
        return 1
    """
)

ALIASES: dict[str, str | None] = {
    "monarch._src.actor.host_mesh:this_host": "monarch.actor",
    "monarch._src.actor.host_mesh:_spawn_admin": None,
    "monarch._rust_bindings.monarch_hyperactor.mailbox:Envelope": None,
    "monarch._rust_bindings.monarch_hyperactor.supervision:SupervisionError": None,
    "monarch._src.job.job:JobState": None,
}


def _extract(aliases: dict[str, str | None] = ALIASES) -> mt.Extracted:
    _, helper_taint = mt.extract("helper.py", HELPER, aliases, {"helper": {}})
    taint = {"helper": {k: f"{v} (in helper.py)" for k, v in helper_taint.items()}}
    return mt.extract("test_x.py", SOURCE, aliases, taint)[0]


def test_portable_tests_and_the_reason_for_each_left_out() -> None:
    ex = _extract()
    assert ex.tests == [
        "test_x.py::test_portable",
        "test_x.py::test_helper_plain",
        "test_x.py::test_script",
        "test_x.py::TestGroup::test_ok",
    ]
    reasons = {e.test.split("::", 1)[1]: e.reason for e in ex.excluded}
    assert set(reasons) == {
        "test_uses_private_helper",
        "test_oss_skipped",
        "test_needs_cuda",
        "test_patches_private",
        "test_helper_module",
        "test_supervision",
        "TestGroup::test_not_ok",
    }
    assert "_spawn_admin (no public alias)" in reasons["test_uses_private_helper"]
    assert "via spawn_admin_helper" in reasons["test_uses_private_helper"]
    assert reasons["test_oss_skipped"].startswith("oss_skip")
    assert reasons["test_needs_cuda"] == "needs CUDA"
    assert "names a private module" in reasons["test_patches_private"]
    assert "JobState" in reasons["test_helper_module"]
    assert "in helper.py" in reasons["test_helper_module"]
    assert "SupervisionError (no public alias)" in reasons["test_supervision"]
    assert "_spawn_admin" in reasons["TestGroup::test_not_ok"]


def test_copies_keep_line_numbers_and_differ_only_in_the_rename() -> None:
    ex = _extract()
    original = SOURCE.splitlines()
    monarch, regency = ex.monarch_text.splitlines(), ex.regency_text.splitlines()
    assert len(monarch) == len(regency) == len(original)
    line = next(i for i, text in enumerate(original) if "def test_portable" in text)
    assert monarch[line] == regency[line] == original[line]
    # The alias: the public module, on the private import's line, in both copies.
    assert monarch[2] == "from monarch.actor import this_host"
    assert "'regency.actor', 'this_host'" in regency[2]
    # An annotation-only private name becomes typing.Any; a name used in code is dropped.
    assert monarch[3] == "from typing import Any as Envelope"
    assert monarch[4] == "pass"
    # Tests and helpers that are not portable are blanked, in both copies.
    assert "_spawn_admin" not in ex.monarch_text.replace("import this_host, _spawn_admin", "")
    assert "spawn_admin_helper" not in ex.regency_text
    assert "def test_oss_skipped" not in ex.monarch_text
    # Regency's copy: imports, the names they bind, and imports inside strings.
    assert "import regency.actor" in regency
    assert "assert regency.actor.Actor is Actor" in ex.regency_text
    assert "from regency.actor import this_host; import regency.config" in ex.regency_text
    assert 'assert "monarch" in code' in ex.regency_text  # prose stays
    assert "regency" not in ex.monarch_text
    for text in (ex.monarch_text, ex.regency_text):
        compile(text, "copy", "exec")


def test_lenient_alias_keeps_the_private_import_for_monarch_only() -> None:
    aliases = dict(ALIASES)
    key = "monarch._rust_bindings.monarch_hyperactor.supervision:SupervisionError"
    aliases[key] = mt._LENIENT + "regency.actor"
    ex = _extract(aliases)
    assert "test_x.py::test_supervision" in ex.tests
    assert ex.private_attrs["test_x.py::test_supervision"] == ["SupervisionError (private name)"]
    monarch, regency = ex.monarch_text.splitlines(), ex.regency_text.splitlines()
    assert monarch[4] == (
        "from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError"
    )
    assert "'regency.actor', 'SupervisionError'" in regency[4]


@pytest.mark.slow
def test_plugin_records_outcomes_timeouts_crashes_and_missing_names(tmp_path: Path) -> None:
    """The harness's loop with its plugin, on a real pytest: a pass, a failure with its line,
    a skip, an async test, a test past its limit, one that ends the process, and a name the
    runtime lacks, which fails only the test that uses it."""
    folder = tmp_path / "copy"
    folder.mkdir()
    shutil.copyfile(mt._CHILD, folder / "conftest.py")
    (folder / "pytest.ini").write_text("[pytest]\naddopts =\npython_files = test_*.py\n")
    (folder / "test_it.py").write_text(
        textwrap.dedent(
            """\
            import asyncio, os, time
            import pytest
            from conftest import import_names as _imp_; path, nowhere, = _imp_('os', 'path', 'nowhere')

            def test_pass():
                assert path.join("a", "b") == "a/b"

            def test_fail():
                assert 1 == 2, "one is not two"

            def test_skip():
                pytest.skip("not here")

            async def test_async():
                await asyncio.sleep(0)

            @pytest.mark.timeout(2)
            def test_hangs():
                time.sleep(60)

            def test_exits():
                os._exit(3)

            def test_missing_name():
                nowhere()

            def test_last():
                pass
            """
        )
    )
    results, errors = mt.run_file(
        "regency", sys.executable, str(folder), "test_it.py", [], 30.0,
        str(tmp_path / "log.txt"),
    )
    got = {k.split("::")[1]: v for k, v in results.items()}
    assert {k: v.outcome for k, v in got.items()} == {
        "test_pass": "passed",
        "test_fail": "failed",
        "test_skip": "skipped",
        "test_async": "passed",
        "test_hangs": "timeout",
        "test_exits": "crashed",
        "test_missing_name": "failed",
        "test_last": "passed",
    }
    assert "one is not two" in got["test_fail"].error
    assert got["test_skip"].error == "Skipped: not here"
    assert "cannot import name 'nowhere' from 'os'" in got["test_missing_name"].error
    assert "exited with 3" in got["test_exits"].error
    assert errors == []
    with open(tmp_path / "log.txt") as f:
        assert f.read().count("==== run") == 3  # restarted after the timeout and the exit


@pytest.mark.slow
def test_bad_options_are_refused_with_what_was_expected(tmp_path: Path) -> None:
    script = os.path.join(mt._REPO, "benchmarks", "monarch_tests.py")
    env = dict(os.environ, PYTHONPATH=mt._REPO)
    cases = [
        (["--side", "regency", "--monarch-repo", str(tmp_path / "none")], "no Monarch repository"),
        (["--side", "regency", "--timeout", "0"], "--timeout must be a positive number"),
        (["--monarch-python", str(tmp_path / "python")], "no Monarch interpreter at"),
    ]
    if os.path.isdir(mt.DEFAULT_MIRROR):
        cases.append((["--side", "regency", "--files", "test_nope.py"], "not in python/tests"))
    for argv, message in cases:
        done = subprocess.run(
            [sys.executable, script, *argv], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode != 0
        assert message in done.stderr, (argv, done.stderr)


@pytest.mark.skipif(not os.path.isdir(mt.DEFAULT_MIRROR), reason="no Monarch repository here")
def test_the_chosen_commit_parses_and_keeps_tests(tmp_path: Path) -> None:
    """Every default file of the chosen commit filters to valid Python (the public aliases
    are taken as none, which Monarch's interpreter would only widen)."""
    for name in mt.DEFAULT_FILES:
        source = mt._read(mt.DEFAULT_MIRROR, mt.DEFAULT_COMMIT, f"{mt.TESTS_DIR}/{name}")
        ex, _ = mt.extract(name, source, {}, {})
        compile(ex.monarch_text, name, "exec")
        compile(ex.regency_text, name, "exec")
        assert len(ex.monarch_text.splitlines()) == len(source.splitlines())
    assert json.dumps(mt.DEFAULT_FILES)


def test_a_test_class_without_test_methods_is_a_helper() -> None:
    source = textwrap.dedent(
        """\
        from monarch.actor import Actor, endpoint


        class TestPingActor(Actor):
            @endpoint
            def ping(self) -> int:
                return 1


        def test_uses_it():
            assert TestPingActor
        """
    )
    ex, _ = mt.extract("test_y.py", source, {}, {})
    assert ex.tests == ["test_y.py::test_uses_it"]
    assert "class TestPingActor(Actor):" in ex.regency_text
