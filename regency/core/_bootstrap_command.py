"""How a proc on this host is started: Monarch's ``BootstrapCommand`` and
``default_bootstrap_cmd()``, for ``HostMesh.spawn_procs(bootstrap_command=...)``.

A proc is a program that ends up running ``python -m regency.core._bootstrap`` with the
bootstrap record on its stdin. The default command is exactly that, with this interpreter; a
custom one may wrap it (``numactl ... python -m regency.core._bootstrap``, a shell script
that sets things up and ``exec``s it) or add environment variables (``with_env``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import attrs

#: What a proc's command must run, after its interpreter.
BOOTSTRAP_ARGS = ("-m", "regency.core._bootstrap")


def _env(value: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError(f"BootstrapCommand env must map str to str (got {value!r})")
    return tuple(sorted(value.items()))


@attrs.frozen(init=False)
class BootstrapCommand:
    """A command line that starts a proc: ``program`` run as ``arg0`` (default: ``program``)
    with ``args``, with ``env`` added to the environment. Immutable; ``with_env`` returns a
    copy."""

    program: str
    arg0: str | None
    args: tuple[str, ...]
    _env: tuple[tuple[str, str], ...]

    def __init__(
        self,
        program: str,
        arg0: str | None = None,
        args: Sequence[str] = BOOTSTRAP_ARGS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(program, str) or not program:
            raise TypeError(f"BootstrapCommand program must be a path (got {program!r})")
        if arg0 is not None and not isinstance(arg0, str):
            raise TypeError(f"BootstrapCommand arg0 must be a str or None (got {arg0!r})")
        if (
            isinstance(args, str)
            or not isinstance(args, Sequence)
            or not all(isinstance(a, str) for a in args)
        ):
            raise TypeError(f"BootstrapCommand args must be a list of str (got {args!r})")
        self.__attrs_init__(program, arg0, tuple(args), _env(env or {}))

    @property
    def env(self) -> dict[str, str]:
        return dict(self._env)

    def with_env(self, env: Mapping[str, str]) -> BootstrapCommand:
        """A copy with ``env`` merged over this command's environment."""
        return BootstrapCommand(self.program, self.arg0, self.args, {**self.env, **env})

    def argv(self) -> list[str]:
        return [self.arg0 or self.program, *self.args]

    def __repr__(self) -> str:
        return (
            f"BootstrapCommand(program={self.program!r}, arg0={self.arg0!r}, "
            f"args={list(self.args)!r}, env={self.env!r})"
        )


def default_bootstrap_cmd() -> BootstrapCommand:
    """How procs on this host start by default: this interpreter, ``-m
    regency.core._bootstrap``, no extra environment. A base to customize (``with_env``)."""
    return BootstrapCommand(sys.executable, None, BOOTSTRAP_ARGS, {})
