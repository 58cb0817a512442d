"""A real SLURM cluster on this one host, started and stopped by the project itself (the `slurm` tests).

munged; MariaDB and slurmdbd (accounting, so `sacct` answers as on a real cluster); slurmctld; and two slurmd
as the nodes hnode1 and hnode2 of this host (their names in /etc/hosts while the cluster runs). Each node has
2 CPUs and a GPU GRES backed by device files that SLURM never opens, so `--gpus-per-node` is accepted and a job
sees CUDA_VISIBLE_DEVICES, as on a GPU cluster. Every file lives in one directory; every daemon is our child in
the foreground, recorded in DIR/daemons.json and stopped by its pid. No cgroups, no systemd: proctrack/linuxproc
and task/none. It needs root and Debian's packages, installed with apt-get where missing.

    python tests/slurm_cluster.py up DIR      # start it; prints the `export SLURM_CONF=...` to use it
    python tests/slurm_cluster.py down DIR    # cancel every job and stop every daemon

A guard process stops the cluster should the process that started it end without doing so (killed, say).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "mariadb-server")
COMMANDS = ("munged", "slurmctld", "slurmd", "slurmdbd", "sbatch", "mariadbd", "mariadb-install-db")
NODES = ("hnode1", "hnode2")
CPUS_PER_NODE, GPUS_PER_NODE, MEMORY_MB_PER_NODE = 2, 2, 4000
HOSTS_MARK = "# slurm test cluster"
# The requeue hold: SLURM keeps a requeued job pending until its credential expires (120 s by default).
CRED_EXPIRE_S = 10
# Jobs get this long between SIGTERM and SIGKILL, at the time limit or on scancel (SLURM's default is 30 s).
KILL_WAIT_S = 10
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


class ClusterUnavailable(RuntimeError):
    """SLURM cannot be had here (one line saying why): the tests that need it are skipped."""


class ClusterFailed(RuntimeError):
    """SLURM is here but its cluster did not come up: an error, not a skip."""


# --- packages ---------------------------------------------------------------------------------------------

def missing_commands() -> list[str]:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in COMMANDS if shutil.which(name, path=search) is None]


def install_packages() -> None:
    """Debian's packages, where a command is missing (package lists refreshed once if the install fails)."""
    if not missing_commands():
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"SLURM is not installed ({', '.join(missing_commands())} missing) and installing "
                                 "it needs root")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable("SLURM is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        out = subprocess.run(install, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise ClusterUnavailable(f"apt-get could not install {' '.join(PACKAGES)}: {last}")


# --- configuration ----------------------------------------------------------------------------------------

def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def slurm_conf(root: Path, ports: dict[str, int]) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeAddr=127.0.0.1 Port={ports[name]} CPUs={CPUS_PER_NODE} "
        f"RealMemory={MEMORY_MB_PER_NODE} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN" for name in NODES)
    return f"""\
ClusterName=harness
SlurmctldHost=localhost
SlurmctldPort={ports['slurmctld']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket,cred_expire={CRED_EXPIRE_S}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without a default, a job that asks for no memory is given the whole node
DefMemPerCPU=1000
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
ReturnToService=2
KillWait={KILL_WAIT_S}
OverTimeLimit=0
MessageTimeout=10
InactiveLimit=0
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={ports['slurmdbd']}
AccountingStoragePass={root}/munge.socket
GresTypes=gpu
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def slurmdbd_conf(root: Path, ports: dict[str, int]) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
DbdHost=localhost
DbdPort={ports['slurmdbd']}
SlurmUser=root
LogFile={root}/log/slurmdbd.log
PidFile={root}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports['mariadb']}
StorageUser=root
StorageLoc=slurm_acct
"""


def gpu_devices(root: Path) -> list[str]:
    """GPU GRES must name device files (a count alone leaves the node INVAL, plain files give no
    CUDA_VISIBLE_DEVICES): character devices with /dev/null's numbers, or the tty devices where mknod is refused."""
    paths = []
    for k in range(len(NODES) * GPUS_PER_NODE):
        path = root / "dev" / f"gpu{k}"
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except OSError:
            path = Path(f"/dev/tty{k}")
            if not path.exists():
                raise ClusterUnavailable("no device files to back the GPU GRES (mknod refused, no /dev/ttyN)")
        paths.append(str(path))
    return paths


def gres_conf(devices: list[str]) -> str:
    per_node = [devices[k * GPUS_PER_NODE:(k + 1) * GPUS_PER_NODE] for k in range(len(NODES))]
    return "".join(f"NodeName={name} Name=gpu File={','.join(files)}\n" for name, files in zip(NODES, per_node))


