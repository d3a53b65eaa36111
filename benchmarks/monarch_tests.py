"""Monarch 0.7's own portable tests, run on Monarch and on Regency side by side.

``python benchmarks/monarch_tests.py`` (or ``python -m benchmarks.monarch_tests``) takes test
files of Monarch's repository (``python/tests/``, at ``--commit`` of the bare git directory
``--monarch-repo``), keeps their portable tests, writes one copy for Monarch and one for
Regency into a fresh folder, runs pytest on each copy, one file and one runtime at a time,
and prints a markdown table: per test, the outcome on each side and Regency's error line (with
the deepest frame of the failure inside ``regency/``), then per file and in all "N of M that
pass on Monarch pass on Regency".

Which commit: Monarch's repository has no 0.7.0 tag. Of every commit since the one that made
0.7 the nightly version (``fafb81c07``), ``3fc0a66e`` (newest main of the mirror) has the most
``python/monarch`` files identical to the installed ``torchmonarch==0.7.0`` (150 of its 218;
the wheel also has 11 files no commit has), and the count only grows toward it; its tests are
the closest to 0.7's that exist. A test that needs what 0.7 does not have fails on Monarch and
so does not count.

Portable, per test (a ``test_*`` function, or a method of a ``Test*`` class):

* Imports from Monarch's private modules (``monarch._src...``, ``monarch._rust_bindings...``,
  ``monarch._testing``) are rewritten to the public module when Monarch 0.7 exports the very
  same object there (``from monarch._src.actor.host_mesh import this_host`` becomes ``from
  monarch.actor import this_host``; asked of Monarch's interpreter). A name with no public
  alias is private.
* A test is not portable when it, or a module-level helper it uses (transitively, through
  the helper modules of ``python/tests`` too), uses a private name, imports a private module,
  names one (``"monarch._src..."`` in ``patch(...)``), mentions CUDA, RDMA, FUSE
  (``remotemount``, ``gather_mount``) or Kubernetes, or is marked ``oss_skip`` (Monarch's own
  open-source CI skips those). Such tests, and helpers only they use, are blanked out of both
  copies (line numbers stay those of Monarch's file); the table lists them with the reason.
  Attributes with a leading underscore on Monarch's objects (``mesh._proc_mesh``) do not make
  a test unportable: such tests run and are marked ``private attr`` in the table.

``--lenient`` also runs the tests whose only private names are ones Regency exports publicly
(``SupervisionError``, which Monarch 0.7 has only in ``monarch._rust_bindings``): Monarch's
copy keeps the private import, Regency's imports the name from ``regency.actor``; the table
marks them ``private name``, and the totals also give the count without them.

Both copies are the same filtered source; Regency's has ``monarch`` changed to ``regency`` in
imports, in the names those imports bind (``monarch.actor.Actor``) and in import lines and
module paths inside strings (scripts a test writes). In Regency's copy a top-level ``from
regency... import`` binds, for a name Regency lacks, a stand-in that raises the ImportError
where it is used, so that one missing name fails the tests that use it, not the whole file.
The helper modules a test file imports
from ``python/tests`` (``isolate_in_subprocess``, ``scoped_state``, ...) are copied the same
way; ``benchmarks/_monarch_tests_child.py`` is each copy's ``conftest.py`` (see there).

Each test has a limit: its ``@pytest.mark.timeout`` but at most ``--timeout`` (default 120 s).
The harness watches pytest's progress; a test past its limit, or one that ends the pytest
process, is recorded (``timeout``, ``crashed``), the process group is killed, and pytest starts
again with the tests that are left.

Regency runs under this interpreter (with the repository on its path), Monarch under
``--monarch-python`` (default ``/work/compat/mvenv/bin/python``, a venv with
``torchmonarch==0.7.0``; it needs ``pytest``: ``pip install pytest``). Options: ``--files``
(names in ``python/tests``), ``--only a,b`` (keep node ids containing any of the substrings),
``--json PATH`` (every result, the exclusions and the totals), ``--side monarch|regency``
(run one side only), ``--list`` (print the portability decisions and run nothing),
``--keep DIR`` (write the copies and logs there instead of a temporary folder), ``--lenient``,
``--timeout``, ``--commit``, ``--monarch-repo``. A term of ``--only`` that names a file
(``test_config.py``, ``test_config.py::test_x``) also picks the files to run.

Run: ``.venv/bin/python benchmarks/monarch_tests.py --lenient --json /tmp/monarch_tests.json``
(all default files, both sides, one after the other: about 25 minutes on 2 cores), or
``... --files test_actor_error.py --only test_slice_supervision --side regency``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable

import attrs

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_monarch_tests_child.py")
DEFAULT_MONARCH = "/work/compat/mvenv/bin/python"
DEFAULT_MIRROR = "/work/.mirror/meta-pytorch+monarch/repo"
#: the commit chosen (see the module's docstring)
DEFAULT_COMMIT = "3fc0a66e3140a56826973d8e7de9865785b7a40c"
DEFAULT_FILES = (
    "test_python_actors.py",
    "test_host_mesh.py",
    "test_actor_error.py",
    "test_proc_mesh.py",
    "test_future.py",
    "test_actor_shape.py",
    "test_config.py",
    "test_concurrent_endpoints.py",
    "test_supervision_hierarchy.py",
    "test_future_characterization.py",
)
TESTS_DIR = "python/tests"

_PRIVATE_MODULE = re.compile(r"^monarch\.(_[A-Za-z0-9_]+)")
_PRIVATE_TEXT = re.compile(r"monarch\._(src|rust_bindings|testing)\b|\b_rust_bindings\b")
_HARDWARE = (
    (re.compile(r"\bcuda\b|\bCUDA\b|\bnccl\b|\bNCCL\b"), "needs CUDA"),
    (re.compile(r"rdma|RDMA|ibverbs"), "needs RDMA"),
    (re.compile(r"\bfuse\b|\bFUSE\b|remotemount|gather_mount"), "needs FUSE"),
    (re.compile(r"kubernetes|Kubernetes|\bk8s\b"), "needs Kubernetes"),
)
_STDLIB_PRIVATE_OK = {"os", "sys", "self", "cls", "threading", "asyncio", "pytest"}
# In strings, module paths and import lines: `from monarch`, `import monarch`, `monarch.actor`.
_STRING_RENAME = re.compile(r"\b(from|import)(\s+)monarch\b|\bmonarch(?=\.[A-Za-z_])")


#: an alias that only --lenient allows: Regency's public module for a name Monarch keeps private
_LENIENT = "lenient:"
REGENCY_PUBLIC_MODULES = ("regency.actor", "regency.config", "regency.job")


def _is_private_module(module: str) -> bool:
    return bool(_PRIVATE_MODULE.match(module))


# ---- reading a test file ----------------------------------------------------------------


@attrs.frozen
class Exclusion:
    test: str  # file::Class::name or file::name
    reason: str


@attrs.frozen
class Extracted:
    """One test file, filtered: both copies' text and what was left out."""

    name: str
    monarch_text: str
    regency_text: str
    tests: list[str]  # the portable tests (without parameters)
    excluded: list[Exclusion]
    private_attrs: dict[str, list[str]]  # test -> `._name` attributes it touches
    helpers: list[str]  # modules of python/tests it imports


