"""The fallback across hosts (or when forced), and every transfer between simulated procs:
the bytes themselves travel on the owner's data connection (:mod:`~regency.rdma._link`),
chunked and pipelined. Local GPU memory goes through a host buffer."""

from __future__ import annotations

import trio

from . import _cuda
from ._backend import Backend, Transfer
from ._link import link_to


class TcpBackend(Backend):
    name = "tcp"

    async def run(self, transfer: Transfer) -> None:
        link = await link_to(transfer.ref)
        local, n = transfer.local, transfer.nbytes
        if transfer.write:
            if local.on_gpu:  # a host copy, made off the event loop
                data = await trio.to_thread.run_sync(_cuda.host_copy, local, 0, n)
            else:
                data = local.view[:n]
            await link.write(transfer.ref, data)
        elif local.on_gpu:
            staging = _cuda.host_staging(n, pinned=True)[0]
            await link.read(transfer.ref, staging)
            await trio.to_thread.run_sync(_cuda.put, local, 0, staging)
        else:
            await link.read(transfer.ref, local.view[:n])
