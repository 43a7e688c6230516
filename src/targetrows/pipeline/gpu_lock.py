"""Jobs claim free GPUs themselves: Snakemake's `gpu` resource counts GPUs but assigns no ids.

A job takes an exclusive `fcntl` lock on one file per GPU under a lock folder shared by every job
on the machine, runs its command with CUDA_VISIBLE_DEVICES set to the claimed GPUs, and releases
them when the command ends. The kernel drops the locks of a killed job, so a crash never leaves a
GPU claimed. Without GPUs the same command runs on the CPU.

Under SLURM the job uses the GPUs SLURM allocated to it and no others: CUDA_VISIBLE_DEVICES when
SLURM set it (gres with device confinement), else the ids in SLURM_STEP_GPUS / SLURM_JOB_GPUS;
a job without a GPU allocation runs on the CPU even if the node has GPUs. The lock folder gets the
job id appended, so jobs of different allocations never wait for each other.
"""

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence

from .placement import Placement


def _ids(value: str) -> list[str]:
    """'0,1' -> ['0', '1']; "-1" (or any negative id) hides every GPU from CUDA, ids after it too."""
    visible = []
    for x in (x.strip() for x in value.split(",")):
        if not x:
            continue
        if x.startswith("-") or x.lower() == "nodevfiles":
            break
        visible.append(x)
    return visible


def has_nvidia_driver() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidiactl")


def slurm_gpus(env: Mapping[str, str], driver: bool | None = None, log=sys.stderr) -> list[str]:
    """The GPUs SLURM allocated to this job (none for a job without a GPU allocation). A node
    without an NVIDIA driver (gres backed by other files, as on a test cluster) runs on the CPU."""
    for key in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if key in env:
            ids = _ids(env[key])
            break
    else:
        if int(env.get("SLURM_GPUS_ON_NODE", "0") or 0) > 0:
            print(f"SLURM allocated {env['SLURM_GPUS_ON_NODE']} GPU(s) but named none "
                  "(no CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS or SLURM_JOB_GPUS; gres without "
                  "device files?): running on the CPU", file=log)
        return []
    if ids and not (has_nvidia_driver() if driver is None else driver):
        print(f"SLURM allocated GPU(s) {','.join(ids)} ({key}) but this node has no NVIDIA driver "
              "(no nvidia-smi, no /dev/nvidiactl): running on the CPU", file=log)
        return []
    return ids


def visible_gpus(env: Mapping[str, str] = os.environ, log=sys.stderr) -> list[str]:
    """GPU ids this process may use: SLURM's allocation inside a SLURM job, else
    CUDA_VISIBLE_DEVICES when set, else nvidia-smi's list."""
    if env.get("SLURM_JOB_ID"):
        return slurm_gpus(env, log=log)
    if "CUDA_VISIBLE_DEVICES" in env:
        return _ids(env["CUDA_VISIBLE_DEVICES"])
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []  # a driver that does not answer: run on the CPU rather than fail
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def lock_folder(lock_dir: str | None, env: Mapping[str, str] = os.environ) -> str:
    base = lock_dir or os.path.join(tempfile.gettempdir(), f"targetrows-gpu-locks-{os.getuid()}")
    if env.get("SLURM_JOB_ID"):
        base = os.path.join(base, f"slurm-{env['SLURM_JOB_ID']}")
    return base


def _try_lock(path: str) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def claim(
    n: int,
    lock_dir: str | None = None,
    gpus: Sequence[str] | None = None,
    poll_s: float = 2.0,
    timeout_s: float | None = None,
    log=sys.stderr,
) -> Iterator[list[str]]:
    """Hold `n` free GPUs (fewer if the machine has fewer) while the block runs; yields their
    ids, or [] on a machine without GPUs. Waits while other jobs hold them; all-or-nothing, so
    two jobs that each want two GPUs never deadlock on one each."""
    gpus = visible_gpus(log=log) if gpus is None else list(gpus)
    want = min(n, len(gpus))
    if want == 0:
        yield []
        return
    folder = lock_folder(lock_dir)
    os.makedirs(folder, exist_ok=True)
    start = time.monotonic()
    waited = False
    while True:
        held: dict[str, int] = {}
        for gpu in gpus:
            safe = re.sub(r"[^A-Za-z0-9_-]", "_", gpu)
            fd = _try_lock(os.path.join(folder, f"gpu-{safe}.lock"))
            if fd is not None:
                held[gpu] = fd
                if len(held) == want:
                    break
        if len(held) == want:
            break
        for fd in held.values():
            os.close(fd)  # closing drops the lock
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(
                f"no {want} free GPU(s) among {gpus} within {timeout_s:.0f} s (locks in {folder}); "
                "lower --resources gpu= to the number of GPUs so Snakemake queues the jobs"
            )
        if not waited:
            print(f"waiting for {want} free GPU(s) among {gpus} (locks in {folder})", file=log)
            waited = True
        time.sleep(poll_s)
    try:
        print(f"claimed GPU(s) {', '.join(held)}", file=log)
        yield list(held)
    finally:
        for fd in held.values():
            os.close(fd)


def device_env(claimed: Sequence[str], placement: Placement | None = None,
               env: Mapping[str, str] = os.environ):
    """(environment, target device, draft device) for a command on the claimed GPUs, placed as
    `placement` says (default: the target on the first GPU, the draft on the second when there
    is one). CUDA numbers the claimed GPUs from 0 in the order given, and in PCI bus order like
    nvidia-smi (its own default puts the fastest first, which can differ from the ids claimed)."""
    env = dict(env)
    if not claimed:
        env["CUDA_VISIBLE_DEVICES"] = ""  # never let torch pick a GPU another job claimed
        return env, "cpu", "cpu"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(claimed)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    target, draft = (placement or Placement(1, True)).devices(len(claimed))
    return env, target, draft


def run_claimed(command, n_gpus: int, log_path: str, lock_dir: str | None = None,
                placement: Placement | None = None) -> int:
    """Claim GPUs, then run `command(target_device, draft_device) -> argv` with its output
    appended to `log_path`; returns the exit status."""
    with open(log_path, "a") as log:
        with claim(n_gpus, lock_dir, log=log) as gpus:
            env, target_device, draft_device = device_env(gpus, placement)
            argv = command(target_device, draft_device)
            print("$ " + " ".join(argv), file=log, flush=True)
            return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env).returncode


def run_job(smk, command, what: str, fresh_log: bool = True) -> None:
    """A Snakemake job's `targetrows` command (`command(target_device, draft_device) -> argv`)
    on the GPUs its placement asks for (`smk.params.placement`, `smk.resources.gpu`), its
    output in the job's log (emptied first unless `fresh_log` is False); exits naming the log
    when the command fails."""
    if fresh_log:
        open(smk.log[0], "w").close()
    rc = run_claimed(command, smk.resources.gpu, smk.log[0], smk.params.lock_dir or None,
                     smk.params.placement)
    if rc:
        sys.exit(f"targetrows {what} failed with status {rc}; see {smk.log[0]}")
