"""The event log of a simulation in Chrome's trace event format (opens in Perfetto or
chrome://tracing): each host a process, frames as flows from send to delivery, faults and
failures as instant markers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from ._clock import SimEvent

_HOSTS = re.compile(r"(\S+)->(\S+)")
_FAULTS = {"partition", "heal", "crash", "restart", "disconnect", "clog", "delay", "break"}


def chrome_trace(events: Iterable[SimEvent]) -> dict[str, Any]:
    """Build the trace (a JSON-ready dict) from a simulation's event log."""
    out: list[dict[str, Any]] = []
    pids: dict[str, int] = {}

    def pid(host: str) -> int:
        if host not in pids:
            pids[host] = len(pids) + 1
            out.append(
                {"ph": "M", "name": "process_name", "pid": pids[host], "args": {"name": host}}
            )
        return pids[host]

    flow = 0
    pending: dict[str, list[int]] = {}
    for event in events:
        us = event.time * 1e6
        hosts = _HOSTS.search(event.detail)
        if event.kind == "send" and hosts:
            flow += 1
            src = pid(hosts.group(1))
            out.append({"ph": "i", "name": "send", "pid": src, "tid": 1, "ts": us, "s": "t"})
            out.append({"ph": "s", "id": flow, "name": "frame", "pid": src, "tid": 1, "ts": us})
            pending.setdefault(event.detail.split()[0], []).append(flow)
        elif event.kind == "deliver" and hosts:
            dst = pid(hosts.group(2))
            flows = pending.get(event.detail.split()[0])
            out.append({"ph": "i", "name": "deliver", "pid": dst, "tid": 1, "ts": us, "s": "t"})
            if flows:
                out.append(
                    {"ph": "f", "bp": "e", "id": flows.pop(0), "name": "frame", "pid": dst,
                     "tid": 1, "ts": us}
                )
        elif event.kind in _FAULTS:
            out.append(
                {"ph": "i", "name": f"{event.kind}: {event.detail}", "pid": 0, "tid": 0,
                 "ts": us, "s": "g"}
            )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(events: Iterable[SimEvent], path: str) -> None:
    """Write :func:`chrome_trace` to ``path``."""
    with open(path, "w") as f:
        json.dump(chrome_trace(events), f)
