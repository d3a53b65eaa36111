"""The buffers this process has registered, and the leases peers hold on them.

Thread-safe: buffers are registered and dropped from user threads, actor threads and the trio
thread alike.

Lifetime: an entry holds a reference to the registered memory (through its
:class:`~regency.rdma._memory.Region`), so the memory outlives every Python reference the user
drops until :meth:`Registry.drop`. A same-host peer copies with no Python reference at all, so
before it copies it takes a *lease*; a dropped entry stays (refusing new transfers) until its
last lease is released or expires. A lease expires ``ttl`` seconds after it was taken, so a
peer that died mid-transfer cannot pin memory forever; peers check their own deadline before
each copy, and the ttl is the transfer's timeout plus a margin.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable

import attrs

from ._errors import RDMABufferDroppedError, RDMAError
from ._memory import Region


@attrs.define(eq=False)
class Entry:
    buf_id: int
    region: Region
    dropped: bool = False
    #: Ids of the leases on this entry that are neither released nor expired.
    leases: set[int] = attrs.Factory(set)
    #: Called once when the registry forgets the entry (dropped and unleased): backends
    #: release what they attached to it (a verbs memory registration, a CUDA IPC export).
    closers: list[Callable[[], None]] = attrs.Factory(list)
    #: What backends attached to the entry, by name (owned by them; see ``closers``).
    attached: dict[str, object] = attrs.Factory(dict)


class Registry:
    def __init__(self, clock: Callable[[], float]) -> None:
        #: Seconds on a monotonic clock, for lease expiry (the runtime environment's: virtual
        #: time in a simulation).
        self._clock = clock
        self._lock = threading.Lock()
        #: Notified whenever a lease ends.
        self._unpinned = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._lease_ids = itertools.count(1)
        self._entries: dict[int, Entry] = {}
        #: Ids of dropped buffers, so that later use says "dropped" rather than "unknown".
        self._dropped: set[int] = set()
        #: lease id -> (entry, expiry on the monotonic clock)
        self._leases: dict[int, tuple[Entry, float]] = {}
        #: Entries forgotten under the lock whose closers have not run yet.
        self._forgotten: list[Entry] = []

    def register(self, region: Region) -> int:
        with self._lock:
            buf_id = next(self._ids)
            self._entries[buf_id] = Entry(buf_id, region)
            return buf_id

    def check(self, buf_id: int, nbytes: int, *, write: bool) -> Entry:
        """The live entry ``buf_id``, if a transfer of ``nbytes`` (from its start) may use it.

        Raises :class:`RDMABufferDroppedError`, :class:`RDMAError` (unknown id), ``ValueError``
        (too many bytes) or ``TypeError`` (a write into read-only memory).
        """
        with self._lock:
            return self._check_locked(buf_id, nbytes, write)

    def _check_locked(self, buf_id: int, nbytes: int, write: bool) -> Entry:
        entry = self._entries.get(buf_id)
        if entry is None or entry.dropped:
            if entry is not None or buf_id in self._dropped:
                raise RDMABufferDroppedError(
                    f"RDMABuffer #{buf_id} of pid {os.getpid()} was dropped; "
                    "no transfer can use it after drop()"
                )
            raise RDMAError(f"no RDMABuffer #{buf_id} is registered in pid {os.getpid()}")
        size = entry.region.nbytes
        if nbytes > size:
            raise ValueError(
                f"transfer of {nbytes} bytes does not fit RDMABuffer #{buf_id} of {size} bytes"
            )
        if write and entry.region.readonly:
            raise TypeError(
                f"RDMABuffer #{buf_id} wraps read-only memory; write_from needs a writable one"
            )
        return entry

    def acquire(self, buf_id: int, nbytes: int, *, write: bool, ttl: float) -> tuple[int, Entry]:
        """Check as :meth:`check` does, then pin the entry for ``ttl`` seconds; return the
        lease id (for :meth:`release`) and the entry."""
        with self._lock:
            self._expire_locked()
            entry = self._check_locked(buf_id, nbytes, write)
            lease_id = next(self._lease_ids)
            self._leases[lease_id] = (entry, self._clock() + ttl)
            entry.leases.add(lease_id)
            return lease_id, entry

    def release(self, lease_id: int) -> None:
        """End a lease (idempotent: an expired or unknown lease is ignored)."""
        with self._lock:
            held = self._leases.pop(lease_id, None)
            if held is not None:
                self._unpin_locked(held[0], lease_id)
            self._expire_locked()
        self._close_forgotten()

    def drop(self, buf_id: int) -> None:
        """Refuse new transfers on ``buf_id``; forget its memory once no lease holds it.
        Idempotent."""
        with self._lock:
            entry = self._entries.get(buf_id)
            self._dropped.add(buf_id)
            if entry is not None:
                entry.dropped = True
                if not entry.leases:
                    del self._entries[buf_id]
                    self._forgotten.append(entry)
            self._expire_locked()
        self._close_forgotten()

    def live(self, buf_id: int) -> bool:
        """Whether ``buf_id`` is registered and not dropped."""
        with self._lock:
            entry = self._entries.get(buf_id)
            return entry is not None and not entry.dropped

    def leases_of(self, buf_id: int) -> int:
        """How many live leases pin ``buf_id`` (for tests and diagnostics)."""
        with self._lock:
            self._expire_locked()
            entry = self._entries.get(buf_id)
            return len(entry.leases) if entry is not None else 0

    def wait_unleased(self, buf_id: int, timeout: float) -> bool:
        """Block until no lease pins ``buf_id`` (True), or ``timeout`` seconds passed (False).

        Releases travel on the peers' data connections, apart from actor messages, so an
        actor that wants to know every transfer it was told about has let go waits here."""

        def unleased() -> bool:
            self._expire_locked()
            entry = self._entries.get(buf_id)
            return entry is None or not entry.leases

        with self._unpinned:
            return self._unpinned.wait_for(unleased, timeout)

    def __contains__(self, buf_id: int) -> bool:
        with self._lock:
            entry = self._entries.get(buf_id)
            return entry is not None and not entry.dropped

    def _unpin_locked(self, entry: Entry, lease_id: int) -> None:
        entry.leases.discard(lease_id)
        self._unpinned.notify_all()
        forget = entry.dropped and not entry.leases
        if forget and self._entries.pop(entry.buf_id, None) is not None:
            self._forgotten.append(entry)

    def _close_forgotten(self) -> None:
        """Run the closers of entries just forgotten, outside the lock (they may block)."""
        with self._lock:
            forgotten, self._forgotten = self._forgotten, []
        for entry in forgotten:
            for close in entry.closers:
                close()

    def _expire_locked(self) -> None:
        if not self._leases:
            return
        now = self._clock()
        for lease_id, (entry, expiry) in list(self._leases.items()):
            if expiry <= now:
                del self._leases[lease_id]
                self._unpin_locked(entry, lease_id)


#: This process's registry (a real process: one runtime, the wall clock).
registry = Registry(time.monotonic)
