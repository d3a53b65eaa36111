"""What a round trip's hot path must not grow: hooks that cost thousands of instructions a
message without doing anything (docs/performance.md counts a round trip's instructions).

An attrs record with a converter or a validator on any field gets a generated
``__setattr__`` that runs the converters and validators of every assignment, to every
field: four Python calls each time. One ``converter=deque`` on the delivery session's
``pending`` cost each frame sent two such assignments (``queued_count``,
``unacked_bytes``): about 8,800 instructions, on each side of a round trip."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterator
from types import FrameType, ModuleType
from typing import Any

import attrs
import pytest

import regency.core
import regency.transports
from regency.core import _context, _delivery
from regency.core._config import Config
from regency.core._delivery import CONNECTED
from regency.core._outbox import Outbox
from regency.core._runtime import Runtime

#: Mutable records whose assignments are hooked on purpose (none of them per message).
_HOOKED = {
    # Its identity fields are frozen after construction (on_setattr=frozen).
    _context.ActorInstance,
}


def _modules(package: ModuleType) -> Iterator[ModuleType]:
    yield package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        yield importlib.import_module(info.name)


def _hooked(cls: type) -> bool:
    """Whether assigning to an attribute of ``cls`` runs attrs' hooks (frozen records,
    which refuse every assignment, are not hooked: nothing assigns to them)."""
    setattr_: Any = cls.__setattr__
    if setattr_ is object.__setattr__:
        return False
    return getattr(setattr_, "__name__", "") != "_frozen_setattrs"


def test_no_mutable_record_of_the_core_or_the_transports_hooks_its_assignments() -> None:
    hooked = []
    for package in (regency.core, regency.transports):
        for module in _modules(package):
            for cls in vars(module).values():
                if (
                    inspect.isclass(cls)
                    and cls.__module__ == module.__name__
                    and attrs.has(cls)
                    and cls not in _HOOKED
                    and _hooked(cls)
                ):
                    hooked.append(f"{cls.__module__}.{cls.__qualname__}")
    assert not hooked, (
        f"{hooked}: these mutable attrs records run attrs' hooks on every assignment (a "
        "converter or validator on a field: four Python calls per assignment, to any "
        "field); drop it (convert where the value comes in) or set on_setattr on that field "
        "alone, or list the record in _HOOKED if no hot path assigns to it"
    )


def test_the_delivery_records_assign_as_plain_objects() -> None:
    for cls in (_delivery.Outbound, _delivery.Receiver, _delivery.SessionTable):
        assert cls.__setattr__ is object.__setattr__, (
            f"{cls.__qualname__} hooks its assignments: every frame sent or received pays it"
        )


class _Written:
    """The connection's end of the write: keeps what it is given."""

    closed = False

    def __init__(self) -> None:
        self.frames: list[tuple[bytes, bool]] = []

    def send_nowait(self, frame: bytes, answer: bool = False) -> None:
        self.frames.append((frame, answer))


@pytest.fixture
def connected_outbox() -> Iterator[tuple[Outbox, _Written]]:
    rt = Runtime("p1", secret=b"b" * 32, jobdir="/nowhere", config=Config(), address="inproc://p1")
    box = rt.outbox("unix:///tmp/regency-test-hot-path.sock")
    link = _Written()
    box._machine.state, box._machine.link = CONNECTED, link
    yield box, link


def _calls_during(fn: Any, *args: Any) -> list[str]:
    """``fn`` and the Python functions ``fn(*args)`` calls, in order, as
    ``module.qualname``."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            seen.append(f"{frame.f_globals.get('__name__')}.{code.co_qualname}")

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


def test_a_frame_on_a_connected_outbox_calls_nothing_but_the_connection(
    connected_outbox: tuple[Outbox, _Written],
) -> None:
    box, link = connected_outbox
    box.send(b"first")  # (the window's first frame: nothing in flight yet)
    calls = _calls_during(box.send, b"second")
    assert [c for c in calls if "_Written" not in c] == ["regency.core._outbox.Outbox.send"], (
        f"sending a frame on a connected outbox with its window open called {calls}: the "
        "fast path of Outbox.send is written out so that it calls only the connection's "
        "send_nowait"
    )
    assert [f for f, _ in link.frames] == [b"first", b"second"]
    machine = box._machine
    assert machine.queued_count == 2 and list(machine.unacked) == [b"first", b"second"]
    assert machine.unacked_bytes == len(b"first") + len(b"second")


def test_the_window_still_holds_frames_back_on_the_fast_path(
    connected_outbox: tuple[Outbox, _Written],
) -> None:
    """The fast path's folded checks decide as ``Outbound.queued`` does: by frames, by
    bytes past the first frame in flight (one frame bigger than the window goes alone)."""
    box, link = connected_outbox
    machine = box._machine
    machine.window, machine.window_bytes = 2, 10
    box.send(b"x" * 25)  # alone, bigger than the window's bytes: goes
    box.send(b"y")  # 26 bytes in flight past the first: waits
    assert [f for f, _ in link.frames] == [b"x" * 25] and list(machine.pending) == [b"y"]
    box.acknowledged(1)
    assert [f for f, _ in link.frames] == [b"x" * 25, b"y"] and not machine.pending
    box.send(b"z" * 9)  # 1 + 9 bytes, 2 frames: the window is full, not over
    box.send(b"w")  # a third frame: waits
    assert [f for f, _ in link.frames][2:] == [b"z" * 9] and list(machine.pending) == [b"w"]
    assert machine.unacked_bytes == 10 and machine.pending_bytes == 1
    box.acknowledged(3)
    assert [f for f, _ in link.frames][3:] == [b"w"] and machine.unacked_bytes == 1