# --- the cluster ----------------------------------------------------------------------------------------

class Cluster:
    """The daemons of one test cluster, all files under `root`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}
        self.daemons: dict[str, psutil.Process] = {}

    # -- start

    def start(self, guarded: bool = True) -> "Cluster":
        """Start every daemon; `guarded`: stop them too once this process is gone."""
        install_packages()
        if os.geteuid() != 0:
            raise ClusterUnavailable("SLURM's daemons run as root here, and this is not root")
        for sub in ("state", "log", "dev", "mysql", *(f"spool/{name}" for name in NODES)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged wants its socket's directory searchable by all
        ports = dict(zip(("slurmctld", "slurmdbd", "mariadb", *NODES), free_ports(3 + len(NODES))))
        self._write_configs(ports)
        add_host_names(self.root)
        try:
            if guarded:
                self._guard()
            self._start_daemons(ports)
            self.wait_for_idle_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_configs(self, ports: dict[str, int]) -> None:
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (self.root / "slurm.conf").write_text(slurm_conf(self.root, ports))
        (self.root / "gres.conf").write_text(gres_conf(gpu_devices(self.root)))
        dbd = self.root / "slurmdbd.conf"  # slurmdbd reads it beside slurm.conf and wants it private
        dbd.write_text(slurmdbd_conf(self.root, ports))
        dbd.chmod(0o600)

    def _start_daemons(self, ports: dict[str, int]) -> None:
        root, conf = self.root, str(self.root / "slurm.conf")
        self._daemon("munged", ["munged", "-F", f"--key-file={root}/munge.key", f"--socket={root}/munge.socket",
                                f"--pid-file={root}/munged.pid", f"--log-file={root}/log/munged.log",
                                f"--seed-file={root}/munged.seed"])
        self._until(lambda: (root / "munge.socket").exists(), "munged's socket")
        self._run(["mariadb-install-db", "--no-defaults", f"--datadir={root}/mysql", "--user=root",
                   "--auth-root-authentication-method=normal", "--skip-test-db"])
        self._daemon("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={root}/mysql", "--user=root",
                                  "--bind-address=127.0.0.1", f"--port={ports['mariadb']}",
                                  f"--socket={root}/mysql.socket", f"--pid-file={root}/mysql.pid",
                                  "--skip-name-resolve", "--skip-log-bin"])
        self._until(lambda: port_open(ports["mariadb"]), "MariaDB's port")
        self.start_accounting()
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", conf])
        self._until(lambda: self.slurm(["scontrol", "ping"]).returncode == 0, "slurmctld to answer")
        for name in NODES:
            self._daemon(f"slurmd.{name}", ["slurmd", "-D", "-N", name, "-f", conf])

    def _guard(self) -> None:
        """A process that stops the cluster once this one is gone, however it ended."""
        owner = psutil.Process()
        self._daemon("guard", [sys.executable, str(Path(__file__).resolve()), "guard", str(self.root),
                               str(owner.pid), repr(owner.create_time())])

    def start_accounting(self) -> None:
        self._daemon("slurmdbd", ["slurmdbd", "-D"])
        self._until(lambda: port_open(int(self._conf_value("AccountingStoragePort"))), "slurmdbd's port")

    def stop_accounting(self) -> None:
        """slurmdbd down, as when a site's database is: `sacct` fails, the controller queues its records."""
        stop_process(self.daemons.pop("slurmdbd"))
        self._save_daemons()

    def wait_for_idle_nodes(self) -> None:
        def idle() -> bool:
            out = self.slurm(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split()
            return out[1::2] == ["idle"] * len(NODES)
        self._until(idle, "the nodes to be idle in sinfo")

    def _daemon(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.daemons[name] = psutil.Process(proc.pid)
        self._save_daemons()

    def _save_daemons(self) -> None:
        (self.root / "daemons.json").write_text(json.dumps(
            {name: [p.pid, p.create_time()] for name, p in self.daemons.items()}))

    def _until(self, ready, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [name for name, p in self.daemons.items() if not alive(p)]
            if dead:
                raise ClusterFailed(f"{dead[0]} exited while waiting for {what} (see {self.root}/log/)")
            if time.monotonic() > deadline:
                raise ClusterFailed(f"no {what} after {timeout_s:.0f} s (see {self.root}/log/)")
            time.sleep(0.2)

    def _run(self, cmd: list[str]) -> None:
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise ClusterFailed(f"{cmd[0]} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")

    def _conf_value(self, key: str) -> str:
        for line in (self.root / "slurm.conf").read_text().splitlines():
            if line.startswith(f"{key}="):
                return line.split("=", 1)[1]
        raise KeyError(key)

    # -- use

    def slurm(self, cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """A SLURM command against this cluster."""
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)

    # -- stop

    @classmethod
    def attach(cls, root: Path) -> "Cluster":
        """The cluster a `up` left running, from its daemons.json (pids checked against their start times)."""
        cluster = cls(root)
        for name, (pid, created) in json.loads((cluster.root / "daemons.json").read_text()).items():
            try:
                process = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
            if abs(process.create_time() - created) < 1:
                cluster.daemons[name] = process
        return cluster

    def cancel_all_jobs(self) -> None:
        """Cancel every job and wait (bounded) until the nodes have ended their steps."""
        jobs = self.slurm(["squeue", "-h", "-o", "%A"]).stdout.split()
        if jobs:
            self.slurm(["scancel", "--full", "--quiet", *jobs])
        deadline = time.monotonic() + STOP_TIMEOUT_S + KILL_WAIT_S
        while self.slurm(["squeue", "-h", "-o", "%A"]).stdout.split() and time.monotonic() < deadline:
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel every job, let the nodes end their steps, then stop the daemons by pid (nodes first)."""
        if "slurmctld" in self.daemons and alive(self.daemons["slurmctld"]):
            self.cancel_all_jobs()
        order = ["guard", *(n for n in self.daemons if n.startswith("slurmd.")), "slurmctld", "slurmdbd", "mariadbd",
                 "munged"]
        for name in order:
            if name in self.daemons:
                stop_process(self.daemons.pop(name))
        for process in self.strays():  # a job step that outlived its node's slurmd
            stop_process(process)
        self._save_daemons()
        remove_host_names(self.root)

    def strays(self) -> list[psutil.Process]:
        """Processes of this cluster still running: its jobs' (their environment names its slurm.conf and a job)
        and its slurmstepd (which write to its nodes' logs)."""
        mine = {psutil.Process().pid, *(p.pid for p in psutil.Process().parents())}
        return [process for process in psutil.process_iter() if process.pid not in mine and self._owns(process)]

    def _owns(self, process: psutil.Process) -> bool:
        try:
            env = process.environ()
            if env.get("SLURM_CONF") == self.env["SLURM_CONF"] and "SLURM_JOB_ID" in env:
                return True
            return any(Path(f.path).is_relative_to(self.root / "log") for f in process.open_files())
        except psutil.Error:
            return False


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_process(process: psutil.Process) -> None:
    """SIGTERM, then SIGKILL what is left after STOP_TIMEOUT_S; reaped if it is our child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            process.send_signal(sig)
            process.wait(STOP_TIMEOUT_S)
            return
        except psutil.TimeoutExpired:
            continue
        except psutil.Error:
            return


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def add_host_names(root: Path) -> None:
    """The nodes' names resolve to this host (the harness puts a rendezvous on the first one)."""
    hosts = Path("/etc/hosts")
    hosts.write_text(hosts.read_text().rstrip("\n") + f"\n127.0.0.1 {' '.join(NODES)} {HOSTS_MARK} {root}\n")


def remove_host_names(root: Path) -> None:
    hosts = Path("/etc/hosts")
    lines = hosts.read_text().splitlines(keepends=True)
    hosts.write_text("".join(line for line in lines if f"{HOSTS_MARK} {root}" not in line))  # in place: may be a mount


def guard(root: Path, owner_pid: int, owner_created: float) -> None:
    """Wait for the cluster's owner to end, then stop the cluster (unless the owner stopped it)."""
    try:
        owner = psutil.Process(owner_pid)
        while alive(owner) and abs(owner.create_time() - owner_created) < 1:
            time.sleep(1)
    except psutil.Error:
        pass
    cluster = Cluster.attach(root)
    cluster.daemons.pop("guard", None)
    cluster.stop()


def main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[0] == "guard":
        guard(Path(argv[1]), int(argv[2]), float(argv[3]))
        return
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        sys.exit("usage: python tests/slurm_cluster.py up|down DIR")
    root = Path(argv[1]).resolve()
    if argv[0] == "down":
        Cluster.attach(root).stop()
        return
    root.mkdir(parents=True, exist_ok=True)
    try:
        cluster = Cluster(root).start(guarded=False)  # `down` stops it
    except (ClusterUnavailable, ClusterFailed) as error:
        sys.exit(f"slurm cluster: {error}")
    print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}")


if __name__ == "__main__":
    main(sys.argv[1:])
