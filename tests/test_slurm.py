"""Cluster runs: what jobs ask for (config key `resources`), which GPUs a SLURM job uses, and
the SLURM profile on a real single-node SLURM 22.05 cluster (tests/slurm_cluster.py): the tiny
DAG of tests/pipeline_config/ run as docs/cluster.md tells users, once on a cluster without
accounting (`--slurm-status-command squeue`), where decode jobs are cancelled mid-run with
`scancel` and resume from OUT.partial, and once with slurmdbd (the plugin's `sacct` default),
for the answers of three decoders; both runs write the same answers.

The cluster tests need root and Debian's slurm packages (.ci/run installs them); they are
skipped otherwise, except under CI=true, where they fail.
"""

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from needs import needs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import slurm_cluster
from snakemake_env import SNAKEMAKE, snakemake_env

IN_CI = os.environ.get("CI") == "true"  # there the cluster must run: a skip would hide it
needs_snakemake = needs(SNAKEMAKE is None, "snakemake is not installed")

CONFIG = REPO / "tests" / "pipeline_config" / "config.yaml"
# the DAG on the cluster: the test configuration cut to one task and one temperature (about
# half the jobs); every rule and decoder still runs as a SLURM job, in each of the two runs
# fixed budgets only: an auto pick follows this machine's timings, and the two runs (with and
# without accounting) must write the same answers
SMALL_DAG = ("temperatures: [0]\ntasks: [gsm8k]\n"
             "decode: {budgets: [8, 3], decoder_budgets: {fts: [8, 3, {matched: 8}]}}\n")
# with accounting, the answers of three decoders (no tree, the head's tree, a draft-free tree),
# their decode jobs' wall times worked out from the part-times job: 7 jobs, not the DAG's 26
# (the run without accounting runs them all); each job costs seconds of imports alone
SACCT_DECODERS = ("ar", "pearl", "racer")
PROFILE = REPO / "workflow" / "profiles" / "slurm"
RESULTS: dict[str, Path] = {}  # accounting or not -> the run's working directory


# -- without a cluster --------------------------------------------------------------------------


def test_slurm_jobs_use_the_gpus_slurm_allocated():
    from targetrows.pipeline.gpu_lock import slurm_gpus, visible_gpus

    job = {"SLURM_JOB_ID": "7"}
    # confined by SLURM (renumbered): those; else SLURM's physical ids; never nvidia-smi's list
    assert slurm_gpus({**job, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "4,5"},
                      driver=True) == ["0", "1"]
    assert slurm_gpus({**job, "SLURM_STEP_GPUS": "3", "SLURM_JOB_GPUS": "2,3"},
                      driver=True) == ["3"]
    assert slurm_gpus({**job, "SLURM_JOB_GPUS": "2,3"}, driver=True) == ["2", "3"]
    assert slurm_gpus(job, driver=True) == []  # no GPU allocation: the CPU
    log = io.StringIO()
    assert slurm_gpus({**job, "SLURM_GPUS_ON_NODE": "1"}, driver=True, log=log) == []
    assert "named none" in log.getvalue()
    log = io.StringIO()
    assert slurm_gpus({**job, "SLURM_JOB_GPUS": "0"}, driver=False, log=log) == []
    assert "no NVIDIA driver" in log.getvalue()
    # outside SLURM: CUDA_VISIBLE_DEVICES as before; inside, a job without GPUs gets none
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_gpus(job) == []


def dry_run_resources(work: Path, override: str, *args: str) -> dict[str, set[str]]:
    """rule -> the distinct `resources:` lines of its jobs in a dry run of the tiny DAG."""
    (work / "over.yaml").write_text(override)
    proc = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(work),
                           "-n", *args, "--configfile", str(CONFIG), str(work / "over.yaml")],
                          capture_output=True, text=True, env=snakemake_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out: dict[str, set[str]] = {}
    rule = None
    for line in proc.stdout.splitlines():
        if line.startswith("rule "):
            rule = line[5:].rstrip(":")
        elif line.strip().startswith("resources:") and rule:
            out.setdefault(rule, set()).add(line.strip())
    return out


