"""``os.environ`` per simulated proc.

A real proc sees its spawner's environment plus the ``env=`` given to ``spawn_procs``; every
simulated proc lives in the one process that runs the simulation. So once a simulated proc is
given an environment, ``os.environ`` becomes a :class:`SimEnviron`: code running for a
simulated proc (its tasks and sync endpoints: the current runtime says which) reads and
writes that proc's view, every other thread the process's own environment. Only Python-level
reads see it (``os.environ``, ``os.getenv``); C code calling ``getenv`` sees the process's.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING

from ..core._current import current_runtime_or_none

if TYPE_CHECKING:
    from ..core._runtime import Runtime

_DELETED = None


class SimEnviron(MutableMapping[str, str]):
    """The process's environment, overlaid per simulated proc."""

    def __init__(self, base: MutableMapping[str, str]) -> None:
        self.base = base
        #: Per proc runtime: its differences from ``base`` (``None``: deleted there).
        self.overlays: weakref.WeakKeyDictionary[Runtime, dict[str, str | None]] = (
            weakref.WeakKeyDictionary()
        )

    def _overlay(self) -> dict[str, str | None] | None:
        rt = current_runtime_or_none()
        return self.overlays.get(rt) if rt is not None else None

    def __getitem__(self, key: str) -> str:
        overlay = self._overlay()
        if overlay is not None and key in overlay:
            value = overlay[key]
            if value is _DELETED:
                raise KeyError(key)
            return value
        return self.base[key]

    def __setitem__(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"environment keys and values must be str (got {key!r}: {value!r})")
        overlay = self._overlay()
        if overlay is None:
            self.base[key] = value
        else:
            overlay[key] = value

    def __delitem__(self, key: str) -> None:
        overlay = self._overlay()
        if overlay is None:
            del self.base[key]
            return
        if key not in self:
            raise KeyError(key)
        overlay[key] = _DELETED

    def _keys(self) -> list[str]:
        overlay = self._overlay() or {}
        keys = [k for k in self.base if overlay.get(k, "") is not _DELETED]
        keys += [k for k, v in overlay.items() if v is not _DELETED and k not in self.base]
        return keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def copy(self) -> dict[str, str]:
        return dict(self)

    def __repr__(self) -> str:
        return f"SimEnviron({dict(self)!r})"


def give_environment(rt: Runtime, env: Mapping[str, str], parent: Runtime | None) -> bool:
    """Make ``rt`` (a simulated proc) see ``parent``'s environment plus ``env``; True if it
    now has a view of its own."""
    current: MutableMapping[str, str] = os.environ
    if isinstance(current, SimEnviron):
        environ = current
    else:
        if not env:
            return False  # nothing differs from the process's environment
        environ = SimEnviron(current)
        # Replaced, not cleared: the process's environment lives on as ``environ.base``.
        os.environ = environ  # type: ignore[assignment]  # noqa: B003
    inherited = dict(environ.overlays.get(parent, {})) if parent is not None else {}
    inherited.update(env)
    if not inherited:
        return False
    environ.overlays[rt] = inherited
    return True


def forget_environments(runtimes: list[Runtime]) -> None:
    """The simulation that ran ``runtimes`` ended: drop their views, and once no view is left
    give the process back its own ``os.environ``."""
    environ: MutableMapping[str, str] = os.environ
    if not isinstance(environ, SimEnviron):
        return
    for rt in runtimes:
        environ.overlays.pop(rt, None)
    runtimes.clear()
    if not environ.overlays:
        os.environ = environ.base  # type: ignore[assignment]  # noqa: B003
