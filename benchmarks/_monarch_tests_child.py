"""What ``benchmarks/monarch_tests.py`` puts into each runtime's interpreter.

This file runs under Monarch's interpreter as well as Regency's, so it imports nothing but the
standard library and pytest. It has two uses:

* copied as ``conftest.py`` next to the extracted tests, it is the pytest plugin of a run:
  it registers Monarch's markers (``timeout``, ``oss_skip``), runs ``async def`` tests with
  ``asyncio.run`` (Monarch's suite relies on pytest-asyncio's auto mode, which neither venv
  needs to have), keeps only the tests named in ``$MONARCH_TESTS_ONLY`` (a file of node ids)
  or matching ``$MONARCH_TESTS_MATCH`` (comma-separated substrings), and appends one JSON
  record per event to ``$MONARCH_TESTS_RESULTS``: ``collected``, ``collect_error``,
  ``start`` (with the test's timeout) and ``end`` (outcome, error line, and the deepest frame
  of the failure in the runtime's package ``$MONARCH_TESTS_PACKAGE``). The harness reads the
  records while pytest runs: that is how it enforces each test's timeout and survives a test
  that ends the process.
* ``python _monarch_tests_child.py --aliases`` (under Monarch's interpreter) reads
  ``[[module, name], ...]`` on stdin and prints, for each name imported from a private
  module, the first public module that exports the very same object, or null.
"""

from __future__ import annotations

import asyncio
import faulthandler
import inspect
import json
import os
import re
import sys
import time
from types import TracebackType
from typing import Any

#: where Monarch 0.7 exports its public names, in the order a public alias is looked for
PUBLIC_MODULES = (
    "monarch.actor",
    "monarch.config",
    "monarch.job",
    "monarch.rdma",
    "monarch.fetch",
    "monarch.spmd",
    "monarch",
    "monarch.tools.config",
)


def _aliases() -> None:
    import importlib

    pairs = json.load(sys.stdin)
    public: list[Any] = []
    for name in PUBLIC_MODULES:
        try:
            public.append((name, importlib.import_module(name)))
        except Exception:  # a public module that does not import has no aliases
            pass
    out: dict[str, str | None] = {}
    for module, attr in pairs:
        key = f"{module}:{attr}"
        out[key] = None
        try:
            obj = getattr(importlib.import_module(module), attr)
        except Exception:  # not importable here: no alias
            continue
        for name, mod in public:
            if getattr(mod, attr, None) is obj:
                out[key] = name
                break
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip Monarch's exit path: only the answer matters


if __name__ == "__main__":
    if sys.argv[1:] == ["--aliases"]:
        _aliases()
    raise SystemExit("usage: _monarch_tests_child.py --aliases (or copied as conftest.py)")


# ---- the pytest plugin (conftest.py) ----------------------------------------------------

import pytest  # noqa: E402 (the alias query above must not need pytest)

_RESULTS = os.environ.get("MONARCH_TESTS_RESULTS", "")
_PACKAGE = os.environ.get("MONARCH_TESTS_PACKAGE", "")
_DEFAULT_TIMEOUT = float(os.environ.get("MONARCH_TESTS_TIMEOUT", "120"))
_outcomes: dict[str, dict[str, Any]] = {}

# As Monarch's own conftest: procs a test spawns import what this process imports.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)


