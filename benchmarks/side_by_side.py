"""The five side-by-side workloads of docs/performance.md, against Regency and Monarch 0.7 in the same run.

``python -m benchmarks.side_by_side`` (or ``python benchmarks/side_by_side.py``) runs each
workload in fresh interpreters of both runtimes, one after the other, and prints a markdown
table with the range over ``--rounds`` rounds:

* ``call_one`` round trip, tiny argument, from the main thread (mean of 500 after warm-up);
* pipelined ``call_one``: 20,000 issued, then awaited (calls/s);
* ``call`` over a 4-proc mesh (mean of 300);
* ``call_one`` echoing a 1 MiB ``bytes`` argument (1 MiB each way; mean of 100);
* cold start: a fresh interpreter that has imported the runtime's actor API runs
  ``this_host().spawn_procs(per_host={"gpus": 2})``, spawns an actor and waits for the first
  reply from both procs. Each round is its own interpreter; the table also gives the import
  time and the wall time of the whole ``python`` command. Regency's bytecode is compiled
  first (``compileall``), as an installed package's is: Monarch's wheel has its bytecode.

Regency runs under this interpreter (with the repository on its path); Monarch under
``--monarch-python`` (default ``/work/compat/mvenv/bin/python``, a venv with
``torchmonarch==0.7.0``), and Ray under ``--ray-python`` (default ``/work/rayvenv/bin/python``;
``benchmarks/_ray_workloads.py``: medians, and no import or whole-command figures); each is
skipped with a message when that file is missing (``--ray-python ''`` skips Ray). The script needs
nothing but the runtime it drives, so that the same file runs in both venvs: in each child it
is ``--worker regency|monarch``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

_T_START = time.perf_counter()  # the interpreter's start, near enough (before any import)
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MONARCH = "/work/compat/mvenv/bin/python"
DEFAULT_RAY = "/work/rayvenv/bin/python"
#: benchmarks/_ray_workloads.py's keys, as ours.
_RAY_KEYS = {
    "call_one_us": "tiny",
    "pipelined_per_s": "pipelined",
    "call4_us": "mesh4",
    "echo_1mib_ms": "echo1m",
    "cold_start_s": "cold",
}
WARM = ("tiny", "pipelined", "mesh4", "echo1m")

#: (key, figure, unit, lower is better)
FIGURES: list[tuple[str, str, str, bool]] = [
    ("tiny", "`call_one` round trip, tiny, from the main thread", "us", True),
    ("pipelined", "pipelined `call_one` (20,000 issued, then awaited)", "calls/s", False),
    ("mesh4", "`call` over a 4-proc mesh", "us", True),
    ("echo1m", "`call_one` echoing a 1 MiB bytes argument (1 MiB each way)", "ms", True),
    ("cold", "cold start: `spawn_procs` of 2 procs until the first reply", "s", True),
    ("cold_import", "cold start: importing the actor API", "s", True),
    ("cold_wall", "cold start: the whole `python` command (start to exit)", "s", True),
]


def _worker(runtime: str, workload: str) -> dict[str, float]:
    t_import = time.perf_counter()
    if runtime == "monarch":
        from monarch.actor import Actor, endpoint, this_host
    else:
        from regency.actor import Actor, endpoint, this_host  # type: ignore[assignment]
    imported = time.perf_counter() - t_import

    class Echo(Actor):  # type: ignore[misc, valid-type]
        @endpoint  # type: ignore[misc]
        def ping(self, x: object = None) -> object:
            return x

    if workload == "cold":
        t0 = time.perf_counter()
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        procs.spawn("echo", Echo).ping.call().get()
        cold = time.perf_counter() - t0
        return {"cold": cold, "cold_import": imported, "cold_ready": time.perf_counter() - _T_START}

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    echo = procs.spawn("echo", Echo)
    echo.ping.call().get()
    one = echo.slice(gpus=0)
    out: dict[str, float] = {}

    def mean(fn: Callable[[], object], n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    mean(lambda: one.ping.call_one().get(), 300)
    out["tiny"] = mean(lambda: one.ping.call_one().get(), 500) * 1e6

    n = 20_000
    t0 = time.perf_counter()
    futs = [one.ping.call_one() for _ in range(n)]
    for f in futs:
        f.get()
    out["pipelined"] = n / (time.perf_counter() - t0)

    mean(lambda: echo.ping.call().get(), 50)
    out["mesh4"] = mean(lambda: echo.ping.call().get(), 300) * 1e6

    mib = b"x" * (1 << 20)
    assert one.ping.call_one(mib).get() == mib
    mean(lambda: one.ping.call_one(mib).get(), 10)
    out["echo1m"] = mean(lambda: one.ping.call_one(mib).get(), 100) * 1e3
    return out


def _run_child(python: str, runtime: str, workload: str, timeout: float) -> dict[str, float]:
    env = dict(os.environ)
    if runtime == "regency":
        env["PYTHONPATH"] = _REPO + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("REGENCY_SECRET", "regency-benchmark-job-secret")
    else:
        env.pop("PYTHONPATH", None)
    argv = [python, os.path.abspath(__file__), "--worker", runtime, "--workload", workload]
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 and not lines:
        raise RuntimeError(
            f"{runtime} {workload} exited with {done.returncode}:\n{done.stderr[-3000:]}"
        )
    result: dict[str, float] = json.loads(lines[-1])
    if workload == "cold":
        result["cold_wall"] = wall
    return result


def _run_ray(python: str, timeout: float) -> dict[str, float]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ray_workloads.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [python, script, "--rounds", "500"],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"ray exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return {_RAY_KEYS[k]: v for k, v in json.loads(lines[-1]).items() if k in _RAY_KEYS}


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f}"
    if unit == "ms":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def _cell(values: list[float], unit: str) -> str:
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    if _fmt(lo, unit) == _fmt(hi, unit):
        return _fmt(lo, unit)
    middle = sorted(values)[len(values) // 2]  # the one the ratio column uses
    return f"{_fmt(lo, unit)}\u2013{_fmt(hi, unit)} (median {_fmt(middle, unit)})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=("regency", "monarch"), help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--monarch-python", default=os.environ.get("MONARCH_PYTHON", DEFAULT_MONARCH))
    parser.add_argument("--ray-python", default=os.environ.get("RAY_PYTHON", DEFAULT_RAY))
    parser.add_argument("--rounds", type=int, default=3, help="runs of each workload (default 3)")
    parser.add_argument(
        "--only", default="", help="comma-separated keys: tiny,pipelined,mesh4,echo1m,cold"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.workload)), flush=True)
        os._exit(0)  # skip the runtimes' exit paths: not part of any figure

    wanted = set(args.only.split(",")) - {""} if args.only else {k for k, *_ in FIGURES}
    # Regency's bytecode, as an installed Regency would have it and Monarch's wheel has it
    # (benchmarks/_bytecode.py; imported here, in the parent: a child may run in a venv
    # without this repository on its path).
    if _REPO not in sys.path:
        sys.path.insert(0, _REPO)
    from benchmarks._bytecode import compile_regency

    compile_regency()
    runtimes: list[tuple[str, str]] = [("regency", sys.executable)]
    if os.path.exists(args.monarch_python):
        runtimes.append(("monarch", args.monarch_python))
    else:
        print(
            f"(Monarch skipped: no interpreter at {args.monarch_python}; "
            "pass --monarch-python or set MONARCH_PYTHON)",
            file=sys.stderr,
        )
    if args.ray_python and os.path.exists(args.ray_python):
        runtimes.append(("ray", args.ray_python))
    elif args.ray_python:
        print(f"(Ray skipped: no interpreter at {args.ray_python})", file=sys.stderr)
    results: dict[str, dict[str, list[float]]] = {name: {} for name, _ in runtimes}
    warm = [w for w in WARM if w in wanted]
    for round_ in range(args.rounds):
        for name, python in runtimes:  # alternate runtimes within a round: same load for both
            jobs: list[str] = (["warm"] if warm else []) + (["cold"] if "cold" in wanted else [])
            if name == "ray":
                jobs = ["all"]  # one script runs every workload
            for job in jobs:
                try:
                    if name == "ray":
                        got = _run_ray(python, args.timeout)
                    else:
                        got = _run_child(python, name, job, args.timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"round {round_ + 1}: {exc}", file=sys.stderr)
                    continue
                for key, value in got.items():
                    results[name].setdefault(key, []).append(value)
        print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr)

    try:
        load = " (load average {:.1f}, {:.1f}, {:.1f})".format(*os.getloadavg())
    except OSError:
        load = ""
    print(f"\n{os.cpu_count()} cores{load}; range and median over {args.rounds} rounds, fresh interpreters\n")
    names = [name for name, _ in runtimes]
    titles = {"regency": "Regency", "monarch": "Monarch 0.7", "ray": "Ray"}
    ratio = "monarch" in names
    header = "| figure | " + " | ".join(titles[n] for n in names)
    print(header + (" | Monarch / Regency (medians) |" if ratio else " |"))
    print("|---" * (len(names) + 1 + ratio) + "|")
    for key, figure, unit, lower_better in FIGURES:
        base = key.split("_")[0] if key.startswith("cold") else key
        if base not in wanted:
            continue
        cells = [_cell(results[n].get(key, []), unit) for n in names]
        cells = [c if c == "n/a" else f"{c} {unit}" for c in cells]
        row = f"| {figure} | " + " | ".join(cells)
        if ratio:
            r, m = (sorted(results[n].get(key, [])) for n in ("regency", "monarch"))
            if r and m:
                rm, mm = r[len(r) // 2], m[len(m) // 2]
                ratio = mm / rm if lower_better else rm / mm
                row += f" | {ratio:.2f}x"
            else:
                row += " | n/a"
        print(row + " |")


if __name__ == "__main__":
    main()
