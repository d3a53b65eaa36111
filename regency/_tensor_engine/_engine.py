"""The controller side: one :class:`Engine` per proc mesh, and the issuer that batches ops.

An engine belongs to the mesh that ``spawn_procs`` returned (its procs tuple), and serves every
slice, rename and split of it. It spawns one :class:`TensorWorker` per proc on first use, in a
flat mesh whose rank is the proc's global rank, so any slice of the proc mesh names the same
workers by the same ranks.

Ops are issued in program order into one buffer for one destination (an engine and a set of
ranks); the buffer is flushed as one message per rank when the destination changes, when it
is full, before a fetch, and when ``activate()`` ends. Since every send goes over the same
per-destination FIFO, each worker sees its ops in issue order.
"""

from __future__ import annotations

import atexit
import itertools
import sys
import threading
import traceback
import weakref
from collections import deque
from typing import Any

from ..core import Future, ProcMesh, Shape, current_runtime
from ._worker import TensorWorker

#: Ops buffered before a flush; large enough that a loop of small ops costs few messages.
BATCH_LIMIT = 512
#: Controller stack frames kept per op for error reports (RemoteException).
_STACK_DEPTH = 5
_SITES_KEPT = 100_000

_ENGINE_FILES = (__file__.rpartition("/")[0], "/torch/")


def _host_of(address: str) -> str:
    scheme, _, rest = address.partition("://")
    if scheme == "tcp":
        return rest.rpartition(":")[0].strip("[]")
    if scheme == "sim":
        return rest.partition("/")[0]
    return "localhost"


def _env_for(procs: tuple[tuple[str, str], ...], shape: Shape | None) -> list[dict[str, str]]:
    """RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE of every proc (global rank order).

    The local rank is the coordinate along a ``gpus`` or ``gpu`` dim when the mesh has one;
    otherwise procs are counted per host (a mesh without such a dim works too).
    """
    n = len(procs)
    gpu_dim = None
    if shape is not None:
        gpu_dim = next((d for d in ("gpus", "gpu") if d in shape.labels), None)
    envs: list[dict[str, str]] = []
    if shape is not None and gpu_dim is not None:
        size = shape.size(gpu_dim)
        for local in range(n):
            coords = shape.coords(local)
            envs.append({"LOCAL_RANK": str(coords[gpu_dim]), "LOCAL_WORLD_SIZE": str(size)})
        by_global = {shape.ranks[local]: envs[local] for local in range(n)}
        envs = [by_global[g] for g in range(n)]
    else:
        hosts = [_host_of(address) for _, address in procs]
        seen: dict[str, int] = {}
        for host in hosts:
            envs.append({"LOCAL_RANK": str(seen.get(host, 0))})
            seen[host] = seen.get(host, 0) + 1
        for env, host in zip(envs, hosts, strict=True):
            env["LOCAL_WORLD_SIZE"] = str(seen[host])
    for rank, env in enumerate(envs):
        env["RANK"] = str(rank)
        env["WORLD_SIZE"] = str(n)
    return envs


def issue_site() -> tuple[tuple[Any, int], ...]:
    """Where the user's code issued the current op: (code, instruction offset) of the
    innermost frames outside the engine and torch, innermost first. Cheap: line numbers,
    source and FrameSummary records wait until an error is reported (:func:`site_frames`)."""
    frame: Any = sys._getframe(2)
    engine_dir = _ENGINE_FILES[0]
    while frame is not None and frame.f_code.co_filename.startswith(engine_dir):
        frame = frame.f_back
    frames: list[tuple[Any, int]] = []
    torch_dir = _ENGINE_FILES[1]
    while frame is not None and len(frames) < _STACK_DEPTH:
        code = frame.f_code
        if torch_dir not in code.co_filename:
            frames.append((code, frame.f_lasti))
        frame = frame.f_back
    return tuple(frames)


