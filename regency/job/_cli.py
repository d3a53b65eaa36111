"""``regency apply | exec | shell | kill | context | kubernetes``: the job commands of the
command line."""

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
    which.add_argument(
        "--point", metavar="DIM=N,DIM=N",
        help="only at these coordinates (of the first mesh, or --mesh), e.g. hosts=1,gpus=3",
    )  # fmt: skip
    exec_.add_argument("--mesh", metavar="NAME", help="only the hosts of mesh NAME")
    exec_.add_argument(
        "--per-host", metavar="DIM=N",
        help="run in N procs per host along DIM (each gets REGENCY_RANK_<DIM>, "
        "REGENCY_SIZE_<DIM> of every dim), e.g. gpus=4",
    )  # fmt: skip
    exec_.add_argument("-e", "--env", action="append", default=[], metavar="K=V")
    exec_.add_argument("--workdir", help="working directory on the hosts")
    exec_.add_argument("--script", metavar="FILE", help="run this bash script ('-': stdin)")
    exec_.add_argument("-m", dest="module", metavar="MODULE", help="run a Python module")
    exec_.add_argument("--kill", action="store_true", help="kill the job afterwards")
    exec_.add_argument("--state", default=DEFAULT_STATE_PATH, help="the job state file")
    exec_.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    exec_.set_defaults(run=_exec)

    shell = commands.add_parser(
        "shell", help="an interactive shell on one host of the applied job"
    )
    shell.add_argument("--mesh", metavar="NAME", help="a host of mesh NAME (default: the first)")
    shell.add_argument(
        "--point", metavar="DIM=N", help="the host at these coordinates (default: the first)"
    )
    shell.add_argument("-e", "--env", action="append", default=[], metavar="K=V")
    shell.add_argument("--workdir", help="where the shell starts on the host")
    shell.add_argument("--kill", action="store_true", help="kill the job after the shell exits")
    shell.add_argument("--state", default=DEFAULT_STATE_PATH, help="the job state file")
    shell.set_defaults(run=_shell)

    kill = commands.add_parser("kill", help="release the applied job (scancel, ...)")
    kill.add_argument(
        "name", nargs="?", default=None,
        help="the context whose job to kill (default: the state file, i.e. the active one)",
    )  # fmt: skip
    kill.add_argument("--state", default=DEFAULT_STATE_PATH, help="the job state file")
    kill.set_defaults(run=_kill)

    context = commands.add_parser(
        "context", help="job contexts: several applied jobs in one directory, one active"
    )
    actions = context.add_subparsers(dest="context_cmd", metavar="ACTION")
    for action, text in (
        ("create", "make a context"),
        ("use", "make a context the active one (.regency/job_state.pkl points into it)"),
        ("rm", "remove a context, killing its job"),
    ):
        sub = actions.add_parser(action, help=text)
        sub.add_argument("name", help="the context's name")
        sub.set_defaults(run=_context, context_cmd=action)
    actions.add_parser("ls", help="list the contexts; * marks the active one").set_defaults(
        run=_context, context_cmd="ls"
    )
    context.set_defaults(run=_context, context_cmd=None)

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
    if args.script is not None and args.module is not None:
        raise CommandError("--script and -m exclude each other")
    if args.script is not None:
        try:
            if args.script == "-":
                text = sys.stdin.read()
            else:
                with open(args.script) as f:
                    text = f.read()
        except OSError as exc:
            raise CommandError(f"cannot read the script {args.script!r}: {exc}") from None
        cmd = ["bash", "-c", text, "regency-exec", *cmd]
    elif args.module is not None:
        cmd = ["-m", args.module, *cmd]
    if not cmd:
        raise CommandError(
            "give the command to run, e.g. regency exec -- hostname (or --script FILE, -m MODULE)"
        )
    per_host = _dims(args.per_host, "--per-host", one=True) if args.per_host else None
    point = _dims(args.point, "--point") if args.point else None
    env = _env_items(args.env)
    if args.all and args.mesh is not None:
        raise CommandError("--all and --mesh exclude each other")
    job = _load_state(args.state)
    meshes = job.state(cached_path=None).meshes
    if args.mesh is not None:
        if args.mesh not in meshes:
            raise CommandError(f"the job has no mesh {args.mesh!r} (meshes: {', '.join(meshes)})")
        targets = [meshes[args.mesh]]
    else:
        targets = list(meshes.values())
    if args.one:
        targets = [targets[0].slice(hosts=slice(0, 1))]
    elif point is not None:
        targets = targets[:1]
    worst = 0
    try:
        for hosts in targets:
            worst = max(
                worst, exec_command(hosts, cmd, env, args.workdir, per_host=per_host, point=point)
            )
    finally:
        if args.kill:
            job.kill()
            os.remove(os.path.realpath(args.state))
            print(f"killed the job in {args.state}")
    return worst


