"""The five side-by-side workloads of docs/performance.md on Ray, for ``benchmarks/side_by_side.py``.

Run it with a Python that has ``ray`` (a venv outside this repo; Ray is not a dependency of
Regency): ``python benchmarks/_ray_workloads.py [--rounds N]``. It prints one JSON object:
``{"call_one_us": ..., "pipelined_per_s": ..., "call4_us": ..., "echo_1mib_ms": ...,
"cold_start_s": ...}``. Latencies are medians; the cold start is measured in a fresh
interpreter (``ray.init`` plus two actors until the first reply), imports excluded, as for
the other runtimes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

COLD = """
import time
import ray
t0 = time.perf_counter()
ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1

actors = [A.remote() for _ in range(2)]
ray.get([a.ping.remote() for a in actors])
print(time.perf_counter() - t0)
ray.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--pipelined", type=int, default=20_000)
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self) -> int:
            return 1

        def echo(self, data: bytes) -> bytes:
            return data

    one = Echo.remote()  # type: ignore[attr-defined]
    four = [Echo.remote() for _ in range(4)]  # type: ignore[attr-defined]
    ray.get([one.ping.remote()] + [a.ping.remote() for a in four])

    def timed(fn: object, rounds: int) -> float:
        samples = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()  # type: ignore[operator]
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)

    for _ in range(200):  # warm
        ray.get(one.ping.remote())
    call_one = timed(lambda: ray.get(one.ping.remote()), args.rounds)
    call4 = timed(lambda: ray.get([a.ping.remote() for a in four]), args.rounds // 2)
    blob = b"x" * (1 << 20)
    echo = timed(lambda: ray.get(one.echo.remote(blob)), max(50, args.rounds // 10))
    t = time.perf_counter()
    refs = [one.ping.remote() for _ in range(args.pipelined)]
    ray.get(refs)
    pipelined = args.pipelined / (time.perf_counter() - t)
    ray.shutdown()
    cold = float(
        subprocess.run(
            [sys.executable, "-c", COLD], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    )
    print(
        json.dumps(
            {
                "call_one_us": call_one * 1e6,
                "pipelined_per_s": pipelined,
                "call4_us": call4 * 1e6,
                "echo_1mib_ms": echo * 1e3,
                "cold_start_s": cold,
            }
        )
    )


if __name__ == "__main__":
    main()