def _line_of(code: Any, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line or 0
    return code.co_firstlineno  # type: ignore[no-any-return]


class Engine:
    """The tensor workers of one proc mesh and the controller's view of them."""

    def __init__(self, mesh: ProcMesh, issuer: Issuer, number: int) -> None:
        self.issuer = issuer
        procs: tuple[tuple[str, str], ...] = mesh._procs
        self.procs = procs
        self.size = len(procs)
        rt = current_runtime()
        #: Names this engine where its workers meet actors (``_actors.handoff``): unique
        #: among the engines of every runtime (an actor may run an engine of its own), and
        #: the same from one simulated run to the next.
        self.token = f"{rt.address}#{number}"
        self.simulated = rt.env.simulated_host is not None
        whole = mesh._shape if len(mesh._shape) == len(procs) else None
        env = _env_for(procs, whole)
        store: tuple[str, int, str] | None = None
        self._store: Any = None
        if not self.simulated:
            import datetime

            import torch.distributed as dist

            local = all(_host_of(a) == "localhost" for _, a in procs)
            host = "127.0.0.1" if local else _host_of(rt.address)
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                host,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=rt.config.spawn_timeout * 10),
            )
            store = (host, self._store.port, f"engine-{id(self):x}")
        flat = ProcMesh(procs, Shape.full(["rank"], [self.size]))
        self.workers: Any = flat.spawn("tensor_engine", TensorWorker, env, store, 300.0)
        # Wait for every worker's __init__, which imports torch on the actor's thread: a batch
        # holding torch objects (dtypes) that reached a proc earlier would import torch on the
        # proc's event loop while it unpickles, and the loop would miss its heartbeats.
        # An all-async actor's __init__ runs on its proc's event loop (Monarch's GRPO trainer
        # activates its mesh there), where waiting would block the loop: the ops queue behind
        # each worker's __init__ in its mailbox all the same.
        if not rt.on_runtime_thread():
            self.workers.initialized.get()
        self._slices: dict[tuple[int, ...], Any] = {}
        self.dels: deque[tuple[int, frozenset[int]]] = deque()
        self._held: list[tuple[int, frozenset[int]]] = []
        if self.simulated:
            ports = self.workers.port.call().get()
            self.workers.run.broadcast([("peers", [p for _, p in ports.items()])])

    def slice_for(self, shape: Shape) -> Any:
        """The workers of a slice of the mesh (cached per set of ranks)."""
        actors = self._slices.get(shape.ranks)
        if actors is None:
            actors = self.workers._with_shape(shape)
            self._slices[shape.ranks] = actors
        return actors

    def send(self, shape: Shape, ops: list[tuple[Any, ...]]) -> None:
        dests = frozenset(shape.ranks)
        held: list[tuple[int, frozenset[int]]] = self._held
        mine: list[int] = []
        dels = self.dels
        while dels:
            item = dels.popleft()
            if item[1] <= dests:
                mine.append(item[0])
            else:
                held.append(item)
        if mine:
            ops.append(("del", mine))
        self.slice_for(shape).run.broadcast(ops)
        if len(held) > 256:
            self.send_held()

    def send_held(self) -> None:
        while self.dels:
            self._held.append(self.dels.popleft())
        if self._held:
            refs = [ref for ref, _ in self._held]
            self._held = []
            self.workers.run.broadcast([("del", refs)])

    def fetch(self, rank: int, refs: list[int]) -> Future[list[Any]]:
        self.issuer.flush()
        return self.workers.slice(rank=rank).fetch.call_one(refs)  # type: ignore[no-any-return]

    def call_fetch(self, rank: int, seq: int, fn: Any, args: Any) -> Future[Any]:
        self.issuer.flush()
        return self.workers.slice(rank=rank).call_fetch.call_one(seq, fn, args)  # type: ignore[no-any-return]


class _RuntimeState:
    """The engines and the op buffer of one runtime (a simulation holds several runtimes,
    and one test process runs many simulations whose procs have the same names)."""

    def __init__(self) -> None:
        self.engines: dict[tuple[tuple[str, str], ...], Engine] = {}
        self.issuer = Issuer()


