"""Job figures on a real single-node SLURM (root; installs SLURM when missing).
``python -m benchmarks.bench_jobs``. Each controller is a fresh process, as in real use."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONTROLLER = """
import json, sys, time
t0 = time.perf_counter()
import regency.job as jobs
job = eval(sys.argv[1], vars(jobs))
state = job.state(cached_path=None if sys.argv[2] == "-" else sys.argv[2])
t1 = time.perf_counter()
procs = state.hosts.spawn_procs(per_host={"gpus": 1})
procs.initialized.get(60)
t2 = time.perf_counter()
if sys.argv[3] == "kill":
    job.kill()
t3 = time.perf_counter()
print(json.dumps({"state": t1 - t0, "spawn": t2 - t1, "kill": t3 - t2}))
"""


def _controller(spec: str, state: str, action: str, cwd: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run(
        [sys.executable, "-c", CONTROLLER, spec, state, action], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run() -> list[tuple[str, str, float, str]]:
    from regency.testing import SlurmUnavailable, slurm_cluster

    rows: list[tuple[str, str, float, str]] = []
    t0 = time.perf_counter()
    try:
        cm = slurm_cluster()
        cluster = cm.__enter__()
    except SlurmUnavailable as exc:
        return [(f"job figures skipped: {exc}", "", float("nan"), "")]
    try:
        rows.append(("SLURM test cluster up (incl. warm-up job)", "", time.perf_counter() - t0, "s"))
        os.environ["SLURM_CONF"] = cluster.conf
        first, reuse, kill = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(3):
                spec = (
                    f"SlurmJob({{'hosts': 1}}, python_exe={sys.executable!r}, port={23400 + i}, "
                    f"log_dir={tmp!r})"
                )
                state = os.path.join(tmp, f"state{i}.pkl")
                first.append(_controller(spec, state, "exit", tmp))
                reuse.append(_controller(spec, state, "kill", tmp))
                kill.append(reuse[-1]["kill"])
            process = [
                _controller("ProcessJob({'hosts': 2})", "-", "kill", tmp) for _ in range(3)
            ]
        med = statistics.median
        rows += [
            ("SlurmJob.state(): import, sbatch, RUNNING, attach (new controller)", "",
             med(r["state"] for r in first), "s"),
            ("SlurmJob.state() reusing the cached allocation (new controller)", "",
             med(r["state"] for r in reuse), "s"),
            ("spawn_procs on the allocation until initialized", "",
             med(r["spawn"] for r in first), "s"),
            ("SlurmJob.kill() (shutdown + scancel)", "", med(kill), "s"),
            ("ProcessJob({'hosts': 2}).state() (new controller)", "",
             med(r["state"] for r in process), "s"),
        ]  # fmt: skip
    finally:
        cm.__exit__(None, None, None)
    return rows


if __name__ == "__main__":
    print("| figure | measured |")
    print("|---|---|")
    for figure, _target, value, unit in run():
        print(f"| {figure} | {value:,.3f} {unit} |")