@attrs.define
class _Edit:
    start: tuple[int, int]  # (line, col), 1-based line
    end: tuple[int, int]
    text: str


def _span_start(node: ast.stmt) -> int:
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import):
        return {(a.asname or a.name.split(".")[0]) for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {(a.asname or a.name) for a in node.names}
    return {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def _used_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _private_imports(node: ast.AST) -> list[tuple[str, str]]:
    """(module, name) of every `from <private> import name` in the subtree."""
    out: list[tuple[str, str]] = []
    for n in ast.walk(node):
        if isinstance(n, ast.ImportFrom) and n.module and _is_private_module(n.module):
            out.extend((n.module, a.name) for a in n.names)
    return out


def _private_attrs(node: ast.AST) -> list[str]:
    """`x._name` attributes touched, leaving out self/cls and the standard library's."""
    found = set()
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Attribute)
            and n.attr.startswith("_")
            and not (n.attr.startswith("__") and n.attr.endswith("__"))
        ):
            base = n.value
            root = base
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in _STDLIB_PRIVATE_OK and base is root:
                continue
            if isinstance(root, ast.Name) and root.id in {"self", "cls"}:
                continue
            found.add(n.attr)
    return sorted(found)


class _Analysis:
    """Taint of one module: which top-level names are not portable, and why."""

    def __init__(
        self,
        source: str,
        aliases: dict[str, str | None],
        helper_taint: dict[str, dict[str, str]],
    ) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.tree = ast.parse(source)
        self.aliases = aliases
        self.helper_taint = helper_taint
        self.tainted: dict[str, str] = {}  # module-level name -> reason
        self.annotation_only = _annotation_only_names(self.tree)

    def segment(self, node: ast.stmt) -> str:
        start = _span_start(node)
        return "".join(self.lines[start - 1 : node.end_lineno or node.lineno])

    def own_reason(self, node: ast.AST, text: str) -> str | None:
        """Why this node alone is not portable (not counting the names it uses)."""
        for n in ast.walk(node):
            if isinstance(n, ast.Import):
                for a in n.names:
                    if _is_private_module(a.name):
                        return f"imports {a.name}"
            if isinstance(n, ast.ImportFrom) and n.module and _is_private_module(n.module):
                missing = [a.name for a in n.names if not self.aliases.get(f"{n.module}:{a.name}")]
                if missing:
                    return f"uses {n.module}.{missing[0]} (no public alias)"
            if isinstance(n, ast.Attribute) and n.attr.startswith("_"):
                root = n.value
                if isinstance(root, ast.Name) and root.id == "monarch":
                    return f"uses monarch.{n.attr}"
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                found = _PRIVATE_TEXT.search(n.value)
                if found:
                    return f"names a private module ({found[0]!r})"
            decorators = getattr(n, "decorator_list", [])
            for d in decorators:
                if "oss_skip" in ast.unparse(d):
                    return "oss_skip (Monarch's open-source CI skips it)"
        # Hardware: the code only (comments and docstrings may mention it in passing).
        code = ast.unparse(node) if isinstance(node, ast.stmt) else text
        for pattern, reason in _HARDWARE:
            if pattern.search(code):
                return reason
        return None

    def import_taint(self, node: ast.Import | ast.ImportFrom) -> dict[str, str]:
        """The names a top-level import binds that are private (no public alias)."""
        out = {}
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_private_module(a.name):
                    out[a.asname or a.name.split(".")[0]] = f"imports {a.name}"
        elif node.module and _is_private_module(node.module):
            for a in node.names:
                bound = a.asname or a.name
                if bound in self.annotation_only:
                    continue  # bound to typing.Any in the copies
                if not self.aliases.get(f"{node.module}:{a.name}"):
                    out[bound] = f"uses {node.module}.{a.name} (no public alias)"
        return out

    def name_reason(self, names: Iterable[str]) -> str | None:
        for name in sorted(names):
            if name in self.tainted:
                why = self.tainted[name]
                return why if why.startswith("uses ") and " via " in why else f"{why} (via {name})"
        return None

    def run(self) -> None:
        # Names imported from helper modules of python/tests that are not portable there.
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom) and node.module in self.helper_taint:
                for a in node.names:
                    why = self.helper_taint[node.module].get(a.name)
                    if why:
                        self.tainted[a.asname or a.name] = why
        changed = True
        while changed:
            changed = False
            for node in self.tree.body:
                if _is_test(node):
                    continue
                if isinstance(node, ast.ImportFrom | ast.Import):
                    for name, why in self.import_taint(node).items():
                        if name not in self.tainted:
                            self.tainted[name] = why
                            changed = True
                    continue
                bound = _bound_names(node) - set(self.tainted)
                if not bound:
                    continue
                why = self.own_reason(node, self.segment(node)) or self.name_reason(
                    _used_names(node)
                )
                if why:
                    for name in bound:
                        self.tainted[name] = why
                    changed = True


