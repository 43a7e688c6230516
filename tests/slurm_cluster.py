"""A single-node SLURM cluster on this machine, for the tests (tests/test_slurm.py) and CI.

Debian's slurm-wlm (22.05) with munge; with `accounting=True` also slurmdbd on a private MariaDB
so `sacct` answers. Everything lives in one folder (configs, state, logs, the database) and the
daemons listen on their own ports, so the cluster neither reads nor changes /etc/slurm. The node
advertises fake GPUs (gres backed by empty files) and more memory than the machine has
(`SlurmdParameters=config_overrides`), like a GPU node of a real cluster. Needs root.

    python tests/slurm_cluster.py start DIR [--accounting]   # prints `export SLURM_CONF=...`
    python tests/slurm_cluster.py stop DIR
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "squeue", "sacct", "munged", "slurmdbd", "mariadbd"]
MUNGE_SOCKET = "/run/munge/munge.socket.2"
PORTS = {"slurmctld": 16817, "slurmd": 16818, "slurmdbd": 16819, "mariadb": 16820}


def missing() -> str | None:
    """Why this machine cannot run the cluster, or None when it can."""
    if os.geteuid() != 0:
        return "the SLURM cluster needs root (munged, slurmd)"
    absent = [b for b in BINARIES if shutil.which(b, path=os.environ.get("PATH", "") +
                                                  ":/usr/sbin:/sbin") is None]
    if absent:
        return (f"{', '.join(absent)} not installed: apt-get install {' '.join(PACKAGES)} "
                "(.ci/run does)")
    return None


def _bin(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


def _run(*argv, check=True, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([_bin(argv[0]), *map(str, argv[1:])], capture_output=True, text=True,
                          check=check, env=env, timeout=timeout)


def _wait(what: str, ok, timeout_s: float = 60, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.3)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s\n{tail}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _munge_ok() -> bool:
    munge = subprocess.run([_bin("munge"), "-n"], capture_output=True)
    if munge.returncode:
        return False
    return subprocess.run([_bin("unmunge")], input=munge.stdout, capture_output=True).returncode == 0


def start_munge(folder: Path) -> bool:
    """munged as user munge on its standard socket; returns whether this call started it."""
    if _munge_ok():
        return False
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        _run("mungekey", "--create", "--keyfile", key) if shutil.which("mungekey") else \
            key.write_bytes(os.urandom(1024))
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    _run("runuser", "-u", "munge", "--", _bin("munged"))
    _wait("munged", _munge_ok, 20)
    (folder / "munged.started").write_text("")
    return True


def slurm_conf(folder: Path, accounting: bool, gpus: int, cpus: int, mem_mb: int) -> str:
    host = socket.gethostname().split(".")[0]
    account = (
        f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
        f"AccountingStoragePort={PORTS['slurmdbd']}\n"
        if accounting else "AccountingStorageType=accounting_storage/none\n"
    )
    return f"""ClusterName=targetrows
