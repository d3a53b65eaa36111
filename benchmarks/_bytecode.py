"""Regency's bytecode, compiled before a cold-start or import figure is taken.

An installed package has its bytecode (pip compiles a wheel's modules as it installs them;
Monarch's venv has a ``.pyc`` beside each ``.py``). This tree is imported from source, and
where ``PYTHONDONTWRITEBYTECODE`` is set (as on this machine) no import caches what it
compiles: about 130 ms of every ``import regency.actor``, in the controller and the zygote,
would be compiling. ``make`` compiles it once when it builds the venv; modules edited since
would compile on every import again, so the benchmarks that time imports compile first (a
no-op when the bytecode is current)."""

from __future__ import annotations

import compileall
import os

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_regency() -> None:
    if not compileall.compile_dir(os.path.join(_REPO, "regency"), quiet=1):
        print("(could not compile all of regency's bytecode: import figures include compiling)")