def _annotation_only_names(tree: ast.Module) -> set[str]:
    """Names whose every use is in an annotation (a private class named only as a type)."""
    in_annotations: set[int] = set()
    for n in ast.walk(tree):
        notes: list[ast.expr | None] = []
        if isinstance(n, ast.arg):
            notes = [n.annotation]
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            notes = [n.returns]
        elif isinstance(n, ast.AnnAssign):
            notes = [n.annotation]
        for note in notes:
            if note is not None:
                in_annotations.update(id(x) for x in ast.walk(note))
    uses: dict[str, bool] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            uses[n.id] = uses.get(n.id, True) and id(n) in in_annotations
    return {name for name, only in uses.items() if only}


def _is_test(node: ast.stmt) -> bool:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name.startswith("test")
    if isinstance(node, ast.ClassDef):  # a Test* class without test methods is a helper
        return node.name.startswith("Test") and any(
            isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name.startswith("test")
            for m in node.body
        )
    return False


def _rewrite_import(
    node: ast.Import | ast.ImportFrom, aliases: dict[str, str | None], rename: bool,
    annotation_only: set[str], guard: bool = False,
) -> str | None:
    """The import's new text, or None when it stays as it is."""
    def ren(module: str) -> str:
        if rename and (module == "monarch" or module.startswith("monarch.")):
            return "regency" + module[len("monarch"):]
        return module

    if isinstance(node, ast.Import):
        if not any(a.name == "monarch" or a.name.startswith("monarch.") for a in node.names):
            return None
        private = any(_is_private_module(a.name) for a in node.names)
        if not rename and not private:
            return None
        names = [
            ast.alias(name=ren(a.name), asname=a.asname)
            for a in node.names
            if not _is_private_module(a.name)
        ]
        return ast.unparse(ast.Import(names=names)) if names else "pass"

    module = node.module or ""
    if not (module == "monarch" or module.startswith("monarch.")) or node.level:
        return None
    if _is_private_module(module):
        groups: dict[str, list[ast.alias]] = {}
        anys = []
        for a in node.names:  # names without a public alias are left out
            public = aliases.get(f"{module}:{a.name}")
            if public is not None and public.startswith(_LENIENT):
                public = public[len(_LENIENT):] if rename else module
            if public is not None:
                groups.setdefault(public, []).append(a)
            elif (a.asname or a.name) in annotation_only:
                anys.append(ast.alias(name="Any", asname=a.asname or a.name))
        parts = [
            _guarded(ren(m), names) if guard and rename
            else ast.unparse(ast.ImportFrom(module=ren(m), names=names, level=0))
            for m, names in groups.items()
        ]
        if anys:
            parts.append(ast.unparse(ast.ImportFrom(module="typing", names=anys, level=0)))
        if not parts:
            return "pass"

        return "; ".join(parts)
    if not rename:
        return None
    if guard:
        return _guarded(ren(module), node.names)
    return ast.unparse(ast.ImportFrom(module=ren(module), names=node.names, level=0))


