"""Core, transports and supervision import nothing above them (docs/internals.md, "Layers").

``lint-imports`` (import-linter) checks the contract in pyproject.toml on the import graph of
the sources: every import counts, those inside functions and under ``TYPE_CHECKING`` too. The
packages above plug in through ``regency.core._extensions``, filled by ``regency._boot`` at
``import regency``; the tests below also check that wiring.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from subprocess import run

import pytest

import regency
from regency import _boot, _debugger
from regency._tensor_engine import _procmesh
from regency.actor import ProcMesh
from regency.core import _extensions
from regency.core._shape import Shape

ROOT = Path(regency.__file__).parent.parent
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")

#: What may call the layers below but never be imported by them.
LOWER = ("regency.core", "regency.transports", "regency.supervision")
UPPER = (
    "regency._tensor_engine",
    "regency._logs",
    "regency._debugger",
    "regency.sim",
    "regency.job",
    "regency._boot",
    "regency._admin",
    "regency.rdma",
    "regency._dashboard",
    "regency.testing",
)


def _lint_imports(*args: str) -> tuple[int, str]:
    done = run(
        [LINT_IMPORTS, "--no-cache", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr


def _exists(module: str) -> bool:
    """A module or a package (with its ``__init__.py``: import-linter sees no other kind)."""
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _contract() -> tuple[str, list[str], list[str]]:
    """The one contract in pyproject.toml: its type, source and forbidden modules."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    return contract["type"], contract["source_modules"], contract["forbidden_modules"]


def test_core_transports_and_supervision_import_nothing_above_them() -> None:
    code, output = _lint_imports()
    assert code == 0, output
    assert "1 kept, 0 broken" in output, output


def test_the_contract_names_every_upper_package() -> None:
    kind, sources, forbidden = _contract()
    assert kind == "forbidden"
    assert sorted(sources) == sorted(LOWER)
    missing = sorted(m for m in UPPER if _exists(m) and m not in forbidden)
    assert not missing, (
        f"add {missing} to forbidden_modules in [tool.importlinter] (pyproject.toml)"
    )


def test_the_checker_finds_an_import_upward(tmp_path: Path) -> None:
    """The same tool on a contract the sources break (core imports transports): it must
    say so, naming the import, or the test above would prove nothing."""
    config = tmp_path / "broken.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "regency"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "core without transports"\ntype = "forbidden"\n'
        'source_modules = ["regency.core"]\nforbidden_modules = ["regency.transports"]\n'
    )
    code, output = _lint_imports("--config", str(config))
    assert code != 0, output
    assert "regency.core is not allowed to import regency.transports" in output, output


def test_import_regency_plugs_the_upper_packages_in() -> None:
    assert _extensions.debugger is _debugger.hooks
    assert _extensions.mesh_tensors() is _procmesh
    assert _extensions._boot is _boot.start_controller
    assert list(_extensions._proc_installers) == ["logs", "debugger"]
    from regency import _logs

    assert _extensions.log_forwarding() is _logs


def test_the_debuggers_session_count_is_cores() -> None:
    """The mailbox tests ``_extensions.debug_sessions`` after every call: the debugger must
    keep its count there, not in a module of its own."""
    from regency._debugger import _remote

    assert not hasattr(_remote, "open_sessions")
    assert "_extensions.debug_sessions += 1" in Path(_remote.__file__).read_text()


def test_proc_mesh_methods_of_the_tensor_engine_are_plugged_in() -> None:
    mesh = ProcMesh((("c1.p0", "a0"), ("c1.p1", "a1")), Shape.full(["gpus"], [2]))
    calls: list[tuple[str, object]] = []

    class Engine:
        def activate(self, mesh: ProcMesh) -> str:
            calls.append(("activate", mesh))
            return "active"

        def rank_tensor(self, mesh: ProcMesh, dims: tuple[str, ...]) -> str:
            calls.append(("rank_tensor", dims))
            return "tensor"

    try:
        _extensions.register_mesh_tensors(Engine())
        assert mesh.activate() == "active"
        assert mesh.rank_tensor("gpus") == "tensor"
        assert mesh.rank_tensor(["gpus"]) == "tensor"
        assert mesh.rank_tensors() == {"gpus": "tensor"}
        assert calls == [
            ("activate", mesh),
            ("rank_tensor", ("gpus",)),
            ("rank_tensor", ("gpus",)),
            ("rank_tensor", ("gpus",)),
        ]
        _extensions._mesh_tensors = None
        with pytest.raises(_extensions.NotPluggedIn, match="the tensor engine"):
            mesh.activate()
    finally:
        _boot.plug_in()
    assert _extensions.mesh_tensors() is _procmesh
