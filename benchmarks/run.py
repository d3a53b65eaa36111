"""``make bench``: every figure, as a table. Medians of repeated runs on this machine."""

from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_actors, bench_transports


def main() -> None:
    print(f"# Regency benchmarks: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} cores\n")
    print("| figure | measured | target |")
    print("|---|---|---|")
    for figure, target, value, unit in bench_actors.run():
        print(f"| {figure} | {value:,.1f} {unit} | {target} {unit} |")
    print("\n| transport: 64-byte frame round trip between two processes | measured |")
    print("|---|---|")
    for scheme, us in bench_transports.run():
        print(f"| {scheme} | {us:,.1f} us |")


if __name__ == "__main__":
    main()
