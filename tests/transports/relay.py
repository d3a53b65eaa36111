"""An on-path attacker for the tests: a real TCP proxy that knows no secret."""

from __future__ import annotations

import struct

import trio

from regency.transports import _auth


class Relay:
    """A TCP proxy between a client and a server that knows no secret: it forwards the real
    handshake untouched, then applies ``mode`` to the client's records."""

    def __init__(self, target: tuple[str, int], mode: str, attack: bytes = b"") -> None:
        self.target, self.mode, self.attack = target, mode, attack

    async def serve(self, task_status: trio.TaskStatus[str]) -> None:
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = listener.socket.getsockname()[1]
        async with listener, trio.open_nursery() as nursery:
            task_status.started(f"tcp://127.0.0.1:{port}")
            while True:
                client = await listener.accept()
                server = await trio.open_tcp_stream(*self.target)
                nursery.start_soon(self._pump, server, client)
                nursery.start_soon(self._tamper, client, server)

    async def _pump(self, src: trio.abc.Stream, dst: trio.abc.Stream) -> None:
        try:
            async for chunk in src:
                await dst.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await dst.aclose()

    async def _tamper(self, client: trio.SocketStream, server: trio.SocketStream) -> None:
        buffered = bytearray()

        async def take(n: int) -> bytes:
            while len(buffered) < n:
                chunk = await client.receive_some()
                if not chunk:
                    raise EOFError
                buffered.extend(chunk)
            out = bytes(buffered[:n])
            del buffered[:n]
            return out

        try:
            await server.send_all(await take(_auth.CLIENT_PROOF_BYTES))  # the real proof
            if self.mode == "inject":
                await server.send_all(self.attack)
            held: list[bytes] = []
            index = 0
            while True:
                header = await take(12)
                body = await take(struct.unpack("<IQ", header)[0] & ~(1 << 31))
                record = header + body
                if self.mode == "drop" and index == 0:
                    pass
                elif self.mode == "reorder" and index == 0:
                    held.append(record)
                elif self.mode == "reorder" and index == 1:
                    await server.send_all(record + held.pop())
                elif self.mode == "replay" and index == 0:
                    await server.send_all(record + record)
                elif self.mode == "flip" and index == 0:
                    await server.send_all(record[:-20] + bytes([record[-20] ^ 0x40]) + record[-19:])
                else:
                    await server.send_all(record)
                index += 1
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await server.aclose()
