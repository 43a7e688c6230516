"""The GPU check's pipeline stage (`benchmarks/gpu_check.py`): the tests' tiny configuration
(`tests/pipeline_config/config.yaml`, the default DAG on a tiny random Llama, at temperature 0
with four decoders) run end to end through Snakemake with `--resources gpu=N`, so that every job
loads its models the way the pipeline does (`targetrows.hf.loading`) and claims GPUs through
`targetrows.pipeline.gpu_lock`.

Reports the jobs run, the wall time, the devices the decode jobs ran on (from their logs and
answers) and, on failure, the tail of Snakemake's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def snakemake_command() -> list[str]:
    """`snakemake` beside this Python if there is one, else `python -m snakemake`."""
    exe = Path(sys.executable).with_name("snakemake")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "snakemake"]


def run(work: Path, gpus: int, cores: int, timeout_s: float) -> dict:
    """Run the tiny pipeline in `work` (made here); {ok, seconds, jobs, output tail, ...}."""
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import save_tiny

    save_tiny(work / "models" / "tiny-llama", "llama", seed=0, n_layers=4)
    config = yaml.safe_load((REPO / "tests" / "pipeline_config" / "config.yaml").read_text())
    # one temperature and four decoders (rerank asks for two GPUs, fts for pearl's runs):
    # the whole DAG, in a minute or two where decode jobs take turns on one GPU
    config["temperatures"] = [0]
    config["decode"]["decoders"] = ["ar", "rerank", "fts", "pearl"]
    config["resources"] = {"gpus_per_job": max(gpus, 0)}
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    argv = [*snakemake_command(), "-s", str(REPO / "Snakefile"), "--directory", str(work),
            "--cores", str(cores), "--configfile", str(path), "--rerun-incomplete"]
    if gpus:
        argv += ["--resources", f"gpu={gpus}"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
        ok, out = proc.returncode == 0, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        ok, out = False, f"timed out after {timeout_s:.0f} s\n" + (
            (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(
                errors="replace"))
    seconds = time.perf_counter() - start
    done = [line for line in out.splitlines() if "steps" in line and "done" in line]
    devices = _decode_devices(work)
    return {"ok": ok, "seconds": seconds, "progress": done[-1].strip() if done else "",
            "devices": devices, "tail": "" if ok else out[-4000:], "command": argv}


def _decode_devices(work: Path) -> dict:
    """decode job -> the devices it ran on, from the command lines its log records."""
    found = {}
    for log in sorted((work / "results" / "logs" / "decode").rglob("*.log")):
        text = log.read_text(errors="replace")
        devices = sorted({word for line in text.splitlines() for word in line.split()
                          if word.startswith(("cuda", "cpu")) and len(word) <= 8})
        found[str(log.relative_to(work / "results" / "logs" / "decode"))] = devices
    return found


def markdown(rep: dict) -> str:
    lines = ["## The tiny pipeline through Snakemake", "",
             f"- command: `{' '.join(rep['command'][-8:])}`",
             f"- {'PASS' if rep['ok'] else 'FAIL'} in {rep['seconds']:.0f} s; {rep['progress']}"]
    if rep["devices"]:
        lines.append("- decode jobs and the devices their logs name: " + json.dumps(
            rep["devices"])[:1500])
    if rep["tail"]:
        lines += ["", "```", rep["tail"], "```"]
    return "\n".join(lines)