def _guarded(module: str, names: list[ast.alias]) -> str:
    """A top-level import in Regency's copy, on one line: a name Regency lacks becomes a
    stand-in that raises the ImportError where it is used (_monarch_tests_child.py)."""
    if any(a.name == "*" for a in names):
        return ast.unparse(ast.ImportFrom(module=module, names=names, level=0))
    targets = ", ".join(a.asname or a.name for a in names)
    args = ", ".join(repr(a.name) for a in names)
    return f"from conftest import import_names as _imp_; {targets}, = _imp_({module!r}, {args})"


def _edits(
    tree: ast.Module, drop: list[tuple[int, int]], aliases: dict[str, str | None], rename: bool,
    lines: list[str], guard: bool = False,
) -> list[_Edit]:
    """Blank the dropped line ranges; rewrite imports; rename `monarch` where it is code."""
    annotation_only = _annotation_only_names(tree)
    top = {id(n) for n in tree.body} if guard else set()
    dropped: set[int] = set()
    for a, b in drop:
        dropped.update(range(a, b + 1))
    edits = []
    for a, b in drop:
        edits.append(_Edit((a, 0), (b, len(lines[b - 1].rstrip("\r\n"))), "\n" * (b - a)))
    for n in ast.walk(tree):
        line = getattr(n, "lineno", None)
        if line is None or line in dropped:
            continue
        if isinstance(n, ast.Import | ast.ImportFrom):
            text = _rewrite_import(n, aliases, rename, annotation_only, id(n) in top)
            if text is not None:
                end = n.end_lineno or n.lineno
                edits.append(_Edit((n.lineno, n.col_offset), (end, n.end_col_offset or 0),
                                   text + "\n" * (end - n.lineno)))
        elif rename and isinstance(n, ast.Name) and n.id == "monarch":
            edits.append(_Edit((n.lineno, n.col_offset), (n.lineno, n.col_offset + 7), "regency"))
        elif rename and isinstance(n, ast.Constant) and isinstance(n.value, str):
            end = n.end_lineno or n.lineno
            seg = _slice(lines, (n.lineno, n.col_offset), (end, n.end_col_offset or 0))
            new = _STRING_RENAME.sub(
                lambda m: f"{m[1]}{m[2]}regency" if m[1] else "regency", seg
            )
            if new != seg:
                edits.append(_Edit((n.lineno, n.col_offset), (end, n.end_col_offset or 0), new))
    return edits


