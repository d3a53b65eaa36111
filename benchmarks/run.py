"""``make bench``: every figure, as a table. Medians of repeated runs on this machine."""

from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("REGENCY_SECRET", "regency-benchmark-job-secret")

import regency.actor
from benchmarks import (
    bench_actors,
    bench_dispatch,
    bench_fanout,
    bench_introspection,
    bench_jobs,
    bench_logs,
    bench_multihost,
    bench_protect,
    bench_sim,
    bench_supervision,
    bench_transports,
)

Row = tuple[str, str, float, str]


def _table(title: str, rows: list[Row]) -> None:
    print(f"\n### {title}\n")
    print("| figure | measured | target |")
    print("|---|---|---|")
    for figure, target, value, unit in rows:
        shown = f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
        print(f"| {figure} | {shown} {unit} | {target + ' ' + unit if target else ''} |")


def main() -> None:
    print(
        f"# Regency benchmarks: {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores"
    )
    regency.actor.unhandled_fault_hook = lambda failure: None  # benchmarks kill procs
    _table("Actors", bench_actors.run())
    _table("Runtime cost per message, one thread's CPU", bench_dispatch.run())
    _table("The controller's CPU for one call, without sockets", bench_fanout.run())
    print("\n### Transports: 64-byte frames between two processes\n")
    print("| transport | round trip | pipelined | client CPU per trip |")
    print("|---|---|---|---|")
    for scheme, us, rate, cpu in bench_transports.run():
        print(f"| {scheme} | {us:,.1f} us | {rate:,.0f} frames/s | {cpu:,.0f} us |")
    _table("Supervision", bench_supervision.run())
    _table("Introspection: stacks of a 64-proc job", bench_introspection.run())
    try:
        from benchmarks import bench_rdma
    except ImportError as exc:
        print(f"\n(RDMA figures skipped: {exc})")
    else:
        _table("RDMA buffers", bench_rdma.run())
    _table("Multi-host between network namespaces", bench_multihost.run())
    _table("Frame protection on tcp://", bench_protect.run())
    _table("Simulator", bench_sim.run())
    _table("Log forwarding and the debugger's driver", bench_logs.run())
    _table("Jobs on a real single-node SLURM", bench_jobs.run())
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
    except ImportError as exc:
        print(f"\n(notebook figures skipped: {exc})")
    else:
        from benchmarks import bench_notebook

        _table("Jupyter kernel, through nbclient", bench_notebook.run())
    try:
        from benchmarks import bench_tensor_engine
    except ImportError as exc:
        print(f"\n(tensor-engine figures skipped: {exc})")
    else:
        _table("Tensor engine, CPU and gloo", bench_tensor_engine.run())
    # GPU memory through regency.rdma: prints "no GPU" and nothing else without CUDA.
    print("\n### RDMA buffers of GPU memory, two processes of one host\n")
    from benchmarks import bench_gpu

    bench_gpu.main(["--sizes", "4K,1M,64M", "--runs", "6"])


if __name__ == "__main__":
    main()