_states: weakref.WeakKeyDictionary[Any, _RuntimeState] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()
_exit_hook = False


def _flush_at_exit() -> None:
    """Ops issued since the last flush still go out when the program ends."""
    for state in list(_states.values()):
        try:
            state.issuer.flush()
        except Exception:  # a runtime already stopped: nothing can be sent
            pass


def _state() -> _RuntimeState:
    global _exit_hook
    rt = current_runtime()
    state = _states.get(rt)
    if state is None:
        with _states_lock:
            if not _exit_hook:  # after the runtime's own exit handler, so this one runs first
                atexit.register(_flush_at_exit)
                _exit_hook = True
            state = _states.setdefault(rt, _RuntimeState())
    return state


def engine_for(mesh: ProcMesh) -> Engine:
    """The engine of ``mesh``'s proc mesh, started on first use."""
    procs = mesh._procs
    state = _state()
    engine = state.engines.get(procs)
    if engine is None:
        with _states_lock:
            engine = state.engines.get(procs)
            if engine is None:
                engine = Engine(mesh, state.issuer, len(state.engines))
                state.engines[procs] = engine
    return engine


class Issuer:
    """The one buffer of ops not yet sent, for one destination at a time; the runtime's ref
    and op numbers (per runtime, so that a simulation replays byte for byte); and where each
    op was issued, for RemoteException."""

    def __init__(self) -> None:
        self._refs = itertools.count(1)
        self._seqs = itertools.count(1)
        self._sites: dict[int, tuple[tuple[Any, int], ...]] = {}
        self._site_order: deque[int] = deque()
        self._lock = threading.RLock()
        self._engine: Engine | None = None
        self._shape: Shape | None = None
        self._ranks: tuple[int, ...] = ()
        self._ops: list[tuple[Any, ...]] = []

    def new_ref(self) -> int:
        return next(self._refs)

    def next_seq(self) -> int:
        """A new op sequence number; records where the user's code issued the op."""
        seq = next(self._seqs)
        self._sites[seq] = issue_site()
        order = self._site_order
        order.append(seq)
        if len(order) > _SITES_KEPT:
            self._sites.pop(order.popleft(), None)
        return seq

    def site_frames(self, seq: int) -> list[traceback.FrameSummary] | None:
        """The frames where op ``seq`` was issued, outermost first (None if not kept)."""
        site = self._sites.get(seq)
        if site is None:
            return None
        return [
            traceback.FrameSummary(code.co_filename, _line_of(code, lasti), code.co_name)
            for code, lasti in reversed(site)
        ]

    def issue(self, engine: Engine, shape: Shape, op: tuple[Any, ...]) -> None:
        with self._lock:
            if engine is not self._engine or shape.ranks != self._ranks:
                self.flush()
                self._engine, self._shape, self._ranks = engine, shape, shape.ranks
            self._ops.append(op)
            if len(self._ops) >= BATCH_LIMIT:
                self.flush()

    def flush(self) -> None:
        with self._lock:
            ops, self._ops = self._ops, []
            if ops and self._engine is not None and self._shape is not None:
                self._engine.send(self._shape, ops)


class _Issuing:
    """``ISSUER``: issue through an engine's own buffer, or flush this runtime's."""

    @staticmethod
    def next_seq() -> int:
        return _state().issuer.next_seq()

    @staticmethod
    def issue(engine: Engine, shape: Shape, op: tuple[Any, ...]) -> None:
        engine.issuer.issue(engine, shape, op)

    @staticmethod
    def flush() -> None:
        _state().issuer.flush()


ISSUER = _Issuing()


def forget(engine_ref: weakref.ref[Engine] | Engine, ref: int, ranks: frozenset[int]) -> None:
    """A handle was collected or dropped: its ref goes with a later batch."""
    engine = engine_ref() if isinstance(engine_ref, weakref.ref) else engine_ref
    if engine is not None:
        engine.dels.append((ref, ranks))
