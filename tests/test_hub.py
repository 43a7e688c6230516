"""Hub downloads and dataset preparation against a hub-compatible server on this machine
(tests/hub_server.py, reached through HF_ENDPOINT), with the real huggingface_hub and datasets
code: a model download and its faults (gated, unknown, 5xx, a cut connection, the token kept out
of logs), the seven paper datasets, and the paper configuration end to end on tiny models.

Downloads run in a subprocess, as in a Snakemake job: huggingface_hub reads HF_ENDPOINT when it
is first imported.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from needs import need_module, needs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from hub_server import Hub
from snakemake_env import SNAKEMAKE, snakemake_env

need_module("huggingface_hub")
need_module("datasets")

TOKEN = "hf_TestTokenThatMustNeverBeLogged0123"


def hub_env(endpoint: str, home: Path, **extra: str) -> dict[str, str]:
    """A child's environment: online, but only to the test server (every proxy dead)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_OFFLINE="0",
               HF_DATASETS_OFFLINE="0", HTTP_PROXY="http://127.0.0.1:9",
               HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost",
               HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.update(extra)
    return env


def download(endpoint: str, home: Path, repo: str, out: Path, tries: int = 4,
             gated: bool = False, **extra: str) -> subprocess.CompletedProcess:
    code = ("import sys; from targetrows.fetch.hub import download; "
            f"download({repo!r}, 'main', {str(out)!r}, gated={gated}, tries={tries}, "
            "backoff_s=0.05)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=hub_env(endpoint, home, **extra), timeout=300)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    from hub_repos import model_files
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("model")
    save_tiny(folder / "m", "qwen2", seed=0, n_layers=1)
    return model_files(folder / "m")


@pytest.fixture
def hub(tiny_repo):
    hub = Hub()
    hub.add("model", "Qwen/Qwen3-0.6B", tiny_repo)
    hub.add("model", "meta-llama/Llama-3.2-1B-Instruct", tiny_repo)
    hub.gated["meta-llama/Llama-3.2-1B-Instruct"] = TOKEN
    server, url = hub.start()
    hub.url = url
    yield hub
    server.shutdown()


def same_files(out: Path, files: dict[str, bytes]) -> bool:
    got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    return got == files


def test_download_fetches_the_whole_snapshot(hub, tiny_repo, tmp_path):
    out = tmp_path / "models" / "Qwen3-0.6B"
    proc = download(hub.url, tmp_path / "hf", "Qwen/Qwen3-0.6B", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_files(out, tiny_repo)
    assert sorted(os.listdir(out.parent)) == ["Qwen3-0.6B"]  # no .partial left behind


def test_gated_repo_needs_the_token_which_is_never_logged(hub, tiny_repo, tmp_path):
    repo = "meta-llama/Llama-3.2-1B-Instruct"
    out = tmp_path / "models" / "Llama-3.2-1B-Instruct"
    proc = download(hub.url, tmp_path / "hf", repo, out, gated=True)
    assert proc.returncode != 0
    assert "gated repository" in proc.stderr and "HF_TOKEN is not set" in proc.stderr
    assert "attempt" not in proc.stderr  # refused access is not retried
    assert not out.exists()

    wrong = "hf_WrongTokenAlsoNeverLogged456"
    proc = download(hub.url, tmp_path / "hf", repo, out, gated=True, HF_TOKEN=wrong)
    assert proc.returncode != 0 and "HF_TOKEN is set" in proc.stderr
    assert wrong not in proc.stdout + proc.stderr
    assert not out.exists()

    proc = download(hub.url, tmp_path / "hf", repo, out, gated=True, HF_TOKEN=TOKEN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_files(out, tiny_repo)
    assert TOKEN not in proc.stdout + proc.stderr
    assert ("GET", f"/api/models/{repo}/revision/main", f"Bearer {TOKEN}") in hub.requests


def test_unknown_repo_is_named(hub, tmp_path):
    out = tmp_path / "models" / "x"
    proc = download(hub.url, tmp_path / "hf", "Qwen/Qwen9-Nope", out)
    assert proc.returncode != 0
    assert "Qwen/Qwen9-Nope was not found on " + hub.url in proc.stderr
    assert "attempt" not in proc.stderr and not out.exists()


def test_server_errors_are_retried(hub, tiny_repo, tmp_path):
    hub.fail_next["Qwen/Qwen3-0.6B"] = 2
    out = tmp_path / "models" / "Qwen3-0.6B"
    proc = download(hub.url, tmp_path / "hf", "Qwen/Qwen3-0.6B", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_files(out, tiny_repo)
    assert hub.fail_next["Qwen/Qwen3-0.6B"] == 0  # both 503s were served
    hub.fail_next["Qwen/Qwen3-0.6B"] = 100  # the hub stays down: fails after `tries`
    out2 = tmp_path / "models" / "again"
    proc = download(hub.url, tmp_path / "hf2", "Qwen/Qwen3-0.6B", out2, tries=2)
    assert proc.returncode != 0 and "attempt 1/2 failed" in proc.stderr
    assert not out2.exists()


def test_cut_download_leaves_no_folder_and_a_rerun_completes(hub, tiny_repo, tmp_path):
    weights = "model.safetensors"
    size = len(tiny_repo[weights])
    # every GET of the weights in the first run is cut short (the client's own resumes too)
    hub.cut_next[("Qwen/Qwen3-0.6B", weights)] = [size // 3] * 50
    out = tmp_path / "models" / "Qwen3-0.6B"
    proc = download(hub.url, tmp_path / "hf", "Qwen/Qwen3-0.6B", out, tries=1)
    assert proc.returncode != 0, "the cut download did not fail"
    assert not out.exists()
    assert (tmp_path / "models" / "Qwen3-0.6B.partial").exists()  # kept for the rerun
    hub.cut_next.clear()
    proc = download(hub.url, tmp_path / "hf", "Qwen/Qwen3-0.6B", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_files(out, tiny_repo)
    assert sorted(os.listdir(out.parent)) == ["Qwen3-0.6B"]


# -- datasets and the pipeline ------------------------------------------------------------------


@pytest.fixture(scope="module")
def paper_hub(tmp_path_factory):
    """The paper's seven datasets and tiny stand-ins for its Llama pair: the target (gated, as on
    the hub) and its EAGLE-3 head (a pickle .bin only, as the published one)."""
    from hub_repos import dataset_repos, model_files
    from tiny_heads import save_tiny_head
    from tiny_models import save_tiny, tiny_model

    hub = Hub()
    for repo, files in dataset_repos().items():
        hub.add("dataset", repo, files)
    folder = tmp_path_factory.mktemp("pair")
    target = save_tiny(folder / "target", "llama", seed=0, n_layers=4)
    head = save_tiny_head(folder / "head", tiny_model("llama", n_layers=4).config, safe=False)
    hub.add("model", "meta-llama/Llama-3.1-8B-Instruct", model_files(Path(target)))
    hub.gated["meta-llama/Llama-3.1-8B-Instruct"] = TOKEN
    hub.add("model", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", model_files(Path(head)))
    server, url = hub.start()
    hub.url = url
    yield hub
    server.shutdown()


def snakemake(work: Path, hub: Hub, *args: str, configs=(), timeout: int = 900):
    """The paper configuration (with `configs` over it) against the test server."""
    env = snakemake_env(**hub_env(hub.url, work / "hf", HF_TOKEN=TOKEN))
    env["HF_HUB_OFFLINE"] = "0"
    return subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(work),
                           *args, "--configfile", str(REPO / "config" / "paper.yaml"),
                           *map(str, configs)],
                          capture_output=True, text=True, env=env, timeout=timeout)


@needs(SNAKEMAKE is None, "snakemake is not installed")
def test_paper_datasets_become_spec_bench_prompts(paper_hub, tmp_path):
    from targetrows.fetch.datasets import SOURCES

    work = tmp_path / "run"
    targets = [f"resources/prompts/{task}.jsonl" for task in SOURCES]
    override = tmp_path / "n3.yaml"
    override.write_text("prompts: {n: 3}\n")  # 3 of each split's 5 rows: a seeded sample
    proc = snakemake(work, paper_hub, *targets, "--cores", "2", configs=[override])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for task, src in SOURCES.items():
        records = [json.loads(line) for line in (work / f"resources/prompts/{task}.jsonl")
                   .read_text().splitlines()]
        assert len(records) == 3, task
        assert all(r["category"] == task for r in records)
        assert all(len(r["turns"]) == (2 if task == "mt_bench" else 1) for r in records)
        ids = [r["question_id"] for r in records]
        assert ids == sorted(ids) and len(set(ids)) == 3
        if task != "mt_bench":
            assert all(src.id_base <= i < src.id_base + 5 for i in ids)
    wmt = json.loads((work / "resources/prompts/wmt14_de_en.jsonl").read_text().splitlines()[0])
    assert wmt["turns"][0].endswith(f"Das ist Satz {wmt['question_id'] - 600_000}.")
    mt = json.loads((work / "resources/prompts/mt_bench.jsonl").read_text().splitlines()[0])
    assert mt["question_id"] >= 81 and mt["turns"][1] == "Now make it rhyme."


def load_split(hub: Hub, home: Path, task: str) -> subprocess.CompletedProcess:
    code = ("from targetrows.fetch.datasets import SOURCES, load_split; "
            f"print(len(load_split(SOURCES[{task!r}], backoff_s=0.05)))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=hub_env(hub.url, home), timeout=300)


def test_dataset_faults_are_retried_or_named(paper_hub, tmp_path):
    paper_hub.fail_next["openai/gsm8k"] = 2
    proc = load_split(paper_hub, tmp_path / "hf", "gsm8k")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "5" and paper_hub.fail_next["openai/gsm8k"] == 0
    files = paper_hub.repos.pop(("dataset", "wmt/wmt14"))
    try:
        proc = load_split(paper_hub, tmp_path / "hf2", "wmt14_de_en")
    finally:
        paper_hub.repos[("dataset", "wmt/wmt14")] = files
    assert proc.returncode != 0
    assert f"dataset wmt/wmt14 (de-en / test): wmt/wmt14 was not found on {paper_hub.url}" in \
        proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
@needs(SNAKEMAKE is None, "snakemake is not installed")
def test_paper_config_on_tiny_models_end_to_end(paper_hub, tmp_path):
    work = tmp_path / "run"
    override = REPO / "tests" / "hub_config" / "paper_tiny.yaml"
    start = time.monotonic()
    proc = snakemake(work, paper_hub, "--cores", "2", configs=[override])
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    cfg = yaml.safe_load(override.read_text())
    models = work / "resources" / "models"
    assert (models / "Llama-3.1-8B-Instruct" / "model.safetensors").exists()
    assert (models / "EAGLE3-Llama-3.1-8B-Instruct" / "pytorch_model.bin").exists()
    answers = list((work / "results" / "decode").rglob("*.jsonl"))
    assert len(answers) == len(cfg["tasks"]) * len(cfg["temperatures"]) * len(
        cfg["decode"]["decoders"])
    for name in ("expected_accepted", "online", "relative_gains"):
        assert (work / "results" / "tables" / f"{name}.csv").stat().st_size > 0
    logs = [p for p in (work / "results" / "logs").rglob("*") if p.is_file()]
    logs += list((work / ".snakemake" / "log").glob("*.log"))
    assert logs and not [p for p in logs if TOKEN in p.read_text(errors="replace")]
    assert TOKEN not in proc.stdout + proc.stderr
    print(f"paper config on tiny models, download -> tables: {elapsed:.0f} s")


def test_an_eagle3_head_loads_by_hub_id_and_decodes_exactly(tmp_path):
    """`load_pair(target id, head id)` through the hub: the head is recognised from its
    config.json, checked against the target and bound to it; every decoder then reproduces
    greedy decoding. Both models are fetched from the test server."""
    from hub_repos import model_files
    from tiny_heads import save_tiny_head
    from tiny_models import save_tiny, tiny_model

    save_tiny(tmp_path / "target", "llama", seed=0, n_layers=4)
    save_tiny_head(tmp_path / "head", tiny_model("llama", n_layers=4).config, safe=False)
    hub = Hub()
    hub.add("model", "org/tiny-target", model_files(tmp_path / "target"))
    hub.add("model", "org/tiny-target-eagle3", model_files(tmp_path / "head"))
    server, url = hub.start()
    code = (
        "from targetrows.core.pool import PoolShape\n"
        "from targetrows.decoding.config import DecodeConfig\n"
        "from targetrows.decoding.loop import generate\n"
        "from targetrows.decoding.registry import decoder_names\n"
        "from targetrows.hf.eagle3 import Eagle3Draft\n"
        "from targetrows.hf.loading import load_pair\n"
        "target, draft, tok = load_pair('org/tiny-target', 'org/tiny-target-eagle3',\n"
        "                               dtype='float32')\n"
        "assert isinstance(draft, Eagle3Draft)\n"
        "ids = tok('hello there', add_special_tokens=False)['input_ids']\n"
        "ar = generate(target, None, ids, DecodeConfig('ar', max_new_tokens=12)).tokens\n"
        "for name in decoder_names(learned=False)[1:]:  # (no reranker here)\n"
        "    cfg = DecodeConfig(name, budget=6, max_new_tokens=12, pool=PoolShape(top_k=3, depth=3))\n"
        "    assert generate(target, draft, ids, cfg).tokens == ar, name\n"
        "print('ok', len(ar))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=hub_env(url, tmp_path / "home"), timeout=300)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok 12")
