"""Procs write whole lines: one write(2) per completed line (regency/core/_lines.py)."""

from __future__ import annotations

import socket

from regency.core._lines import WholeLines


def test_each_line_goes_out_in_one_write() -> None:
    # SOCK_SEQPACKET keeps write boundaries: each recv returns exactly one write.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b, open(a.fileno(), "w", closefd=False) as raw:
        out = WholeLines(raw)
        print("x" * 300, file=out)  # Python's own streams: text, then "\n", separately
        print("partial", end="", file=out)
        print(" done", 2, file=out)
        out.write("a\nb\nc")
        out.flush()
        b.setblocking(False)
        got = []
        while True:
            try:
                got.append(b.recv(65536))
            except BlockingIOError:
                break
    assert got == [b"x" * 300 + b"\n", b"partial done 2\n", b"a\nb\n", b"c"]


def test_the_rest_of_the_stream_interface_is_the_original_one() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b, open(a.fileno(), "w", closefd=False) as raw:
        out = WholeLines(raw)
        assert out.fileno() == a.fileno() and out.encoding == raw.encoding
        assert out.name == raw.name and not out.isatty()
        out.write("text first, ")
        out.buffer.write(b"then bytes\n")  # ``buffer`` flushes the pending text first
        raw.flush()
        data = b""
        while not data.endswith(b"\n"):
            data += b.recv(100)
        assert data == b"text first, then bytes\n"