def _slice(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    # ast's columns are UTF-8 byte offsets.
    if start[0] == end[0]:
        b = lines[start[0] - 1].encode()
        return b[start[1] : end[1]].decode()
    first = lines[start[0] - 1].encode()[start[1] :].decode()
    middle = "".join(lines[start[0] : end[0] - 1])
    last = lines[end[0] - 1].encode()[: end[1]].decode()
    return first + middle + last


def _apply(lines: list[str], edits: list[_Edit]) -> str:
    out = [line.encode() for line in lines]
    # Later edits first; an edit inside a dropped range or another edit is skipped.
    edits = sorted(edits, key=lambda e: (e.start, e.end), reverse=True)
    taken: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for e in edits:
        if any(s <= e.start and e.end <= t for s, t in taken):
            continue
        taken.append((e.start, e.end))
        (l0, c0), (l1, c1) = e.start, e.end
        head = out[l0 - 1][:c0]
        tail = out[l1 - 1][c1:]
        new = (head.decode() + e.text + tail.decode()).encode()
        out[l0 - 1 : l1] = new.splitlines(keepends=True) or [b""]
    return b"".join(out).decode()


def extract(
    name: str, source: str, aliases: dict[str, str | None], helper_taint: dict[str, dict[str, str]],
    is_helper: bool = False,
) -> tuple[Extracted, dict[str, str]]:
    """Filter one file; returns it and its module-level names that are not portable."""
    an = _Analysis(source, aliases, helper_taint)
    an.run()
    lines = an.lines
    drop: list[tuple[int, int]] = []
    tests: list[str] = []
    excluded: list[Exclusion] = []
    attrs_used: dict[str, list[str]] = {}

    # Names that stand for a private Monarch name only --lenient lets through, and the
    # module-level names that use them: a test using one is marked in the table.
    lenient: dict[str, set[str]] = {}
    for node in an.tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and _is_private_module(node.module):
            for a in node.names:
                if (aliases.get(f"{node.module}:{a.name}") or "").startswith(_LENIENT):
                    lenient[a.asname or a.name] = {a.name}
    grown = True
    while grown:
        grown = False
        for node in an.tree.body:
            if _is_test(node) or isinstance(node, ast.Import | ast.ImportFrom):
                continue
            via = set().union(*(lenient[n] for n in _used_names(node) if n in lenient))
            for bound in _bound_names(node):
                if via - lenient.get(bound, set()):
                    lenient[bound] = lenient.get(bound, set()) | via
                    grown = True

    def note(test_id: str, node: ast.AST) -> None:
        found = _private_attrs(node)
        names = set().union(*(lenient[n] for n in _used_names(node) if n in lenient))
        found += [f"{n} (private name)" for n in sorted(names)]
        if found:
            attrs_used[test_id] = found

    def test_reason(node: ast.stmt) -> str | None:
        return an.own_reason(node, an.segment(node)) or an.name_reason(_used_names(node))

    for node in an.tree.body:
        span = (_span_start(node), node.end_lineno or node.lineno)
        if not _is_test(node):
            if set(_bound_names(node)) & set(an.tainted) and not isinstance(
                node, ast.Import | ast.ImportFrom
            ):
                drop.append(span)
            continue
        if isinstance(node, ast.ClassDef):
            members = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
            test_methods = [m for m in members if m.name.startswith("test")]
            rest = [m for m in node.body if m not in test_methods]
            class_shell = ast.Module(body=[*rest], type_ignores=[])
            why = (
                an.own_reason(class_shell, "")
                or an.name_reason(_used_names(class_shell) | {
                    n for d in [*node.decorator_list, *node.bases] for n in _used_names(d)
                })
                or next((r for d in node.decorator_list
                         if (r := an.own_reason(ast.Expr(d), "")) is not None), None)
            )
            kept = []
            for m in test_methods:
                test_id = f"{name}::{node.name}::{m.name}"
                reason = why or test_reason(m)
                if reason:
                    excluded.append(Exclusion(test_id, reason))
                    drop.append((_span_start(m), m.end_lineno or m.lineno))
                else:
                    kept.append(m)
                    tests.append(test_id)
                    note(test_id, m)
            if not kept:
                drop = [d for d in drop if not (span[0] <= d[0] and d[1] <= span[1])]
                drop.append(span)
            continue
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        test_id = f"{name}::{node.name}"
        reason = test_reason(node)
        if reason:
            excluded.append(Exclusion(test_id, reason))
            drop.append(span)
        else:
            tests.append(test_id)
            note(test_id, node)
    helpers = sorted(
        n.module for n in an.tree.body
        if isinstance(n, ast.ImportFrom) and n.module in helper_taint
    )
    monarch_text = _apply(lines, _edits(an.tree, drop, aliases, False, lines))
    regency_text = _apply(lines, _edits(an.tree, drop, aliases, True, lines, guard=True))
    for text in (monarch_text, regency_text):
        ast.parse(text)  # the copies must still be Python
    del is_helper
    return (
        Extracted(name, monarch_text, regency_text, tests, excluded, attrs_used, helpers),
        dict(an.tainted),
    )


# ---- the repository ---------------------------------------------------------------------


def _git(mirror: str, *args: str) -> str:
    done = subprocess.run(["git", "-C", mirror, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} in {mirror} failed: {done.stderr.strip()}")
    return done.stdout


def _read(mirror: str, commit: str, path: str) -> str:
    return _git(mirror, "show", f"{commit}:{path}")


def _helper_modules(mirror: str, commit: str) -> set[str]:
    names = _git(mirror, "ls-tree", "--name-only", f"{commit}:{TESTS_DIR}").split()
    return {n[:-3] for n in names if n.endswith(".py") and not n.startswith("test_")} - {
        "conftest"
    }


def _query_aliases(monarch_python: str, pairs: set[tuple[str, str]]) -> dict[str, str | None]:
    if not pairs:
        return {}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [monarch_python, _CHILD, "--aliases"],
        input=json.dumps(sorted(pairs)), capture_output=True, text=True, env=env, timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(
            f"asking {monarch_python} for Monarch's public names failed "
            f"(exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    result: dict[str, str | None] = json.loads(lines[-1])
    return result


def _query_regency_names(names: list[str]) -> dict[str, str]:
    """Which of these names Regency's public modules export (asked of a fresh interpreter:
    importing Regency here would start its runtime's helpers in the harness)."""
    code = (
        "import importlib, json, os, sys\n"
        "names = json.load(sys.stdin); out = {}\n"
        f"for mod in {list(REGENCY_PUBLIC_MODULES)!r}:\n"
        "    m = importlib.import_module(mod)\n"
        "    for n in names:\n"
        "        if n not in out and hasattr(m, n): out[n] = mod\n"
        "print(json.dumps(out), flush=True); os._exit(0)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = _REPO
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(names),
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"asking Regency for its public names failed:\n{done.stderr[-2000:]}")
    result: dict[str, str] = json.loads(lines[-1])
    return result


def prepare(
    mirror: str, commit: str, files: list[str], monarch_python: str, lenient: bool = False
) -> tuple[list[Extracted], dict[str, Extracted]]:
    """Every chosen file and the helper modules they import, filtered."""
    helper_names = _helper_modules(mirror, commit)
    sources = {f: _read(mirror, commit, f"{TESTS_DIR}/{f}") for f in files}
    helpers: dict[str, str] = {}
    todo = list(sources.values())
    while todo:  # helpers that the files (and helpers) import
        tree = ast.parse(todo.pop())
        for n in ast.walk(tree):
            mods = []
            if isinstance(n, ast.ImportFrom) and n.module and not n.level:
                mods = [n.module]
            elif isinstance(n, ast.Import):
                mods = [a.name for a in n.names]
            for m in mods:
                if m in helper_names and m not in helpers:
                    helpers[m] = _read(mirror, commit, f"{TESTS_DIR}/{m}.py")
                    todo.append(helpers[m])
    pairs: set[tuple[str, str]] = set()
    for text in [*sources.values(), *helpers.values()]:
        pairs.update(_private_imports(ast.parse(text)))
    aliases = _query_aliases(monarch_python, pairs)
    if lenient:
        missing = sorted({name for (m, name) in pairs if aliases.get(f"{m}:{name}") is None})
        regency = _query_regency_names(missing)
        for m, name in pairs:
            if aliases.get(f"{m}:{name}") is None and regency.get(name):
                aliases[f"{m}:{name}"] = _LENIENT + regency[name]
    helper_taint: dict[str, dict[str, str]] = {m: {} for m in helpers}
    extracted_helpers: dict[str, Extracted] = {}
    for _ in range(2):  # helpers importing helpers: twice is enough for python/tests
        for m, text in helpers.items():
            ex, tainted = extract(f"{m}.py", text, aliases, helper_taint, is_helper=True)
            helper_taint[m] = {k: f"{v} (in {m}.py)" for k, v in tainted.items()}
            extracted_helpers[m] = ex
    out = [extract(f, text, aliases, helper_taint)[0] for f, text in sources.items()]
    return out, extracted_helpers


# ---- running ----------------------------------------------------------------------------


@attrs.define
class Outcome:
    outcome: str  # passed, failed, error, skipped, timeout, crashed, missing
    error: str = ""
    where: str = ""
    seconds: float = 0.0


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _kill_strays(results_path: str) -> None:
    """Kill what this run started that left pytest's process group (Monarch's hosts start
    procs in sessions of their own): processes whose environment names this run's results."""
    mark = f"MONARCH_TESTS_RESULTS={results_path}".encode()
    for _ in range(3):
        found = False
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if mark in env:
                found = True
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.5)


def _read_records(path: str, offset: int) -> tuple[list[dict[str, object]], int]:
    try:
        with open(path, encoding="utf-8") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind("\n") + 1]
    records = [json.loads(line) for line in complete.splitlines() if line.strip()]
    return records, offset + len(complete.encode())


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()[-20000:]
    except FileNotFoundError:
        return ""
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^(E |\w*(Error|Exception|Fault)\b)", line)]
    return (errors or lines or [""])[-1][:400]


def run_file(
    side: str, python: str, folder: str, test_file: str, match: list[str], timeout: float,
    log: str,
) -> tuple[dict[str, Outcome], list[str]]:
    """Run one copy's file with pytest until every test has an outcome."""
    results_path = os.path.join(folder, f".{test_file}.results.jsonl")
    only_path = os.path.join(folder, f".{test_file}.only")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    path = [folder] + ([_REPO] if side == "regency" else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(
        MONARCH_TESTS_RESULTS=results_path,
        MONARCH_TESTS_PACKAGE=side,
        MONARCH_TESTS_TIMEOUT=str(timeout),
        MONARCH_TESTS_MATCH=",".join(match),
        PYTHONUNBUFFERED="1",
    )
    results: dict[str, Outcome] = {}
    collect_errors: list[str] = []
    remaining: list[str] | None = None  # None: as collected
    offset = 0
    runs = 0
    while True:
        runs += 1
        before = len(results)
        if remaining is not None:
            with open(only_path, "w", encoding="utf-8") as f:
                f.write("\n".join(remaining))
            env["MONARCH_TESTS_ONLY"] = only_path
        argv = [
            python, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider",
            "-c", os.path.join(folder, "pytest.ini"), "--rootdir", folder, "-rN",
        ]
        with open(log, "ab") as out:
            out.write(f"\n==== run {runs}: {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                argv, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            current: tuple[str, float, float] | None = None
            collected: list[str] | None = None
            ended = False
            while not ended:
                ended = proc.poll() is not None
                records, offset = _read_records(results_path, offset)
                for r in records:
                    ev = r["event"]
                    if ev == "collected":
                        collected = [str(i) for i in r["ids"]]  # type: ignore[attr-defined]
                        if remaining is None:
                            remaining = list(collected)
                    elif ev == "collect_error":
                        collect_errors.append(str(r["error"]))
                    elif ev == "start":
                        current = (str(r["id"]), float(r["t"]), float(r["timeout"]))  # type: ignore[arg-type]
                    elif ev == "end" and current is not None:
                        results[str(r["id"])] = Outcome(
                            str(r["outcome"]), str(r["error"]), str(r["where"]),
                            float(r["t"]) - current[1],  # type: ignore[arg-type]
                        )
                        current = None
                if not ended and current is not None and time.time() - current[1] > current[2]:
                    _kill_group(proc)
                    results[current[0]] = Outcome(
                        "timeout", f"no result after {current[2]:.0f} s", "", current[2]
                    )
                    current = None
                    ended = True
                if not ended:
                    time.sleep(0.2)
            _kill_group(proc)  # procs a test left behind
            _kill_strays(results_path)
            if current is not None:
                results[current[0]] = Outcome(
                    "crashed", f"pytest exited with {proc.returncode} during the test: "
                    f"{_last_line(log)}", "", time.time() - current[1],
                )
        if remaining is None:  # never collected: the file does not import
            return results, collect_errors or [_last_line(log)]
        remaining = [i for i in remaining if i not in results]
        if not remaining:
            return results, collect_errors
        if len(results) == before:  # this run ran nothing: it will not do better next time
            for i in remaining:
                results[i] = Outcome("missing", f"pytest exited: {_last_line(log)}")
            return results, collect_errors


def _write_copies(folder: str, side: str, files: list[Extracted], helpers: dict[str, Extracted]) -> None:
    os.makedirs(folder, exist_ok=True)
    for ex in [*files, *helpers.values()]:
        text = ex.monarch_text if side == "monarch" else ex.regency_text
        with open(os.path.join(folder, ex.name), "w", encoding="utf-8") as f:
            f.write(text)
    shutil.copyfile(_CHILD, os.path.join(folder, "conftest.py"))
    with open(os.path.join(folder, "pytest.ini"), "w", encoding="utf-8") as f:
        f.write("[pytest]\naddopts =\npython_files = test_*.py\n")


# ---- reporting --------------------------------------------------------------------------


def _base(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def _mark(o: Outcome | None) -> str:
    if o is None:
        return "-"
    return {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip",
            "timeout": "TIMEOUT", "crashed": "CRASH", "missing": "MISSING"}[o.outcome]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(
    files: list[Extracted], results: dict[str, dict[str, dict[str, Outcome]]],
    collect: dict[str, dict[str, list[str]]], sides: list[str],
) -> dict[str, object]:
    rows: list[dict[str, object]] = []
    summary: dict[str, dict[str, int]] = {}
    print("| test | Monarch | Regency | Regency's error | where in Regency |")
    print("|---|---|---|---|---|")
    for ex in files:
        per = results.get(ex.name, {})
        ids: list[str] = []
        for side in sides:
            for i in per.get(side, {}):
                if i not in ids:
                    ids.append(i)
        m_pass = r_pass = both = strict_m = strict_both = 0
        for test_id in ids:
            m = per.get("monarch", {}).get(test_id)
            r = per.get("regency", {}).get(test_id)
            if r is None and "regency" in sides:
                errs = collect.get(ex.name, {}).get("regency", [])
                r = Outcome("missing", "not collected: " + (errs[-1] if errs else "?"))
            m_pass += m is not None and m.outcome == "passed"
            r_pass += r is not None and r.outcome == "passed"
            both += (m is not None and m.outcome == "passed") and (
                r is not None and r.outcome == "passed")
            note = ""
            attrs_used = ex.private_attrs.get(_base(test_id))
            if not any(a.endswith("(private name)") for a in attrs_used or []):
                strict_m += m is not None and m.outcome == "passed"
                strict_both += (m is not None and m.outcome == "passed") and (
                    r is not None and r.outcome == "passed")
            if attrs_used:
                note = " (private: " + ", ".join(attrs_used) + ")"
            error = r.error if r is not None and r.outcome != "passed" else ""
            print(f"| `{test_id}`{note} | {_mark(m)} | {_mark(r)} | {_cell(error)[:300]} | "
                  f"{r.where if r is not None and r.outcome != 'passed' else ''} |")
            rows.append({
                "id": test_id, "file": ex.name, "private_attrs": attrs_used or [],
                **{s: attrs.asdict(o) for s, o in (("monarch", m), ("regency", r)) if o},
            })
        summary[ex.name] = {"tests": len(ids), "monarch_pass": m_pass, "regency_pass": r_pass,
                            "both_pass": both, "excluded": len(ex.excluded),
                            "strict_monarch_pass": strict_m, "strict_both_pass": strict_both}
    print()
    print("| file | portable tests run | pass on Monarch | of those, pass on Regency | "
          "pass on Regency | not portable |")
    print("|---|---|---|---|---|---|")
    tot = dict.fromkeys(
        ("tests", "monarch_pass", "regency_pass", "both_pass", "excluded",
         "strict_monarch_pass", "strict_both_pass"), 0)
    for name, s in summary.items():
        print(f"| {name} | {s['tests']} | {s['monarch_pass']} | {s['both_pass']} | "
              f"{s['regency_pass']} | {s['excluded']} |")
        for k in tot:
            tot[k] += s[k]
    print(f"| all | {tot['tests']} | {tot['monarch_pass']} | {tot['both_pass']} | "
          f"{tot['regency_pass']} | {tot['excluded']} |")
    print(f"\n{tot['both_pass']} of {tot['monarch_pass']} that pass on Monarch pass on Regency")
    if tot["strict_monarch_pass"] != tot["monarch_pass"]:
        print(f"({tot['strict_both_pass']} of {tot['strict_monarch_pass']} among the tests that "
              "use no private name of Monarch's: --lenient let the others run)")
    reasons: dict[str, int] = {}
    for ex in files:
        for e in ex.excluded:
            key = re.sub(r" \(via .*", "", e.reason)
            reasons[key] = reasons.get(key, 0) + 1
    print("\nNot portable, by reason:")
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}  {why}")
    return {
        "tests": rows,
        "excluded": [attrs.asdict(e) for ex in files for e in ex.excluded],
        "files": summary,
        "total": tot,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--monarch-python", default=os.environ.get("MONARCH_PYTHON", DEFAULT_MONARCH))
    parser.add_argument("--monarch-repo", default=DEFAULT_MIRROR, help="bare git dir of Monarch")
    parser.add_argument("--commit", default=DEFAULT_COMMIT)
    parser.add_argument("--files", default=",".join(DEFAULT_FILES),
                        help="comma-separated names in python/tests")
    parser.add_argument("--only", default="", help="comma-separated substrings of node ids")
    parser.add_argument("--side", choices=("both", "monarch", "regency"), default="both")
    parser.add_argument("--timeout", type=float, default=120.0, help="most seconds per test")
    parser.add_argument("--json", default="", help="write every result here")
    parser.add_argument("--keep", default="", help="folder for the copies and logs")
    parser.add_argument("--list", action="store_true", help="print what is portable; run nothing")
    parser.add_argument(
        "--lenient", action="store_true",
        help="also run tests whose private names Regency exports publicly (SupervisionError)",
    )
    args = parser.parse_args(argv)

    if args.timeout <= 0:
        raise SystemExit(f"--timeout must be a positive number of seconds, not {args.timeout}")
    if args.side != "regency" and not os.path.exists(args.monarch_python):
        raise SystemExit(f"no Monarch interpreter at {args.monarch_python}: pass --monarch-python")
    if not os.path.isdir(args.monarch_repo):
        raise SystemExit(f"no Monarch repository (bare git dir) at {args.monarch_repo}")
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    known = set(_git(args.monarch_repo, "ls-tree", "--name-only", f"{args.commit}:{TESTS_DIR}").split())
    unknown = [f for f in files if f not in known]
    if unknown:
        raise SystemExit(f"not in {TESTS_DIR} at {args.commit[:10]}: {', '.join(unknown)}")
    match = [m for m in args.only.split(",") if m]
    named = {m.split("::")[0] for m in match if m.split("::")[0].endswith(".py")}
    if named:  # a term naming a file (`test_x.py`, `test_x.py::test_y`) selects that file
        files = [f for f in files if f in named] or files
    extracted, helpers = prepare(
        args.monarch_repo, args.commit, files, args.monarch_python, args.lenient
    )

    if args.list:
        for ex in extracted:
            print(f"## {ex.name}: {len(ex.tests)} portable, {len(ex.excluded)} not")
            for t in ex.tests:
                note = ex.private_attrs.get(t)
                print(f"  run   {t}" + (f"  (private: {', '.join(note)})" if note else ""))
            for e in ex.excluded:
                print(f"  skip  {e.test}: {e.reason}")
        return 0

    root = args.keep or tempfile.mkdtemp(prefix="monarch-tests-")
    sides = ["monarch", "regency"] if args.side == "both" else [args.side]
    pythons = {"monarch": args.monarch_python, "regency": sys.executable}
    for side in sides:
        _write_copies(os.path.join(root, side), side, extracted, helpers)
    print(f"Monarch {args.commit[:10]}; copies and logs in {root}", file=sys.stderr)
    results: dict[str, dict[str, dict[str, Outcome]]] = {}
    collect: dict[str, dict[str, list[str]]] = {}
    for ex in extracted:
        if not ex.tests:
            continue
        for side in sides:
            t0 = time.time()
            got, errs = run_file(
                side, pythons[side], os.path.join(root, side), ex.name, match, args.timeout,
                os.path.join(root, f"{side}-{ex.name}.log"),
            )
            results.setdefault(ex.name, {})[side] = got
            collect.setdefault(ex.name, {})[side] = errs
            passed = sum(o.outcome == "passed" for o in got.values())
            print(f"{ex.name} on {side}: {passed} of {len(got)} passed "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)
    summary = report(extracted, results, collect, sides)
    if args.json:
        summary.update(commit=args.commit, folder=root, sides=sides)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