@needs_snakemake
def test_job_resources_come_from_the_config_and_scale_with_the_models(tmp_path):
    work = tmp_path / "run"
    (work / "models" / "tiny-llama").mkdir(parents=True)
    with open(work / "models" / "tiny-llama" / "model.safetensors", "wb") as f:
        f.truncate(1024 * 2**20)  # a sparse 1 GiB of "weights"
    res = dry_run_resources(work, "resources: {draft_own_gpu: true}")
    assert {r.count("gpu=2") for r in res["decode"]} == {0, 1}  # 2 for rerank/fts/pearl, else 1
    res = dry_run_resources(work, "{}")
    assert all("gpu=1" in r for r in res["decode"])  # the pair shares one card by default
    assert all("gpu=1" in r and "mem_mb=4048" in r and "runtime=1920" in r
               for r in res["record_rows"])  # 2000 MB + 2 x 1 GiB of weights
    # a decode job's wall time is worked out once its pair's part times are measured
    assert all("mem_mb=4048" in r and "runtime=<TBD>" in r for r in res["decode"])
    assert all("gpu=1" in r and "mem_mb=4048" in r and "runtime=30" in r
               for r in res["part_times"])
    # the replies are made on the target's card, the head trains on one; the replies job holds
    # a batch's cache
    assert all("gpu=1" in r and "mem_mb=8048" in r for r in res["target_replies"])
    assert all("gpu=1" in r and "mem_mb=4048" in r for r in res["train_eagle3"])
    res = dry_run_resources(work, "resources: {gpus_per_job: 0, mem_mb: {decode: 3000}, "
                                  "runtime: {decode: 7}}")
    assert all("gpu=0" in r and "mem_mb=3000" in r and "runtime=7" in r for r in res["decode"])
    assert "part_times" not in res  # a fixed wall time needs no timing
    for rule in ("record_rows", "target_replies", "train_eagle3"):  # a CPU-only cluster
        assert all("gpu=0" in r for r in res[rule]), rule
    res = dry_run_resources(work, "resources: {gpus_per_job: 1}")
    assert all("gpu=1" in r for r in res["decode"])
    # under the SLURM profile, command-line resources add to the config's instead of replacing
    res = dry_run_resources(work, "{}", "--workflow-profile", str(PROFILE), "--set-resources",
                            "decode:gpu=0", "--default-resources", "slurm_account=lab")
    assert all("gpu=0" in r and "runtime=<TBD>" in r and "mem_mb=4048" in r and
               "slurm_account=lab" in r for r in res["decode"])
    assert all("gpu=1" in r and "runtime=1920" in r for r in res["record_rows"])


@needs_snakemake
def test_a_decode_jobs_memory_grows_with_its_batch_size(tmp_path):
    """Each sequence of a batch holds its own caches: a decode job of decode.batch_size 4 asks
    for 3 more sequences' worth than one of batch size 1 (a fixed wall time: sized by the
    target's context window, nothing timed)."""
    import json
    import re

    work = tmp_path / "run"
    (work / "models" / "tiny-llama").mkdir(parents=True)
    spec = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "hidden_size": 64, "max_position_embeddings": 4096}
    (work / "models" / "tiny-llama" / "config.json").write_text(json.dumps(spec))
    # per position 2 x 2 layers x 2 heads x 16 x 4 bytes (auto on the host: float32), twice
    # the window for the buffer's doubling: 4 MB a sequence
    per_sequence = 2 * 4096 * (2 * 2 * 2 * 16 * 4) / 2**20
    asked = {}
    for n in (1, 4):
        res = dry_run_resources(work, f"resources: {{runtime: {{decode: 7}}}}\n"
                                      f"decode: {{batch_size: {n}}}\n")
        asked[n] = {int(re.search(r"mem_mb=(\d+)", r)[1]) for r in res["decode"]}
    # the draft-free decoders load the target alone; the others wait for the head's training
    assert max(asked[4]) == int(2000 + 4 * per_sequence)
    assert max(asked[1]) == int(2000 + per_sequence)


# -- on a SLURM cluster -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[False, True], ids=["squeue", "sacct"])
def cluster(request, tmp_path_factory):
    if slurm_cluster.missing():
        pytest.fail(f"CI=true but {slurm_cluster.missing()}")
    folder = tmp_path_factory.mktemp("slurm")
    try:
        env = slurm_cluster.start(folder, accounting=request.param)
    except Exception:
        slurm_cluster.stop(folder)
        raise
    yield request.param, env
    slurm_cluster.stop(folder)


