"""The fallback across hosts (or when forced): the bytes themselves travel on the owner's
data connection (:mod:`~regency.rdma._link`), chunked and pipelined."""

from __future__ import annotations

from ._backend import Backend, Transfer
from ._link import link_to


class TcpBackend(Backend):
    name = "tcp"

    async def run(self, transfer: Transfer) -> None:
        link = await link_to(transfer.ref)
        view = transfer.local.view[: transfer.nbytes]
        if transfer.write:
            await link.write(transfer.ref, view)
        else:
            await link.read(transfer.ref, view)
