"""Runtime configuration: ``regency.configure(...)`` > ``REGENCY_*`` environment > defaults.

A snapshot is handed to every proc a runtime spawns, so children see the controller's choices.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs

_TRANSPORTS = ("unix", "tcp", "nng+ipc", "nng+tcp", "nng+tls+tcp")


def _check_transport(_: Any, __: Any, value: str) -> None:
    if value not in _TRANSPORTS:
        raise ValueError(f"default_transport must be one of {_TRANSPORTS} (got {value!r})")


def _check_protection(_: Any, __: Any, value: str) -> None:
    if value not in ("aead", "off"):
        raise ValueError(f"tcp_protection must be one of ('aead', 'off') (got {value!r})")


def _positive(attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive (got {value!r})")


#: Frames are prefixed with a u32 length, whose top value marks a shared-memory descriptor.
_FRAME_LIMIT = 0xFFFF_FFFF - 1


def _frame_bytes(attribute: attrs.Attribute[Any], value: int) -> None:
    _positive(attribute, value)
    if value > _FRAME_LIMIT:
        raise ValueError(
            f"{attribute.name} must be at most {_FRAME_LIMIT} (a frame's length is a u32 "
            f"on the wire; got {value!r})"
        )


def _not_negative(attribute: attrs.Attribute[Any], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be zero or more (got {value!r})")


def _at_least_2(attribute: attrs.Attribute[Any], value: int) -> None:
    if not (type(value) is int and value >= 2):
        raise ValueError(f"{attribute.name} must be an int of at least 2 (got {value!r})")


#: Frames after which a receiver acknowledges (``core/_inbound.py`` ``_ACK_EVERY``; a test
#: keeps the two alike): a send window must be larger.
ACK_EVERY = 1024


def _window(attribute: attrs.Attribute[Any], value: int) -> None:
    if not (type(value) is int and value > ACK_EVERY):
        raise ValueError(
            f"{attribute.name} must be an int above {ACK_EVERY} (receivers acknowledge every "
            f"{ACK_EVERY} frames; got {value!r})"
        )


def _flag(attribute: attrs.Attribute[Any], value: bool) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name} must be True or False (got {value!r})")


def _count(attribute: attrs.Attribute[Any], value: int) -> None:
    if not (type(value) is int and value >= 0):
        raise ValueError(f"{attribute.name} must be an int of 0 or more (got {value!r})")


def _byte_bound(attribute: attrs.Attribute[Any], value: int) -> None:
    if not (type(value) is int and value > 0):
        raise ValueError(f"{attribute.name} must be a positive int of bytes (got {value!r})")


def _check_runtime(_: Any, __: Any, value: str) -> None:
    if value not in ("real", "sim"):
        raise ValueError(f"runtime must be one of ('real', 'sim') (got {value!r})")


_RDMA_BACKENDS = ("auto", "same_host", "tcp", "ibverbs")


def _check_rdma(_: Any, __: Any, value: str) -> None:
    if value not in _RDMA_BACKENDS:
        raise ValueError(f"rdma_backend must be one of {_RDMA_BACKENDS} (got {value!r})")


@attrs.frozen
class Config:
    #: "real" (processes and sockets) or "sim" (a deterministic simulated cluster in this
    #: process; docs/simulation.md). Read when the controller's runtime starts.
    runtime: str = attrs.field(default="real", validator=_check_runtime)
    #: The simulation's seed: the same program and seed replay exactly.
    seed: int = 0
    #: How RDMABuffer moves bytes: "auto" picks per transfer (docs/rdma.md).
    rdma_backend: str = attrs.field(default="auto", validator=_check_rdma)
    #: Transport between procs: "unix" (default: fastest, see docs/transports.md), "tcp"
    #: (needed across hosts), or an nng flavour.
    default_transport: str = attrs.field(default="unix", validator=_check_transport)
    #: Host address procs listen on when the transport is tcp.
    tcp_host: str = "127.0.0.1"
    #: Frame protection on tcp:// links: "aead" (every frame sealed with AES-256-GCM under
    #: per-connection keys from the handshake; docs/transports.md) or "off" (frames in the
    #: clear, authenticated only by the handshake: for measuring the cost on a trusted
    #: network). Every process of a job must use the same setting.
    tcp_protection: str = attrs.field(default="aead", validator=_check_protection)
    #: Largest frame a connection accepts; bigger ones close that connection.
    max_frame_bytes: int = attrs.field(
        default=1 << 31, validator=lambda _inst, a, v: _frame_bytes(a, v)
    )
    #: Seconds a spawned proc has to start and connect back.
    spawn_timeout: float = attrs.field(default=60.0, validator=lambda _inst, a, v: _positive(a, v))
    #: Seconds ``ProcMesh.stop()`` waits for a proc to exit before killing it.
    stop_timeout: float = attrs.field(default=5.0, validator=lambda _inst, a, v: _positive(a, v))
    #: Seconds an outbox keeps trying to reconnect a broken link (resending what was not
    #: acknowledged) before the proc behind it counts as lost.
    delivery_timeout: float = attrs.field(
        default=10.0, validator=lambda _inst, a, v: _positive(a, v)
    )
    #: Flow control per destination (docs/supervision.md, "Back-pressure"): frames a
    #: process keeps in flight to one other process at most, sent and not yet acknowledged.
    #: Later frames wait in the sender until acknowledgements open the window again. More
    #: than the 1,024 frames after which receivers acknowledge (else each window would wait
    #: for the acknowledgement delay). Read when a runtime starts; procs inherit the
    #: controller's setting.
    send_window: int = attrs.field(default=65536, validator=lambda _inst, a, v: _window(a, v))
    #: Bytes of frames a process may hold for one destination beyond the window (a receiver
    #: that does not keep up). Past it, a send from a thread blocks until acknowledgements
    #: make room (or the link fails); a send from the runtime's loop (an async endpoint, an
    #: asyncio task), which must not block, raises ``SendBufferFull`` naming the peer. Nothing
    #: is dropped. Read when a runtime starts; procs inherit the controller's setting.
    send_buffer_bytes: int = attrs.field(
        default=256 << 20, validator=lambda _inst, a, v: _positive(a, v)
    )
    #: Seconds a reconnect to a network address (tcp) goes on dialing while the address
    #: refuses connections: a relay, proxy or load balancer in between may be restarting.
    #: Past it (or at once with 0, and always for a local socket, where a refusal means the
    #: proc's listener is gone) the peer is given up, as an exited one. Longer rides out
    #: slower restarts; it also delays noticing a host whose worker died by as much.
    reconnect_refused_s: float = attrs.field(
        default=2.0, validator=lambda _inst, a, v: _not_negative(a, v)
    )
    #: Seconds a ``__cleanup__`` may take before it is abandoned.
    cleanup_timeout: float = attrs.field(
        default=3.0, validator=lambda _inst, a, v: _positive(a, v)
    )
    #: Seconds between a proc's heartbeats to its spawner.
    heartbeat_interval: float = attrs.field(
        default=1.0, validator=lambda _inst, a, v: _positive(a, v)
    )
    #: Tee every proc's stdout and stderr to the controller (docs/logging.md); read when
    #: procs are spawned.
    enable_log_forwarding: bool = False
    #: Also write each proc's stdout and stderr to files on its host, one pair per proc
    #: (docs/logging.md, "Files"; Monarch's key); read when procs are spawned.
    enable_file_capture: bool = attrs.field(
        default=False, validator=lambda _inst, a, v: _flag(a, v)
    )
    #: Where those files go: ``<dir>/<job>/<proc_id>.rank<R>.stdout`` (and ``.stderr``);
    #: "" (default) is ``$TMPDIR/regency-logs-<user>``.
    file_capture_dir: str = ""
    #: Bytes a capture file grows to before it is rotated (renamed ``.1``, replacing the
    #: previous ``.1``): a proc's files never take more than twice this per stream.
    file_capture_max_bytes: int = attrs.field(
        default=64 << 20, validator=lambda _inst, a, v: _byte_bound(a, v)
    )
    #: Lines of each proc's output (stdout and stderr, in the order read) its host keeps;
    #: when the proc dies, its spawner puts them in the failure's message (docs/logging.md,
    #: "The last lines of a dead proc"; Monarch's key). 0 (default, as Monarch's) keeps none.
    tail_log_lines: int = attrs.field(default=0, validator=lambda _inst, a, v: _count(a, v))
    #: Seconds without a heartbeat after which a spawner declares a proc stuck and kills it.
    heartbeat_timeout: float = attrs.field(
        default=10.0, validator=lambda _inst, a, v: _positive(a, v)
    )
    #: Seconds ``attach_to_workers`` waits for each worker to answer before it fails with
    #: ``ConnectionError`` (Monarch's ``mesh_attach_config_timeout``).
    attach_timeout: float = attrs.field(
        default=60.0, validator=lambda _inst, a, v: _positive(a, v)
    )
    #: Seconds a worker keeps the procs of a controller it stopped hearing from (the
    #: controller died or its network is gone) before it kills them: the lease
    #: ``attach_to_workers`` takes when not given one (Monarch's ``mesh_orphan_timeout``).
    #: Procs of this machine need none: they die with the controller (``PR_SET_PDEATHSIG``).
    worker_lease: float = attrs.field(
        default=10.0, validator=lambda _inst, a, v: _positive(a, v)
    )

    #: Seconds an endpoint may run before the controller logs a stall warning for it
    #: (logger ``regency.stall``: actor, rank, host, pid, endpoint, elapsed time, innermost
    #: frames), repeated at doubling intervals while it lasts; 0 turns it off
    #: (docs/observability.md). Procs inherit the controller's setting.
    stall_warning_s: float = attrs.field(
        default=120.0, validator=lambda _inst, a, v: _not_negative(a, v)
    )

    #: Record a timeline of the whole run and write it to this file (Chrome trace-event JSON)
    #: when the controller shuts down; "" (default): no tracing (``regency.trace(path)``
    #: traces part of a program). docs/observability.md.
    trace_path: str = ""
    #: Events each proc keeps while tracing (older ones are dropped and counted).
    trace_buffer: int = attrs.field(default=100_000, validator=lambda _inst, a, v: _positive(a, v))
    #: Keep message statistics for ``regency.telemetry.instrument()`` (docs/observability.md,
    #: "Metrics"): each actor counts its handled calls, errors and handling time per endpoint
    #: (latency buckets), each runtime the calls it sends. Off (default): nothing is kept; a
    #: handled call pays nothing for it, a sent one an attribute test. Read when a proc or an
    #: actor starts (the controller's sends: when it spawns procs); procs inherit the
    #: controller's setting, so set it before spawning.
    metrics: bool = False

    #: Threads that wait read their own messages from the sockets: a thread blocked in
    #: ``Future.get`` its reply, an idle actor thread its next call (leader/follower; see
    #: docs/internals.md, "Where the time goes"). False: only the trio loop reads, and hands
    #: each message to the waiting thread (one more wake-up each way; for measuring the
    #: difference). Read when a runtime starts; procs inherit the controller's setting.
    thread_reads: bool = True
    #: Microseconds a thread that reads its own messages polls without sleeping before it
    #: blocks (``core/_spin.py``): it catches a reply already on its way without the
    #: kernel's wake-up, at the cost of a busy core meanwhile; only with more than one usable
    #: CPU, when a CPU is free (an idle actor thread waiting for its next call also when
    #: none is), and while spinning keeps catching. 0 turns it off. Read when a runtime
    #: starts; procs inherit the controller's setting.
    spin_us: float = attrs.field(default=200.0, validator=lambda _inst, a, v: _not_negative(a, v))

    #: Big frames (64 KiB or more) between procs of one host travel through shared memory
    #: instead of the unix socket: a ring per connection and direction, passed over the
    #: authenticated socket (docs/transports.md, "The shared-memory lane"). False: every
    #: frame goes through the socket. A connection uses the lane only when both ends offer
    #: it. Read when a runtime starts; procs inherit the controller's setting.
    shm_lane: bool = True

    #: A cast (``call``, ``broadcast``, ``stream``, ``send``) to at least this many procs
    #: travels down a tree of the procs themselves instead of one frame per proc from the
    #: sender, and a ``call``'s replies come back up it in few frames (docs/concepts.md).
    cast_tree_min: int = attrs.field(default=64, validator=lambda _inst, a, v: _positive(a, v))
    #: How many procs each forwarder (and the sender) sends a tree cast on to: with 16, a
    #: 4,096-proc cast is 3 hops deep and the sender sends 16 frames. (The default
    #: ``cast_tree_min`` is 4 x 16: below it, ranges of fewer than 4 procs save the sender
    #: little and cost a hop; docs/performance.md.)
    cast_fanout: int = attrs.field(default=16, validator=lambda _inst, a, v: _at_least_2(a, v))

    @property
    def tees_output(self) -> bool:
        """Whether procs spawned with these settings tee their fds 1 and 2 (log
        forwarding, file capture or an output tail needs it)."""
        return self.enable_log_forwarding or self.enable_file_capture or self.tail_log_lines > 0

    def to_env(self) -> dict[str, str]:
        return {f"REGENCY_{f.name.upper()}": str(getattr(self, f.name)) for f in attrs.fields(Config)}


def _boolean(raw: str) -> bool:
    """An environment flag: 1/true/yes/on or 0/false/no/off, any case."""
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


def _from_env() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in attrs.fields(Config):
        raw = os.environ.get(f"REGENCY_{f.name.upper()}")
        if raw is None:
            continue
        kinds: dict[str, Callable[[str], Any]] = {
            "str": str, "int": int, "float": float, "bool": _boolean
        }
        kind = kinds[f.type.__name__ if isinstance(f.type, type) else str(f.type)]
        try:
            out[f.name] = kind(raw)
        except ValueError:
            raise ValueError(
                f"environment variable REGENCY_{f.name.upper()} must be "
                f"{'a boolean (1/0, true/false)' if kind is _boolean else str(f.type)} "
                f"(got {raw!r})"
            ) from None
    return out


_overrides: dict[str, Any] = {}
_current: Config | None = None


def current_config() -> Config:
    global _current
    if _current is None:
        _current = Config(**{**_from_env(), **_overrides})
    return _current


class UnknownConfigKeyError(ValueError, TypeError):
    """A configuration key that is no setting (``regency.config`` also takes Monarch's keys).
    A ``ValueError``, as Monarch's ``configure`` raises, and a ``TypeError``, as for an
    unknown keyword argument, so either ``except`` catches it. The message names the key
    and lists the valid ones."""


def configure(**settings: Any) -> None:
    """Set configuration for this process and the procs it spawns from now on.

    Unknown keys raise :class:`UnknownConfigKeyError` naming them and the valid keys.
    """
    global _current
    valid = {f.name for f in attrs.fields(Config)}
    unknown = sorted(set(settings) - valid)
    if unknown:
        raise UnknownConfigKeyError(
            f"unknown configuration keys {unknown}; valid keys: {sorted(valid)}"
        )
    candidate = {**_overrides, **settings}
    Config(**{**_from_env(), **candidate})  # validate before committing
    _overrides.update(settings)
    _current = None


@contextlib.contextmanager
def overridden(**settings: Any) -> Iterator[Config]:
    """Apply ``configure(**settings)`` for the duration of a ``with`` block, then restore the
    configuration as it was (a simulated run uses this for its "buggify" settings)."""
    global _current
    saved = dict(_overrides)
    configure(**settings)
    try:
        yield current_config()
    finally:
        _overrides.clear()
        _overrides.update(saved)
        _current = None


def runtime_overrides() -> dict[str, Any]:
    """The settings made with :func:`configure` in this process (a copy)."""
    return dict(_overrides)


def reset_overrides() -> None:
    """Forget every :func:`configure` setting."""
    global _current
    _overrides.clear()
    _current = None