def _env_items(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"-e takes KEY=VALUE (got {item!r})")
        env[key] = value
    return env


def _shell(args: argparse.Namespace) -> int:
    from ._shell import shell

    env = _env_items(args.env)
    point = _dims(args.point, "--point") if args.point else {}
    job = _load_state(args.state)
    meshes = job.state(cached_path=None).meshes
    name = args.mesh if args.mesh is not None else next(iter(meshes))
    if name not in meshes:
        raise CommandError(f"the job has no mesh {name!r} (meshes: {', '.join(meshes)})")
    hosts = meshes[name]
    unknown = [d for d in point if d not in hosts._shape.labels]
    if unknown:
        raise CommandError(
            f"--point names dims {unknown} that mesh {name!r} does not have "
            f"(its dims: {list(hosts._shape.labels)})"
        )
    index = {d: slice(point.get(d, 0), point.get(d, 0) + 1) for d in hosts._shape.labels}
    try:
        one = hosts.slice(**index)
        code = shell(one, env=env or None, workdir=args.workdir)
    finally:
        if args.kill:
            job.kill()
            os.remove(os.path.realpath(args.state))
            print(f"killed the job in {args.state}")
    return code


def _dims(text: str, flag: str, *, one: bool = False) -> dict[str, int]:
    """``hosts=1,gpus=3`` as a dict (``one``: exactly one DIM=N)."""
    dims: dict[str, int] = {}
    for item in text.split(","):
        dim, sep, value = item.partition("=")
        dim, value = dim.strip(), value.strip()
        if not sep or not dim or not value.isdigit() or dim in dims:
            raise CommandError(f"{flag} takes DIM=N{'' if one else ',DIM=N'} (got {text!r})")
        dims[dim] = int(value)
    if one and len(dims) != 1:
        raise CommandError(f"{flag} takes one DIM=N (got {text!r})")
    if one and 0 in dims.values():
        raise CommandError(f"{flag}: N must be at least 1 (got {text!r})")
    return dims


def _kill(args: argparse.Namespace) -> int:
    state = args.state
    if args.name is not None:
        from ._current import _context_dir

        try:
            state = str(_context_dir(args.name) / "state.pkl")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    job = _load_state(state)
    job.kill()
    os.remove(os.path.realpath(state))
    print(f"killed the job in {state}")
    return 0


def _context(args: argparse.Namespace) -> int:
    from . import _current

    action = args.context_cmd
    if action is None:
        raise CommandError("give an action: regency context create|use|rm NAME, or ls")
    try:
        if action == "ls":
            contexts = _current.context_ls()
            if not contexts:
                print("No contexts.")
            for name, active in contexts:
                print(f"{'* ' if active else '  '}{name}")
        elif action == "create":
            _current.context_create(args.name)
            print(f"Created context '{args.name}'")
        elif action == "use":
            _current.context_use(args.name)
            print(f"Switched to context '{args.name}'")
        elif not _current.context_rm(args.name):
            raise CommandError(f"there is no context {args.name!r} (see: regency context ls)")
        else:
            print(f"Removed context '{args.name}'")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
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
