"""A real SLURM cluster for tests: private munged, slurmctld and slurmd(s).

``slurm_cluster()`` installs Debian's ``slurmctld slurmd slurm-client munge`` when they are
missing and we are root (else it raises :class:`SlurmUnavailable` with the reason, which
tests turn into a skip), writes a slurm.conf into a fresh directory (no systemd, no cgroups,
no accounting; this machine's CPU topology), starts the daemons, waits for the node to be
idle, runs one warm-up job (slurmctld applies ``batch_sched_delay=0`` only from its first
scheduling pass on), and on exit cancels every job and stops every daemon it started.
Clients (sbatch, squeue, srun, scancel) need ``SLURM_CONF``: see :attr:`SlurmCluster.env`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import attrs

from ._netns import VirtualHost

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
_BINARIES = {
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
    "slurm-client": "/usr/bin/sbatch",
    "munge": "/usr/sbin/munged",
}


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here; the message says why."""


def ensure_installed(timeout: float = 600) -> None:
    """Install the SLURM packages with apt when missing (root only)."""
    missing = [pkg for pkg, path in _BINARIES.items() if not os.access(path, os.X_OK)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"SLURM is not installed ({', '.join(missing)} missing) and installing it needs "
            f"root: apt install {' '.join(PACKAGES)}"
        )
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"SLURM is not installed and there is no apt-get to install {missing}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + timeout
    for cmd in (
        ["apt-get", "-o", "DPkg::Lock::Timeout=120", "update", "-qq"],
        [
            "apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "-qq",
            "--no-install-recommends", *PACKAGES,
        ],
    ):
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{' '.join(cmd)} did not finish within {timeout} s") from None
        if done.returncode != 0:
            raise SlurmUnavailable(
                f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )


