"""A Regency transport of another wire version, in its own process, for the handshake tests.

``python -m tests.transports.other_version VERSION ADDRESS...`` listens on each address as a
process whose ``WIRE_VERSION`` is ``VERSION``, prints one line per bound address, then echoes
what it gets until its standard input closes.
"""

from __future__ import annotations

import sys

import trio

from regency.transports import Connection, _auth, open_transport


class _Echo:
    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        conn.send_nowait(bytes(frame))

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass


async def _main(addresses: list[str]) -> None:
    async with open_transport(b"s" * 32) as transport:
        for address in addresses:
            listener = await transport.listen(address, lambda conn: _Echo())
            print(listener.address, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


if __name__ == "__main__":
    version = int(sys.argv[1])
    _auth.WIRE_VERSION = version
    _auth.PREFIX = _auth.MAGIC + bytes((version,))
    trio.run(_main, sys.argv[2:])
