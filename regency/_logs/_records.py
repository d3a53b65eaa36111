"""What travels between procs and the controller's log sink (ordinary reply-port messages).

Both ends are ports with reserved ids, so no frame kind and no actor is involved: a batch is
a PORT frame on the proc's existing connection to the controller, in order with everything
else the proc sends there, and it is handled on arrival (``PortHandler.deliver``).
"""

from __future__ import annotations

import logging

import attrs

from ..core._output_tail import STREAM_NAMES as STREAM_NAMES

#: The controller's log sink (in the root runtime).
SINK_PORT = (1 << 63) | 1
#: Each proc's log control (mode changes, flushes).
CONTROL_PORT = (1 << 63) | 2

#: The streams' numbers, as the output tail's records (``core/_output_tail.py``) number
#: them; ``STREAM_NAMES`` (from there) names them.
STDOUT = 1
STDERR = 2

#: Longest forwarded line, in bytes; longer ones are cut and marked.
MAX_LINE_BYTES = 4096
TRUNCATED_MARK = " ... [TRUNCATED]"


def _check_level(_: object, __: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"Invalid logging level: {value!r} (expected an int from 0 to 255)")


def _check_window(_: object, __: object, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"aggregate_window_sec must be a positive number of seconds or None (got {value!r})"
        )


@attrs.frozen
class Mode:
    """How a proc's output is forwarded (``ProcMesh.logging_option``)."""

    stream: bool = True
    #: Seconds over which similar lines are grouped at the controller; None prints each line.
    window: float | None = attrs.field(default=3.0, validator=_check_window)
    #: Python logging level of the proc's root logger.
    level: int = attrs.field(default=logging.INFO, validator=_check_level)


@attrs.frozen
class Init:
    """The spawner's first word to a new proc: its rank in the proc mesh and the mode."""

    rank: int
    #: The controller's address (its sink); None when forwarding is off (the proc's output
    #: is teed for file capture or a tail only, and its logging level is left alone).
    sink: str | None
    mode: Mode
    #: The job's name, the directory of its capture files (``_capture.py``): set by the
    #: controller, passed down by procs that spawn procs.
    job: str = ""


@attrs.frozen
class SetMode:
    """Apply ``mode`` after every byte written before it arrived; then ack ``reply``."""

    mode: Mode
    reply: tuple[str, int]


@attrs.frozen
class Flush:
    """Send every byte written before this arrived to the sink, then ``Flushed(reply)``."""

    reply: tuple[str, int]


@attrs.frozen
class LineBatch:
    """Lines a proc wrote to one stream, in order."""

    proc_id: str
    hostname: str
    rank: int
    stream: int
    lines: tuple[str, ...]
    #: When the lines were read (wall clock; virtual time in the simulator).
    timestamp: float
    window: float | None


@attrs.frozen
class PrintWindows:
    """To the sink: print the open windows now, then ack ``reply`` (after a flush)."""

    reply: tuple[str, int]


@attrs.frozen
class Streaming:
    """A proc's mode, told to the sink at each change: it prints what a dead proc left
    unread in its pipes (see :mod:`._leftovers`) only for procs that stream."""

    proc_id: str
    hostname: str
    rank: int
    on: bool
    window: float | None


@attrs.frozen
class Flushed:
    """Sent by a proc after its last flushed batch: the sink acks ``reply`` with ``origin``,
    so the flusher knows every earlier line of that proc reached the controller."""

    reply: tuple[str, int]
    #: The address of the proc that flushed.
    origin: str
