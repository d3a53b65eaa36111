"""A controller program for the job tests: ``python -m tests.jobs.controller JOB STATE ACTION``.

JOB is a Python expression for the job spec (names from regency.job), STATE the state file
(or "-" for none). It attaches, spawns one Probe per host of every mesh, calls it, prints one
JSON line, then: "exit" returns, "hold" waits to be killed, "kill" kills the job,
"shutdown" shuts every mesh down.
"""

from __future__ import annotations

import json
import sys
import threading

import regency.job as job_module
from regency.job import JobTrait

from .actors import Probe


def main() -> None:
    expression, state_path, action = sys.argv[1:4]
    job: JobTrait = eval(expression, vars(job_module))
    state = job.state(cached_path=None if state_path == "-" else state_path)
    report: dict[str, object] = {"job_id": getattr(job, "job_id", None), "meshes": {}}
    for name, hosts in state.meshes.items():
        procs = hosts.spawn_procs(per_host={"gpus": 1}, name=name)
        probes = procs.spawn(f"probes_{name}", Probe)
        report["meshes"][name] = {  # type: ignore[index]
            "where": list(probes.where.call().get(60).values()),
            "bumps": probes.bump.call().get(60).values(),
            "secret_in_env": probes.secret_in_env.call().get(60).values(),
        }
    print(json.dumps(report), flush=True)
    if action == "hold":
        threading.Event().wait()
    elif action == "kill":
        job.kill()
    elif action == "shutdown":
        for hosts in state.meshes.values():
            hosts.shutdown().get(60)


if __name__ == "__main__":
    main()