def workdir(tmp_path: Path) -> Path:
    from tiny_models import save_tiny

    work = tmp_path / "run"
    save_tiny(work / "models" / "tiny-llama", "llama", seed=0, n_layers=4)
    return work


def dag_config() -> dict:
    cfg, small = yaml.safe_load(CONFIG.read_text()), yaml.safe_load(SMALL_DAG)
    return {**cfg, **small, "decode": {**cfg["decode"], **small["decode"]}}


def snakemake_slurm(work: Path, env: dict, *extra: str, config: str = "",
                    targets: tuple[str, ...] = ()) -> subprocess.Popen:
    """The command of config/README.md "On a cluster", on the test configuration (and
    `config`, YAML, over it), for `targets` (the whole DAG by default); Snakemake checks
    the jobs at a steady interval (tests/slurm_steady_polling.py)."""
    (work / "small_dag.yaml").write_text(SMALL_DAG + config)
    argv = [sys.executable, str(REPO / "tests" / "slurm_steady_polling.py"), *targets,
            "-s", str(REPO / "Snakefile"), "--directory", str(work),
            "--workflow-profile", str(PROFILE), "--configfile", str(CONFIG),
            str(work / "small_dag.yaml"), *extra]
    full_env = snakemake_env(SLURM_CONF=env["SLURM_CONF"])
    log = open(work / "snakemake.log", "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True)


def squeue(env: dict) -> list[tuple[str, str, str]]:
    """(job id, state, comment) of every job in the queue."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True,
                         env=env).stdout
    return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]


def answers(path: Path) -> dict:
    """(question, budget) -> the tokens and turns of each answer (timings differ by run)."""
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out[(r["question_id"], r["budget"])] = (r["token_ids"], r["choices"][0]["turns"],
                                                r["choices"][0]["accept_lengths"])
    return out


def check_finished(work: Path, proc: subprocess.Popen, tables: bool = True) -> None:
    log = (work / "snakemake.log").read_text()
    assert proc.returncode == 0, log[-6000:]
    assert "steps (100%) done" in log
    assert not [p for p in (work / "results").rglob("*") if p.name.endswith((".tmp", ".partial"))]
    if not tables:  # (a run for some answers only)
        return
    for name in ("expected_accepted", "relative_gains", "online"):
        assert (work / "results" / "tables" / f"{name}.csv").stat().st_size > 0
    assert (work / "results" / "figures" / "online.png").stat().st_size > 1000


def cancel_mid_decode(work: Path, env: dict, proc: subprocess.Popen,
                      cancelled: dict[Path, list[str]], want: int = 2) -> None:
    """Cancel decode jobs (scancel, as an admin or a preemption would) right after they wrote
    their first answers to OUT.partial, until `want` were caught so; the profile's retry then
    resubmits them. A job's answers take a fraction of a second, so the SLURM ids are looked up
    ahead (a thread polls squeue) and the answer files are watched every 20 ms."""
    cfg = dag_config()
    jobs: dict[str, str] = {}  # squeue comment -> id of the running job
    done = threading.Event()

    def poll_squeue():
        while not done.is_set():
            jobs.update({c: j for j, state, c in squeue(env) if state == "RUNNING"})
            time.sleep(0.3)

    threading.Thread(target=poll_squeue, daemon=True).start()
    decode = work / "results" / "decode" / "tiny-llama"
    watched = {  # answers file -> the comment the SLURM executor gives its job
        decode / task / f"T{t}" / f"{d}.jsonl": f"rule_decode_wildcards_tiny-llama_{t}_{d}"
        for task in cfg["tasks"] for t in cfg["temperatures"] for d in cfg["decode"]["decoders"]
    }
    deadline = time.monotonic() + 900
    try:
        while proc.poll() is None and len(cancelled) < want and time.monotonic() < deadline:
            for out, tag in watched.items():
                partial = out.with_name(out.name + ".partial")
                if out in cancelled or tag not in jobs or not partial.exists() or \
                        partial.stat().st_size == 0:
                    continue
                subprocess.run(["scancel", jobs[tag]], env=env, check=True)
                while any(j == jobs[tag] for j, _, _ in squeue(env)):
                    time.sleep(0.1)
                if partial.exists() and not out.exists():  # else it finished before the signal
                    cancelled[out] = partial.read_text().splitlines()
                del jobs[tag]
            time.sleep(0.02)
    finally:
        done.set()


@pytest.mark.slow
@needs(SNAKEMAKE is None, "snakemake is not installed")
@pytest.mark.skipif(slurm_cluster.missing() is not None and not IN_CI,
                    reason=str(slurm_cluster.missing()))
def test_tiny_dag_on_slurm(cluster, tmp_path):
    accounting, env = cluster
    work = workdir(tmp_path)
    cfg = dag_config()
    # the documented command; status checks start sooner than the plugin's 40 s default
    extra = ["--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks",
             "3"] + ([] if accounting else ["--slurm-status-command", "squeue"])
    # with accounting, decode jobs ask for wall times worked out from a part-times job; without,
    # for a fixed one (the answers are the same either way)
    fixed = "" if accounting else "resources: {runtime: {decode: 20}}\n"
    decoders = SACCT_DECODERS if accounting else cfg["decode"]["decoders"]
    targets = tuple(f"results/conditions/tiny-llama/T{t}/{d}.json"
                    for t in cfg["temperatures"] for d in decoders) if accounting else ()
    proc = snakemake_slurm(work, env, *extra, config=fixed, targets=targets)
    cancelled: dict[Path, list[str]] = {}  # answers file -> .partial lines when its job died
    if not accounting:  # (with sacct, plugin 2.8.0 waits forever for a job scancel ended:
        cancel_mid_decode(work, env, proc, cancelled)  # docs/cluster.md, "Restarting")
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        pass
    if proc.poll() is None:
        proc.kill()
        pytest.fail("the SLURM run did not finish in 15 minutes: "
                    + (work / "snakemake.log").read_text()[-4000:])
    check_finished(work, proc, tables=not accounting)
    n_decode = len(cfg["tasks"]) * len(cfg["temperatures"]) * len(decoders)
    assert len(list((work / "results" / "decode").rglob("*.jsonl"))) == n_decode

    # every job ran on the CPU, saying why: the fake GPUs are not devices SLURM can name
    decode_log = (work / "results" / "logs" / "decode" / "tiny-llama" / "T0" /
                  "pearl.log").read_text()
    assert "running on the CPU" in decode_log and "--target-device cpu" in decode_log

    if accounting:  # the plugin's default status command (sacct), answered by slurmdbd
        sacct = subprocess.run(["sacct", "-X", "-n", "-o", "JobID,State"], capture_output=True,
                               text=True, env=env, check=True).stdout
        assert sacct.count("COMPLETED") >= len(cfg["temperatures"]) * len(
            decoders), sacct  # one decode job per temperature and decoder
        # SLURM's time limits: the part-times job's 30 minutes, and the decode jobs' worked
        # out from its measurement (the tiny pair's bound is far below the 10-minute floor)
        limits = subprocess.run(["sacct", "-X", "-n", "-o", "Timelimit"], capture_output=True,
                                text=True, env=env, check=True).stdout.split()
        assert "00:30:00" in limits and "00:10:00" in limits, limits
    else:
        assert cancelled, "no decode job was caught mid-run"
        assert "SLURM status is: 'CANCELLED'" in (work / "snakemake.log").read_text()
        for out, kept in cancelled.items():
            final = {json.dumps([r["question_id"], r["budget"]]): r
                     for r in map(json.loads, out.read_text().splitlines())}
            for line in kept:  # the resumed job kept these answers: same timings, same tokens
                r = json.loads(line)
                assert final[json.dumps([r["question_id"], r["budget"]])] == r
    RESULTS["sacct" if accounting else "squeue"] = work
    if len(RESULTS) == 2:  # the interrupted run wrote what the uninterrupted one did
        paths = list((RESULTS["sacct"] / "results" / "decode").rglob("*.jsonl"))
        assert len(paths) == len(SACCT_DECODERS) * len(cfg["temperatures"]), paths
        for path in paths:
            other = RESULTS["squeue"] / path.relative_to(RESULTS["sacct"])
            assert answers(path) == answers(other), path