def _two_free_ports() -> tuple[int, int]:
    with socket.socket() as a, socket.socket() as b:
        a.bind(("", 0))
        b.bind(("", 0))
        return int(a.getsockname()[1]), int(b.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _hardware() -> dict[str, str]:
    """``slurmd -C``'s node line as a dict: the topology slurmd will report."""
    out = subprocess.run(
        [_BINARIES["slurmd"], "-C"], capture_output=True, text=True, timeout=30
    ).stdout
    line = out.splitlines()[0] if out else ""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


@attrs.define
class SlurmCluster:
    """A running cluster."""

    directory: str
    nodes: list[str]  #: node names, in slurm.conf order
    conf: str
    _daemons: dict[str, subprocess.Popen[bytes]] = attrs.field(factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs in its environment."""
        return {"SLURM_CONF": self.conf}

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(
            list(cmd), env={**os.environ, **self.env}, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def job_ids(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i").stdout
        return out.split()

    def log(self, name: str) -> str:
        try:
            with open(os.path.join(self.directory, "log", f"{name}.log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        ctld = self._daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            ids = self.job_ids()
            if ids:
                self.run("scancel", *ids)
                deadline = time.monotonic() + 10
                while self.job_ids() and time.monotonic() < deadline:
                    time.sleep(0.1)
        for group in (tuple(n for n in self._daemons if n.startswith("slurm")), ("munged",)):
            procs = [self._daemons.pop(n) for n in group if n in self._daemons]
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        # Job steps of ours that outlived slurmd (they end on their own, but make sure).
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() != "slurmstepd":
                        continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark not in f.read().split(b"\0"):
                        continue
                os.kill(int(entry), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue


def _write_conf(
    directory: str, ctld: str, ctld_addr: str, nodes: list[tuple[str, str]], ctld_port: int,
    slurmd_port: int,
) -> str:  # fmt: skip
    hw = _hardware()
    cpus = hw.get("CPUs", str(os.cpu_count() or 1))
    topology = " ".join(
        f"{k}={hw[k]}"
        for k in ("Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
        if k in hw
    )
    memory = max(256, int(hw.get("RealMemory", "1024")) * 9 // 10)
    conf = os.path.join(directory, "slurm.conf")
    with open(conf, "w") as f:
        f.write(
            f"""ClusterName=regencytest
SlurmctldHost={ctld}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={directory}/munge/munge.socket.2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
LaunchType=launch/slurm
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
MessageTimeout=10
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=300
StateSaveLocation={directory}/state
SlurmdSpoolDir={directory}/spool/%n
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd-%n.pid
SlurmctldLogFile={directory}/log/slurmctld.log
SlurmdLogFile={directory}/log/slurmd-%n.log
"""
        )
        for name, addr in nodes:
            f.write(
                f"NodeName={name} NodeAddr={addr} CPUs={cpus} {topology} "
                f"RealMemory={memory} State=UNKNOWN\n"
            )
        f.write(
            f"PartitionName=debug Nodes={','.join(n for n, _ in nodes)} Default=YES "
            "MaxTime=INFINITE State=UP OverSubscribe=NO\n"
        )
    return conf


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies (even by SIGKILL), so a
    killed test run leaves no daemons behind."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(cluster: SlurmCluster, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
    with open(os.path.join(cluster.directory, "log", f"{name}.out"), "ab") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **cluster.env}, preexec_fn=_die_with_parent,
        )  # fmt: skip
    cluster._daemons[name] = proc
    return proc


def _wait(what: str, cluster: SlurmCluster, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for name, proc in cluster._daemons.items():
            if proc.poll() is not None:
                raise SlurmUnavailable(
                    f"{name} exited with {proc.returncode} while waiting for {what}: "
                    f"{cluster.log(name)[-1500:]}"
                )
        if time.monotonic() > deadline:
            raise SlurmUnavailable(
                f"{what} did not happen within {timeout} s; slurmctld log: "
                f"{cluster.log('slurmctld')[-1500:]}"
            )
        time.sleep(0.02)


@contextmanager
def slurm_cluster(
    hosts: Sequence[VirtualHost] | None = None, timeout: float = 60
) -> Iterator[SlurmCluster]:
    """Install (when needed), start, yield, stop. Raises :class:`SlurmUnavailable`.

    Without ``hosts``: one node, this machine, named by its host name (here a name that may
    resolve only to 127.0.0.1). With ``hosts`` (from ``virtual_hosts``): one node per
    network namespace, each with its own slurmd, named by its IP (so that its name resolves
    everywhere without touching /etc/hosts); slurmctld listens on the bridge.
    """
    if not os.path.isdir("/proc") or os.uname().sysname != "Linux":
        raise SlurmUnavailable("the SLURM test cluster needs Linux")
    if os.geteuid() != 0:
        raise SlurmUnavailable("the SLURM test cluster runs slurmd as root (we are not root)")
    ensure_installed()
    # Short: munge's socket and slurmstepd's sockets live under it (sun_path < 108 bytes).
    directory = tempfile.mkdtemp(prefix="rslurm-", dir="/tmp")
    for sub in ("spool", "state", "log", "munge"):
        os.makedirs(os.path.join(directory, sub))
    os.chmod(os.path.join(directory, "munge"), 0o711)  # munged wants o+x on its socket dir
    here = socket.gethostname().split(".")[0]
    if hosts:
        nodes = [(host.ip, host.ip) for host in hosts]
        ctld_addr = hosts[0].ip.rsplit(".", 1)[0] + ".1"  # this namespace, on the bridge
        namespaces = {host.ip: host.name for host in hosts}
    else:
        nodes = [(here, "127.0.0.1")]
        ctld_addr = "127.0.0.1"
        namespaces = {}
    ctld_port, slurmd_port = _two_free_ports()
    conf = _write_conf(directory, here, ctld_addr, nodes, ctld_port, slurmd_port)
    cluster = SlurmCluster(directory, [name for name, _ in nodes], conf)
    try:
        key = os.path.join(directory, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        munge = os.path.join(directory, "munge")
        _start(cluster, "munged", [
            _BINARIES["munge"], "-F", "--force", f"--key-file={key}",
            f"--socket={munge}/munge.socket.2", f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed", f"--log-file={directory}/log/munged.log",
            "--num-threads=2",
        ])  # fmt: skip
        _wait("munged's socket", cluster, lambda: os.path.exists(f"{munge}/munge.socket.2"), timeout)
        _start(cluster, "slurmctld", [_BINARIES["slurmctld"], "-D", "-i", "-f", conf])
        # slurmd (and clients) that find slurmctld's port closed back off for a second.
        _wait("slurmctld's port", cluster, lambda: _listening(ctld_port), timeout)
        for name, _ in nodes:
            os.makedirs(os.path.join(directory, "spool", name))
            # nsenter, not `ip netns exec`: that remounts /sys, where slurmd wants the cgroup fs.
            prefix = (
                ["nsenter", f"--net=/run/netns/{namespaces[name]}"] if name in namespaces else []
            )
            _start(
                cluster, f"slurmd-{name}",
                [*prefix, _BINARIES["slurmd"], "-D", "-N", name, "-f", conf],
            )  # fmt: skip

        def idle() -> bool:
            out = cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
            return out == ["idle"] * len(nodes)

        _wait("the node to be idle", cluster, idle, timeout)
        warm = cluster.run("sbatch", "--parsable", "-J", "warmup", "-o", "/dev/null", "--wrap", "true")
        if warm.returncode != 0:
            raise SlurmUnavailable(f"sbatch failed: {warm.stderr.strip()}")
        job = warm.stdout.strip().split(";")[0]

        def warmed() -> bool:
            out = cluster.run("scontrol", "show", "job", job).stdout
            return "JobState=COMPLETED" in out

        _wait("the warm-up job", cluster, warmed, timeout)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