def _record(**fields: Any) -> None:
    if not _RESULTS:
        return
    fields["t"] = time.time()
    with open(_RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")
        f.flush()


def _test_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        try:
            return min(float(marker.args[0]), _DEFAULT_TIMEOUT)
        except (TypeError, ValueError):
            pass
    return _DEFAULT_TIMEOUT


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): Monarch's per-test limit")
    config.addinivalue_line("markers", "oss_skip: skipped by Monarch's open-source CI")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        text = str(report.longrepr).strip().splitlines()
        lines = [line for line in text if line.startswith("E ")] or text[-1:]
        _record(event="collect_error", id=report.nodeid, error=lines[-1][:400] if lines else "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = os.environ.get("MONARCH_TESTS_ONLY")
    match = [m for m in os.environ.get("MONARCH_TESTS_MATCH", "").split(",") if m]
    keep = items
    if only:
        with open(only, encoding="utf-8") as f:
            wanted = set(f.read().split("\n"))
        keep = [i for i in keep if i.nodeid in wanted]
    if match:
        keep = [i for i in keep if any(m in i.nodeid for m in match)]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    _record(event="collected", ids=[i.nodeid for i in items])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    limit = _test_timeout(item)
    _outcomes[item.nodeid] = {"outcome": "passed", "error": "", "where": ""}
    _record(event="start", id=item.nodeid, timeout=limit)
    # Where it hangs, should the harness have to kill it at `limit`.
    faulthandler.dump_traceback_later(max(limit - 2.0, 1.0), exit=False)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


def _where(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """The deepest frame of the failure inside the runtime's package: ``path:line``."""
    root = _package_root()
    if not root:
        return ""
    marker = os.path.join(root, _PACKAGE) + os.sep
    found = ""
    exc: BaseException | None = excinfo.value
    tb: TracebackType | None = excinfo.tb
    seen = 0
    while tb is not None and seen < 500:
        path = tb.tb_frame.f_code.co_filename
        if path.startswith(marker):
            found = f"{os.path.relpath(path, root)}:{tb.tb_lineno}"
        tb, seen = tb.tb_next, seen + 1
        if tb is None and not found and exc is not None:
            exc = exc.__cause__ or exc.__context__
            tb = exc.__traceback__ if exc is not None else None
    return found


def _where_in_text(text: str) -> str:
    """The last ``File "...", line N`` of a traceback printed as text (a test run in a
    subprocess, an actor's remote traceback) inside the runtime's package."""
    root = _package_root()
    if not root:
        return ""
    found = ""
    for m in re.finditer(r'File "([^"]+)", line (\d+)', text):
        if m[1].startswith(os.path.join(root, _PACKAGE) + os.sep):
            found = f"{os.path.relpath(m[1], root)}:{m[2]}"
    return found


def _package_root() -> str:
    package = sys.modules.get(_PACKAGE)
    if package is None or not getattr(package, "__file__", None):
        return ""
    return os.path.dirname(os.path.dirname(os.path.abspath(package.__file__ or "")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    state = _outcomes.setdefault(item.nodeid, {"outcome": "passed", "error": "", "where": ""})
    if report.skipped and state["outcome"] == "passed":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        state.update(outcome="skipped", error=str(reason)[:400])
    elif report.failed and state["outcome"] in ("passed", "skipped"):
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        lines = [line for line in message.strip().splitlines() if line.strip()]
        first = lines[0] if lines else "?"
        if len(lines) > 1 and first.rstrip().endswith(":"):
            first = first + " " + lines[1].strip()
        where = _where(call.excinfo) if call.excinfo is not None else ""
        state.update(
            outcome="failed" if report.when == "call" else "error",
            error=first[:400],
            where=where or _where_in_text(str(report.longrepr)),
        )
    return report


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    faulthandler.cancel_dump_traceback_later()
    state = _outcomes.pop(nodeid, {"outcome": "passed", "error": "", "where": ""})
    _record(event="end", id=nodeid, **state)


class _Missing(type):
    """The class of a stand-in for a name the runtime does not have: any use raises."""

    _error: ImportError

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise cls._error

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise cls._error

    def __getitem__(cls, key: Any) -> Any:
        raise cls._error


def import_names(module: str, *names: str) -> tuple[Any, ...]:
    """``from module import names``, where a missing module or name gives a stand-in that
    raises the ImportError at its first use, so that only the tests using it fail."""
    import importlib

    out: list[Any] = []
    try:
        mod: Any = importlib.import_module(module)
        error: ImportError | None = None
    except ImportError as exc:
        mod, error = None, exc
    for name in names:
        if mod is not None and hasattr(mod, name):
            out.append(getattr(mod, name))
            continue
        if mod is not None:
            try:  # a submodule not imported yet
                out.append(importlib.import_module(f"{module}.{name}"))
                continue
            except ImportError:
                pass
        err = error or ImportError(f"cannot import name {name!r} from {module!r}")
        stand_in = _Missing(name, (), {"__module__": module})
        stand_in._error = ImportError(str(err))
        out.append(stand_in)
    return tuple(out)