SlurmctldHost={host}
SlurmctldPort={PORTS['slurmctld']}
SlurmdPort={PORTS['slurmd']}
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=2
SlurmdParameters=config_overrides
SlurmctldParameters=enable_configless
GresTypes=gpu
{account}NodeName={host} CPUs={cpus} RealMemory={mem_mb} Gres=gpu:{gpus} State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def start_mariadb(folder: Path) -> None:
    data = folder / "mysql"
    if not data.exists():
        _run("mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db", timeout=120)
    log = folder / "mariadb.log"
    subprocess.Popen([_bin("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=root",
                      f"--socket={folder}/mysql.sock", f"--port={PORTS['mariadb']}",
                      "--bind-address=127.0.0.1", f"--pid-file={folder}/mariadb.pid",
                      "--skip-grant-tables", f"--log-error={log}"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _wait("MariaDB", lambda: _port_open(PORTS["mariadb"]), 60, log)


def start_slurmdbd(folder: Path) -> None:
    conf = folder / "slurmdbd.conf"  # found next to SLURM_CONF (slurmdbd has no -f)
    conf.write_text(f"""AuthType=auth/munge
DbdHost=localhost
DbdPort={PORTS['slurmdbd']}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={PORTS['mariadb']}
StorageUser=root
StorageLoc=slurm_acct_db
LogFile={folder}/slurmdbd.log
PidFile={folder}/slurmdbd.pid
""")
    conf.chmod(0o600)
    _run("slurmdbd", env=env(folder))
    _wait("slurmdbd", lambda: _port_open(PORTS["slurmdbd"]), 60, folder / "slurmdbd.log")


def env(folder: Path) -> dict[str, str]:
    """os.environ plus SLURM_CONF pointing at this cluster's configuration."""
    return dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"))


def start(folder: Path, accounting: bool, gpus: int = 4, cpus: int = 4,
          mem_mb: int = 256_000) -> dict[str, str]:
    """Start the cluster's daemons; returns the environment for its clients (SLURM_CONF)."""
    folder = Path(folder).resolve()
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    start_munge(folder)
    fake = [folder / f"fake-gpu{i}" for i in range(gpus)]
    for f in fake:
        f.touch()
    host = socket.gethostname().split(".")[0]
    (folder / "gres.conf").write_text(
        "".join(f"NodeName={host} Name=gpu File={f}\n" for f in fake))
    (folder / "slurm.conf").write_text(slurm_conf(folder, accounting, gpus, cpus, mem_mb))
    e = env(folder)
    if accounting:
        start_mariadb(folder)
        start_slurmdbd(folder)
    _run("slurmctld", "-i", env=e)  # -i: ignore state from an earlier cluster in this folder
    _wait("slurmctld", lambda: _run("scontrol", "ping", check=False, env=e).returncode == 0, 60,
          folder / "slurmctld.log")
    # configless, as on many clusters: slurmd fetches the configuration from slurmctld and
    # caches it in /run/slurm/conf, where commands in jobs find it (the SLURM executor's job
    # step drops SLURM_CONF from the environment of the rule it runs)
    _run("slurmd", "--conf-server", f"localhost:{PORTS['slurmctld']}", env=e)

    def node_idle():
        out = _run("sinfo", "-h", "-o", "%T", check=False, env=e).stdout
        return out.strip() in ("idle", "mixed", "allocated")

    _wait("slurmd (node idle)", node_idle, 60, folder / "slurmd.log")
    if accounting:
        _wait("accounting (sacct)",
              lambda: _run("sacct", "-n", "-X", check=False, env=e).returncode == 0, 60,
              folder / "slurmdbd.log")
    return e


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, e.g. MariaDB, our child until reaped, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def _kill_pidfile(path: Path, timeout_s: float = 30) -> None:
    if not path.exists():
        return
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 15)
    except (ValueError, IndexError, ProcessLookupError):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.2)
    os.kill(pid, 9)


def stop(folder: Path) -> None:
    """scancel, `scontrol shutdown`, then slurmdbd, MariaDB and munged (if started here)."""
    folder = Path(folder).resolve()
    e = env(folder)
    if (folder / "slurm.conf").exists():
        _run("scancel", "--full", "--user", "root", check=False, env=e)
        _run("scontrol", "shutdown", check=False, env=e)
        for name in ("slurmctld", "slurmd"):
            _kill_pidfile(folder / f"{name}.pid")  # returns at once when shutdown stopped it
    _kill_pidfile(folder / "slurmdbd.pid")
    _kill_pidfile(folder / "mariadb.pid")
    cached = Path("/run/slurm/conf/slurm.conf")  # slurmd's configless cache of this cluster
    if cached.exists() and str(folder) in cached.read_text():
        shutil.rmtree(cached.parent, ignore_errors=True)
    if (folder / "munged.started").exists():
        _run("runuser", "-u", "munge", "--", _bin("munged"), "--stop", check=False)
        (folder / "munged.started").unlink()


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    if what == "start":
        start(where, accounting="--accounting" in sys.argv)
        print(f"export SLURM_CONF={where.resolve() / 'slurm.conf'}")
    elif what == "stop":
        stop(where)
    else:
        sys.exit(__doc__)
