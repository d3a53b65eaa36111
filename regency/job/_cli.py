"""``regency apply | exec | kill | kubernetes``: the job commands of the command line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from ._job import DEFAULT_STATE_PATH, JobTrait, job_load


def add_commands(commands: Any) -> None:
    """Add the job subcommands to ``regency``'s subparsers."""
    apply = commands.add_parser(
        "apply", help="apply a job spec (module:attr) and cache it for later controllers"
    )
    apply.add_argument("spec", help="the job, as module:attr or module.attr (e.g. myjobs:train)")
    apply.add_argument(
        "--batch", metavar="CMD", help="run CMD (e.g. 'python train.py') inside the allocation"
    )
    apply.add_argument("--state", default=DEFAULT_STATE_PATH, help="the job state file")
    apply.set_defaults(run=_apply)

    exec_ = commands.add_parser("exec", help="run a command on the hosts of the applied job")
    which = exec_.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every host of every mesh (default)")
    which.add_argument("--one", action="store_true", help="only the first host (of --mesh)")
    exec_.add_argument("--mesh", metavar="NAME", help="only the hosts of mesh NAME")
    exec_.add_argument("-e", "--env", action="append", default=[], metavar="K=V")
    exec_.add_argument("--workdir", help="working directory on the hosts")
    exec_.add_argument("--state", default=DEFAULT_STATE_PATH, help="the job state file")
    exec_.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    exec_.set_defaults(run=_exec)

    kill = commands.add_parser("kill", help="release the applied job (scancel, ...)")
    kill.add_argument("--state", default=DEFAULT_STATE_PATH, help="the job state file")
    kill.set_defaults(run=_kill)

    k8s = commands.add_parser(
        "kubernetes", help="print Kubernetes manifests (Services + StatefulSets) for workers"
    )
    k8s.add_argument("--image", required=True, help="container image with regency installed")
    k8s.add_argument(
        "--mesh", action="append", required=True, metavar="NAME=HOSTS",
        help="a mesh and its host count (repeat for several)",
    )  # fmt: skip
    k8s.add_argument("--job-name", default="regency")
    k8s.add_argument("--namespace", default="default")
    k8s.add_argument("--port", type=int, default=7700)
    k8s.add_argument("--python", default="python", help="python in the image")
    k8s.add_argument("--secret-name", default="regency-job-secret")
    k8s.add_argument("--gpus-per-host", type=int)
    k8s.set_defaults(run=_kubernetes)


class CommandError(Exception):
    """A user error: printed as ``regency CMD: message``, exit status 2."""


def load_spec(spec: str) -> JobTrait:
    """The JobTrait at ``module:attr`` (or ``module.attr``), imported from the working
    directory first."""
    if ":" in spec:
        module, _, attr = spec.partition(":")
    elif "." in spec:
        module, _, attr = spec.rpartition(".")
    else:
        raise CommandError(f"the job must be given as module:attr, e.g. myjobs:train (got {spec!r})")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise CommandError(f"cannot import {module!r}: {exc}") from None
    job = getattr(mod, attr, None)
    if job is None:
        raise CommandError(f"module {module!r} has no attribute {attr!r}")
    if not isinstance(job, JobTrait):
        raise CommandError(
            f"{spec} must be a regency.job.JobTrait (SlurmJob, ProcessJob, ...), "
            f"got {type(job).__name__}"
        )
    return job


def _load_state(path: str) -> JobTrait:
    try:
        job = job_load(path)
    except FileNotFoundError:
        raise CommandError(
            f"no applied job in {path}: run `regency apply module:attr` first"
        ) from None
    if not job.active:
        raise CommandError(f"the job in {path} is not running any more: apply it again")
    return job


def _apply(args: argparse.Namespace) -> int:
    job = load_spec(args.spec)
    job.apply(client_script=args.batch)
    job_id = getattr(job, "job_id", None)
    where = f" (job id {job_id})" if job_id is not None else ""
    if args.batch:
        print(f"applied {args.spec}{where} in batch mode: {args.batch!r} runs in the allocation")
        return 0
    job.dump(args.state)
    print(f"applied {args.spec}{where}; its state is in {args.state}")
    return 0


def _exec(args: argparse.Namespace) -> int:
    from ._exec import exec_command

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise CommandError("give the command to run, e.g. regency exec -- hostname")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"-e takes KEY=VALUE (got {item!r})")
        env[key] = value
    if args.all and args.mesh is not None:
        raise CommandError("--all and --mesh exclude each other")
    meshes = _load_state(args.state).state(cached_path=None).meshes
    if args.mesh is not None:
        if args.mesh not in meshes:
            raise CommandError(f"the job has no mesh {args.mesh!r} (meshes: {', '.join(meshes)})")
        targets = [meshes[args.mesh]]
    else:
        targets = list(meshes.values())
    if args.one:
        targets = [targets[0].slice(hosts=slice(0, 1))]
    worst = 0
    for hosts in targets:
        worst = max(worst, exec_command(hosts, cmd, env, args.workdir))
    return worst


def _kill(args: argparse.Namespace) -> int:
    job = _load_state(args.state)
    job.kill()
    os.remove(os.path.realpath(args.state))
    print(f"killed the job in {args.state}")
    return 0


def _kubernetes(args: argparse.Namespace) -> int:
    from ._kubernetes import kubernetes_manifests

    meshes = {}
    for item in args.mesh:
        name, sep, count = item.partition("=")
        if not sep or not count.isdigit():
            raise CommandError(f"--mesh takes NAME=HOSTS, e.g. trainers=4 (got {item!r})")
        meshes[name] = int(count)
    try:
        text = kubernetes_manifests(
            meshes, args.image, job_name=args.job_name, namespace=args.namespace,
            port=args.port, python_exe=args.python, secret_name=args.secret_name,
            gpus_per_host=args.gpus_per_host,
        )  # fmt: skip
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    sys.stdout.write(text)
    return 0
