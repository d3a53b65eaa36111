"""The runtime is composed of parts with declared interfaces, not mixed in from them: no
base classes, no stubs a part expects the runtime to fill, and no part reading another's
private fields. These scans fail when someone adds such a reach."""

from __future__ import annotations

import re
from pathlib import Path

import regency
from regency.core._children import ChildHost, ChildProcs
from regency.core._ports import PortOwner, PortTable
from regency.core._runtime import Runtime

ROOT = Path(regency.__file__).parent


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted(ROOT.rglob("*.py"))]


def test_the_runtime_inherits_from_no_part() -> None:
    assert Runtime.__bases__ == (object,)
    for part in (ChildProcs, PortTable):
        assert part.__bases__ == (object,), part


def test_no_part_has_stubs_for_the_runtime_to_fill() -> None:
    for path, text in _sources():
        assert not re.search(r"raise NotImplementedError\s*#\s*provided by", text), path
        assert "# Provided by Runtime" not in text, path


def test_no_module_reads_the_runtimes_private_fields() -> None:
    reach = re.compile(r"\b(rt|runtime|self\._rt|self\.rt|self\._host|host)\._[a-z]\w*")
    for path, text in _sources():
        if path.name == "_runtime.py":
            continue
        assert not reach.search(text), (path, reach.search(text))


def test_no_module_reads_an_outboxs_private_fields() -> None:
    reach = re.compile(r"(\bbox|\boutbox\([^)]*\))\._[a-z]\w*")
    for path, text in _sources():
        if path.name == "_outbox.py":
            continue
        assert not reach.search(text), (path, reach.search(text))


def test_supervision_is_read_through_oversight() -> None:
    for path, text in _sources():
        if path.name == "_oversight.py":
            continue
        assert "oversight.machine" not in text and "oversight._machine" not in text, path
        assert "machine._meshes" not in text, path


def test_the_parts_protocols_are_what_the_runtime_is() -> None:
    # The protocols are checked by mypy where the parts are made; this keeps them the
    # runtime's real attributes at run time too (a renamed field fails here).
    rt_attrs = set(dir(Runtime))
    for protocol in (ChildHost, PortOwner):
        methods = {
            n for n in vars(protocol) if not n.startswith("_") and callable(getattr(protocol, n))
        }
        assert methods <= rt_attrs, (protocol, methods - rt_attrs)


def test_a_port_handlers_parts_are_declared_not_probed() -> None:
    # What a handler can do is on PortHandler (defaults on PortBase), not found by getattr.
    for path, text in _sources():
        assert not re.search(r"getattr\(handler,", text), path
    for path, text in _sources():
        handler = r"^class (\w+)(\([^)]*\))?:\n(?:(?!^class ).*\n)*?\s+def deliver\(self, index"
        for match in re.finditer(handler, text, re.M):
            bases = match.group(2) or ""
            assert "PortBase" in bases or bases == "(Protocol)", (path, match.group(1))
