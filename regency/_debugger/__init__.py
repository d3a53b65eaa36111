"""Remote pdb for actors (docs/debugging.md).

* :mod:`._remote`: in procs, the ``breakpoint()`` hook, the remote pdb and the greenlet
  driver that keeps the loop free while an async endpoint sits at a breakpoint.
* :mod:`._controller`: in the controller, the ``DebugController`` actor and its TCP server.
* :mod:`._commands`: the debugger's command language.
* :mod:`._client`: the ``regency debug`` client.
"""

from __future__ import annotations

from ._remote import call_ended, drive, install_breakpoint_hook

__all__ = ["call_ended", "drive", "install_breakpoint_hook"]
