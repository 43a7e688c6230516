"""The Snakemake pipeline: lint, the paper's plan, config validation, the job helpers, and the
whole default DAG end to end on tiny random-weight models (tests/pipeline_config/)."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from needs import need_module, needs

from targetrows.pipeline.conditions import read_conditions

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
sys.path.insert(0, str(SCRIPTS))
from snakemake_env import SNAKEMAKE, snakemake_env

pytestmark = needs(SNAKEMAKE is None, "snakemake is not installed (pip install -e .[pipeline])")


def snakemake(*args, cwd, timeout=600, check=False, env=None):
    """Run snakemake on the repository's Snakefile in working directory `cwd`; offline, and with
    any attempt to reach the network through a proxy failing at once."""
    full_env = snakemake_env(HF_DATASETS_OFFLINE="1", HTTP_PROXY="http://127.0.0.1:9",
                             HTTPS_PROXY="http://127.0.0.1:9")
    full_env.update(env or {})
    proc = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(cwd),
                           *args], capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-5000:]}\n"
                             f"{proc.stderr[-5000:]}")
    return proc


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run."""
    block = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}


def job_priorities(output: str) -> dict[str, int]:
    """Each planned job's priority in a dry run's listing ("rule" or "decode <decoder>"; the
    highest where one name has several jobs)."""
    found: dict[str, int] = {}
    for block in re.split(r"^\[", output, flags=re.M):  # each job's listing starts "[date]"
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        if rule is None:
            continue
        decoder = re.search(r"decoder=(\w+)", block)
        name = rule[1] + (f" {decoder[1]}" if decoder else "")
        level = re.search(r"^\s+priority: (\d+)", block, re.M)
        found[name] = max(found.get(name, 0), int(level[1]) if level else 0)
    return found


def default_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def planned_jobs(output: str) -> list[dict]:
    """Each job a dry run lists: its rule, wildcards, inputs and resources (key -> value)."""
    jobs = []
    for block in re.split(r"^\[", output, flags=re.M):  # each job's listing starts "[date]"
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        if rule is None:
            continue

        field = {name: value.split(", ") for name, value in
                 re.findall(r"^\s+(wildcards|input|resources): (.*)$", block, re.M)}
        jobs.append({"rule": rule[1],
                     "wildcards": dict(w.split("=", 1) for w in field.get("wildcards", [])),
                     "input": field.get("input", []),
                     "resources": dict(r.split("=", 1) for r in field.get("resources", []))})
    return jobs


def pair_decoders(cfg: dict) -> dict[str, list[str]]:
    """pair name -> the decoders it runs, as the pipeline reads config key `pairs`."""
    return {p.get("name", p["target"]): p.get("decoders", cfg["decode"]["decoders"])
            for p in cfg["pairs"]}


# -- the workflow as a whole --------------------------------------------------------------------


def test_lint_reports_nothing(tmp_path):
    proc = snakemake("--lint", "--configfile", str(REPO / "config" / "config.yaml"),
                     cwd=tmp_path, check=True)
    out = proc.stdout + proc.stderr
    assert "Congratulations, your workflow is in a good condition!" in out
    assert "Lints for" not in out


PAPER = REPO / "config" / "paper.yaml"
HEAD_SOURCES = ("eagle3", "train_eagle3")
SPEED_DECODERS = {"rerank", "fts", "pearl"}  # a root pass beside drafting: the draft's own card


@pytest.fixture(scope="module")
def paper_plan(tmp_path_factory) -> str:
    """The dry run of config/paper.yaml (its listing of every planned job)."""
    work = tmp_path_factory.mktemp("paper")
    return snakemake("-n", "--configfile", str(PAPER), cwd=work, check=True).stdout


def test_paper_config_plans_one_decode_job_per_pair_temperature_and_decoder(paper_plan):
    counts = job_counts(paper_plan)
    paper = yaml.safe_load(PAPER.read_text())
    decoders = pair_decoders(paper)
    assert len(decoders) == 8  # six head pairs, two standalone speed pairs
    assert counts["decode"] == 2 * sum(len(d) for d in decoders.values())
    assert counts["record_rows"] == 8 * 2 and counts["score"] == 8 * 7 * 2
    # six targets, three published EAGLE-3 heads, two standalone drafts
    assert counts["download_model"] == 11
    assert counts["prepare_prompts"] == 7
    assert counts["tables"] == counts["figures"] == 1
    trained = sorted(n for n, m in paper["models"].items() if m["source"] == "train_eagle3")
    assert counts["train_eagle3"] == counts["target_replies"] == len(trained) == 3
    jobs = planned_jobs(paper_plan)
    assert sorted(j["wildcards"]["model"] for j in jobs if j["rule"] == "train_eagle3") == trained

    # every target is drafted by an EAGLE-3 head: each of its head pair's decode jobs that uses a
    # draft reads the head's folder, and no other draft
    models = paper["models"]
    heads = {p["target"]: p["draft"] for p in paper["pairs"] if "name" not in p}
    assert len(heads) == 6 and all(models[h]["source"] in HEAD_SOURCES for h in heads.values())
    assert all(models[h]["target"] == t for t, h in heads.items())
    for job in (j for j in jobs if j["rule"] == "decode"):
        pair, decoder = job["wildcards"]["pair"], job["wildcards"]["decoder"]
        assert decoder in decoders[pair]
        read = {f.removeprefix("resources/models/") for f in job["input"]
                if f.startswith("resources/models/")}
        if pair in heads:
            assert read <= {pair, heads[pair]}, job
            assert (heads[pair] in read) == (decoder not in ("ar", "racer", "recycle")), job

    # the standalone speed pairs: the draft on a card of its own for the decoders with a root
    # pass, beside the target for ar and draft_rank
    speed = {p["name"]: p for p in paper["pairs"] if "name" in p}
    assert {p["target"] for p in speed.values()} == {"Qwen3-8B", "Llama-3.1-8B-Instruct"}
    asked = {(j["wildcards"]["pair"], j["wildcards"]["decoder"]): j["resources"]["gpu"]
             for j in jobs if j["rule"] == "decode" and j["wildcards"]["pair"] in speed}
    assert set(asked) == {(n, d) for n in speed for d in ("ar", "draft_rank", *SPEED_DECODERS)}
    assert all(gpu == ("2" if d in SPEED_DECODERS else "1") for (_, d), gpu in asked.items())
    standalone = {j["wildcards"]["pair"]: j["input"] for j in jobs if j["rule"] == "record_rows"}
    assert all(f"resources/models/{p['draft']}" in standalone[n] for n, p in speed.items())


def job_gpus(output: str) -> dict[tuple[str, str], set[int]]:
    """(rule, pair or model) -> the GPU counts its planned jobs ask for, from a dry run's
    listing."""
    found: dict[tuple[str, str], set[int]] = {}
    for job in planned_jobs(output):
        if "gpu" in job["resources"]:
            w = job["wildcards"]
            name = w.get("pair") or w.get("target") or w["model"]
            found.setdefault((job["rule"], name), set()).add(int(job["resources"]["gpu"]))
    return found


def speed_job(rule: str, name: str) -> bool:
    """A standalone pair's decode job (whose decoders with a root pass ask for two GPUs)."""
    return rule == "decode" and name.endswith("-standalone")


def test_the_paper_plan_spreads_a_target_that_does_not_fit_one_card(tmp_path, paper_plan):
    """Qwen2.5-32B in bfloat16 (61 GiB) asks for two 48 GB cards, or one 80 GB card, for its
    decode, row, replies and drift jobs; every other pair fits one card, the draft beside its
    target (but for the standalone pairs' drafts with a root pass); a head trains on one card;
    a cap below the target's need is refused."""
    paper = str(PAPER)
    gpus = job_gpus(paper_plan)
    for rule in ("decode", "record_rows", "part_times", "drift", "target_replies"):
        assert gpus[(rule, "Qwen2.5-32B-Instruct")] == {2}, rule
    assert gpus[("train_eagle3", "EAGLE3-Qwen2.5-32B-Instruct")] == {1}
    assert {n for (rule, name), ns in gpus.items()
            if "32B-Instruct" not in name and not speed_job(rule, name) for n in ns} == {1}

    def with_resources(resources: dict) -> str:
        extra = tmp_path / "resources.yaml"
        extra.write_text(yaml.safe_dump({"resources": resources}))
        return str(extra)

    big = snakemake("-n", "--configfile", paper, with_resources({"gpu_memory_gb": 80}),
                    cwd=tmp_path, check=True).stdout
    big_gpus = job_gpus(big)
    assert {n for (rule, name), ns in big_gpus.items() if not speed_job(rule, name)
            for n in ns} == {1}
    assert {n for (rule, name), ns in big_gpus.items() if speed_job(rule, name)
            for n in ns} == {1, 2}
    capped = snakemake("-n", "--configfile", paper, with_resources({"gpus_per_job": 1}),
                       cwd=tmp_path)
    assert capped.returncode != 0
    assert "config key resources.gpus_per_job: Qwen2.5-32B-Instruct needs 2 GPUs" in (
        capped.stdout + capped.stderr)


def test_default_config_plans_the_embedded_pair(tmp_path):
    proc = snakemake("-n", "--configfile", str(REPO / "config" / "config.yaml"), cwd=tmp_path,
                     check=True)
    counts = job_counts(proc.stdout)
    assert counts["build_target"] == counts["target_replies"] == counts["train_eagle3"] == 1
    assert "download_model" not in counts and "distill_draft" not in counts
    assert counts["decode"] == 2 * len(default_config()["decode"]["decoders"])
    # scheduling on 2 cores: the two-thread agreement job outweighs any two others, so it starts
    # when the head is trained and both cores are free; pearl before the fts runs that wait for
    # it; the longest decode jobs first
    priority = job_priorities(proc.stdout)
    assert priority["draft_agreement"] > 2 * max(p for job, p in priority.items()
                                                 if job != "draft_agreement")
    assert (priority["decode pearl"] > priority["decode fts"] > priority["decode draft_rank"]
            > priority["decode ar"])


def test_the_distilled_draft_is_the_default_configs_other_option(tmp_path):
    cfg = default_config()
    cfg["pairs"][0]["draft"] = "smollm2-135m-draft"
    config = tmp_path / "distilled.yaml"
    config.write_text(yaml.safe_dump(cfg))
    counts = job_counts(snakemake("-n", "--configfile", str(config), cwd=tmp_path,
                                  check=True).stdout)
    assert counts["build_target"] == counts["target_replies"] == counts["distill_draft"] == 1
    assert "train_eagle3" not in counts
    assert counts["decode"] == 2 * len(cfg["decode"]["decoders"])


def test_one_target_in_two_named_pairs_writes_separate_results(tmp_path):
    """A head pair and a named standalone pair on the same target: both validate, each pair's
    jobs write under its own name (the head pair under its target's, as before), each runs its
    own decoders, the standalone pair's drafts get their own card, and the target's replies are
    made once for both trainings."""
    cfg = default_config()
    target = cfg["pairs"][0]["target"]
    speed = ["ar", "draft_rank", "fts", "pearl"]
    cfg["pairs"].append({"name": "smollm2-standalone", "target": target,
                         "draft": "smollm2-135m-draft", "decoders": speed, "draft_own_gpu": True})
    config = tmp_path / "two_pairs.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = snakemake("-n", "--configfile", str(config), cwd=tmp_path, check=True).stdout
    counts = job_counts(out)
    assert counts["decode"] == 2 * (len(cfg["decode"]["decoders"]) + len(speed))
    assert counts["record_rows"] == 2 * 2 and counts["part_times"] == counts["drift"] == 2
    assert counts["target_replies"] == counts["train_eagle3"] == counts["distill_draft"] == 1
    jobs = planned_jobs(out)
    decoded = {(j["wildcards"]["pair"], j["wildcards"]["decoder"]) for j in jobs
               if j["rule"] == "decode"}
    assert {d for p, d in decoded if p == "smollm2-standalone"} == set(speed)
    assert {d for p, d in decoded if p == target} == set(cfg["decode"]["decoders"])
    assert "results/decode/smollm2-standalone/gsm8k/T0/fts.jsonl" in out
    assert f"results/decode/{target}/gsm8k/T0/fts.jsonl" in out
    assert "results/rows/smollm2-standalone/gsm8k/T0.npz" in out
    assert f"results/rows/{target}/gsm8k/T0.npz" in out
    assert "results/drift/smollm2-standalone.csv" in out and f"results/drift/{target}.csv" in out
    rows = {j["wildcards"]["pair"]: j["input"] for j in jobs if j["rule"] == "record_rows"}
    assert "resources/models/smollm2-135m-draft" in rows["smollm2-standalone"]
    assert "resources/models/smollm2-135m-eagle3" in rows[target]
    gpus = {(j["wildcards"]["pair"], j["wildcards"]["decoder"]): j["resources"]["gpu"]
            for j in jobs if j["rule"] == "decode"}
    assert {d for (p, d), n in gpus.items() if n == "2"} == {"fts", "pearl"}
    assert all(p == "smollm2-standalone" for (p, d), n in gpus.items() if n == "2")


def test_a_local_eagle3_head_is_planned_as_the_draft(tmp_path):
    cfg = default_config()
    head = tmp_path / "head"
    head.mkdir()
    cfg["models"]["local-head"] = {"source": "eagle3", "path": str(head),
                                   "target": "smollm2-135m-instruct"}
    cfg["pairs"][0]["draft"] = "local-head"
    config = tmp_path / "head.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = snakemake("-n", "--configfile", str(config), cwd=tmp_path, check=True)
    counts = job_counts(proc.stdout)
    assert "distill_draft" not in counts and "train_eagle3" not in counts
    assert "target_replies" not in counts and counts["build_target"] == 1
    assert counts["decode"] == 2 * len(cfg["decode"]["decoders"])
    assert str(head) in proc.stdout  # the decode jobs read the head's folder


def _mutate(cfg, path, value):
    *parents, last = path
    for key in parents:
        cfg = cfg[key]
    cfg[last] = value


@pytest.mark.parametrize("path, value, expected", [
    (("decode", "decoders"), ["ar", "beam"],
     r"config key decode\.decoders\[1\]: 'beam' is not one of"),
    (("tasks",), ["gsm8k", "trivia"], r"config key tasks\[1\]: 'trivia' is not one of"),
    (("pairs",), [{"target": "missing-model", "draft": "smollm2-135m-draft"}],
     r"config key pairs\[0\]\.target: model 'missing-model' is not defined"),
    (("models", "smollm2-135m-draft", "source"), "ftp",
     r"config key models\.smollm2-135m-draft\.source: 'ftp' is not one of"),
    (("decode", "budgets"), [0], r"config key decode\.budgets\[0\]: 0 is less than the minimum"),
    (("score", "budgets"), [2, 0], r"config key score\.budgets\[1\]: 0 is less than the minimum"),
    (("decode", "decoder_budgets", "fts"), [0],
     r"config key decode\.decoder_budgets\.fts\[0\]: 0 is less than the minimum"),
    (("decode", "decoder_budgets", "beam"), [8],
     r"config key decode\.decoder_budgets: 'beam' is not one of"),
    (("pairs",), [{"target": "../escape", "draft": "smollm2-135m-draft"}],
     r"config key pairs\[0\]\.target: '\.\./escape' does not match"),
    (("models", "smollm2-135m-draft"),
     {"source": "eagle3", "repo": "owner/head", "target": "smollm2-135m-draft"},
     r"config key models\.smollm2-135m-draft\.target: 'smollm2-135m-draft' must be a target"),
    # one target in two pairs: the second needs a name of its own
    (("pairs",), [{"target": "smollm2-135m-instruct", "draft": "smollm2-135m-eagle3"},
                  {"target": "smollm2-135m-instruct", "draft": "smollm2-135m-draft"}],
     r"config key pairs\[1\]\.name: pair name 'smollm2-135m-instruct' is taken by pairs\[0\]"),
    (("pairs",), [{"target": "smollm2-135m-instruct", "draft": "smollm2-135m-eagle3"},
                  {"name": "smollm2-135m-instruct", "target": "smollm2-135m-instruct",
                   "draft": "smollm2-135m-draft"}],
     r"config key pairs\[1\]\.name: pair name 'smollm2-135m-instruct' is taken"),
    (("pairs",), [{"name": "a/b", "target": "smollm2-135m-instruct",
                   "draft": "smollm2-135m-eagle3"}],
     r"config key pairs\[0\]\.name: 'a/b' does not match"),
    (("pairs",), [{"target": "smollm2-135m-instruct", "draft": "smollm2-135m-eagle3",
                   "decoders": ["ar", "beam"]}],
     r"config key pairs\[0\]\.decoders\[1\]: 'beam' is not one of"),
    # fts's matched cap (decode.decoder_budgets) needs pearl's runs beside it in the pair
    (("pairs",), [{"target": "smollm2-135m-instruct", "draft": "smollm2-135m-eagle3",
                   "decoders": ["ar", "fts"]}],
     r"config key pairs\[0\]\.decoders: fts's matched cap .* needs pearl's tree sizes; add "
     r"pearl to pairs\[0\]\.decoders"),
    (("decode", "graphs"), "always", r"config key decode\.graphs: 'always' is not one of"),
    (("decode", "decoders"), ["ar", "fts"],
     r"config key decode\.decoders: fts's matched cap .* add pearl to decode\.decoders"),
])
def test_bad_config_fails_before_any_job_naming_the_key(tmp_path, path, value, expected):
    cfg = default_config()
    _mutate(cfg, path, value)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = snakemake("-n", "--configfile", str(config), cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert re.search(expected, out), out[-3000:]
    assert "Job stats" not in out


# -- job helpers --------------------------------------------------------------------------------


def test_gpu_claims_are_exclusive_and_all_or_nothing(tmp_path):
    from targetrows.pipeline.gpu_lock import claim

    with claim(2, str(tmp_path), gpus=["0", "1", "2"]) as first:
        assert first == ["0", "1"]
        with claim(1, str(tmp_path), gpus=["0", "1", "2"]) as second:
            assert second == ["2"]
            with pytest.raises(TimeoutError, match="free GPU"):
                with claim(1, str(tmp_path), gpus=["0", "1", "2"], poll_s=0.05, timeout_s=0.2):
                    pass
        # GPU 2 is free again, but a job wanting two must not take it alone and wait
        with pytest.raises(TimeoutError):
            with claim(2, str(tmp_path), gpus=["0", "1", "2"], poll_s=0.05, timeout_s=0.2):
                pass
    with claim(2, str(tmp_path), gpus=["0", "1", "2"]) as again:
        assert again == ["0", "1"]  # released on exit


def test_gpu_claim_without_gpus_runs_on_cpu(tmp_path):
    from targetrows.pipeline.gpu_lock import claim, device_env, visible_gpus

    with claim(2, str(tmp_path), gpus=[]) as ids:
        assert ids == []
    env, target, draft = device_env([], env={})
    assert (target, draft, env["CUDA_VISIBLE_DEVICES"]) == ("cpu", "cpu", "")
    env, target, draft = device_env(["3", "5"], env={})
    assert (target, draft, env["CUDA_VISIBLE_DEVICES"]) == ("cuda:0", "cuda:1", "3,5")
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA's numbering is nvidia-smi's
    assert device_env(["4"], env={})[1:] == ("cuda:0", "cuda:0")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_training_jobs_name_the_gpus_they_claimed_and_run_as_before_without(tmp_path):
    """target_replies and train_eagle3 (workflow/scripts/train_on_gpus.py): `--device` with the
    claimed GPUs right after the subcommand (the config's args, later, still win); without GPUs
    the command targetrows_command.py would run, unchanged."""
    from types import SimpleNamespace

    import train_on_gpus

    command = ["train-eagle3", "--target", "t", "--seed", 0, "--steps", "5"]
    argv = train_on_gpus.command(SimpleNamespace(params=SimpleNamespace(command=command)))
    plain = [sys.executable, "-m", "targetrows.cli", *map(str, command)]
    assert argv("cpu", "cpu") == plain
    assert argv("cuda:0,1", "cuda:1") == [*plain[:4], "--device", "cuda:0,1", *plain[4:]]


def test_slurm_jobs_lock_in_their_own_folder(tmp_path):
    from targetrows.pipeline.gpu_lock import lock_folder

    assert lock_folder(str(tmp_path), {}) == str(tmp_path)
    assert lock_folder(str(tmp_path), {"SLURM_JOB_ID": "42"}) == str(tmp_path / "slurm-42")


def test_a_matched_cap_equals_the_baselines_mean_tree_size():
    """fts's matched cap: pearl's measured mean nodes at 8 against first_token's size-by-budget
    curve on the row logs; the closest budget wins, recorded with what it matched."""
    from test_score import toy_log

    from targetrows.pipeline.conditions import matched_cap, mean_nodes, resolve, size_curve

    answers = [{"budget": 8, "rounds": {"nodes": [2, 3]}}, {"budget": 8, "rounds": {"nodes": [4]}},
               {"budget": 3, "rounds": {"nodes": [1]}}]
    assert mean_nodes(answers, 8) == 3.0
    assert matched_cap(np.array([0.9, 1.8, 2.6, 3.3, 4.0]), 3.0) == 4  # |3.3 - 3| < |2.6 - 3|
    assert matched_cap(np.array([0.9, 1.8, 2.5, 3.5]), 3.0) == 3  # a tie: the smaller cap
    logs = [toy_log(1.0, top_k=4, depth=4)]
    curve = size_curve(logs, "first_token", 8)
    assert np.all(np.diff(curve) >= 0) and curve[0] <= 1
    got = resolve("fts", [8, {"matched": 8}], 4, answers, logs)
    assert [c["budget"] for c in got][0] == 8 and got[1]["baseline_budget"] == 8
    assert got[1]["budget"] == matched_cap(curve, 3.0) and got[1]["depth"] == 4
    assert got[1]["baseline_mean_nodes"] == 3.0
    with pytest.raises(ValueError, match="no rounds at budget 16"):
        resolve("fts", [{"matched": 16}], 4, answers, logs)
    with pytest.raises(ValueError, match="has no baseline"):
        resolve("draft_rank", [{"matched": 8}], 4, answers, logs)


def test_an_auto_condition_is_what_its_answers_ran_at():
    """An auto condition is compared with the baseline's own auto pick, and its budget and
    depth are read back from the answers the decode job wrote (one pick for every task)."""
    from targetrows.pipeline.conditions import fill_auto, resolve

    got = resolve("fts", [8, "auto"], 4)
    assert got[1]["baseline_budget"] == "auto" and got[1]["budget"] is None
    answers = [{"budget": 8, "depth": 4, "budget_auto": False},
               {"budget": 6, "depth": 2, "budget_auto": True},
               {"budget": 6, "depth": 2, "budget_auto": True}]
    filled = fill_auto(got, answers)
    assert filled[0] == got[0] and (filled[1]["budget"], filled[1]["depth"]) == (6, 2)
    with pytest.raises(ValueError, match="2 auto choices"):
        fill_auto(got, answers + [{"budget": 9, "depth": 3, "budget_auto": True}])
    with pytest.raises(ValueError, match="verifies no tree"):
        resolve("ar", ["auto"], 4)


def test_bundled_prompts_are_spec_bench_questions():
    from targetrows.fetch.datasets import SOURCES, bundled

    ids = set()
    for task in SOURCES:
        records = bundled(str(REPO / "config" / "prompts" / f"{task}.jsonl"), task, 80)
        assert len(records) >= 3, task
        assert all(r["category"] == task for r in records)
        assert all(len(r["turns"]) == (2 if task == "mt_bench" else 1) for r in records)
        ids |= {r["question_id"] for r in records}
        assert bundled(str(REPO / "config" / "prompts" / f"{task}.jsonl"), task, 2) == records[:2]
    assert len(ids) == sum(1 for t in SOURCES
                           for _ in open(REPO / "config" / "prompts" / f"{t}.jsonl"))
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schema["properties"]["tasks"]["items"]["enum"] == list(SOURCES)


def test_prompt_records_are_checked(tmp_path):
    from targetrows.fetch.datasets import check_record, sample_rows

    with pytest.raises(ValueError, match="two turns"):
        check_record({"question_id": 1, "category": "mt_bench", "turns": ["one"]}, "x", "mt_bench")
    with pytest.raises(ValueError, match="missing field"):
        check_record({"question_id": 1, "turns": ["a"]}, "x", "gsm8k")
    assert sample_rows(5, 80, 0) == [0, 1, 2, 3, 4]
    rows = sample_rows(1000, 10, 0)
    assert rows == sorted(rows) and len(set(rows)) == 10 and rows == sample_rows(1000, 10, 0)


def test_hub_errors_are_classified():
    need_module("huggingface_hub")
    from huggingface_hub.errors import LocalEntryNotFoundError

    from targetrows.fetch.hub import explain, is_transient

    assert is_transient(ConnectionError("reset"))
    assert is_transient(TimeoutError())
    assert is_transient(LocalEntryNotFoundError("hub unreachable"))
    assert not is_transient(ValueError("bad repo id"))
    msg = explain(ConnectionError("x"), "meta-llama/Llama-3.1-8B-Instruct", gated=True)
    assert "Llama-3.1-8B-Instruct" in msg


# -- end to end ---------------------------------------------------------------------------------

NEEDED = ["torch", "transformers", "pandas", "seaborn", "targetrows.specbench.answers",
          "targetrows.rowlog.record", "targetrows.rowlog.score", "targetrows.train.distill",
          "targetrows.analysis.stats"]


def _missing() -> list[str]:
    missing = []
    for name in NEEDED:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except ModuleNotFoundError:
            missing.append(name)
    return missing


def decode_conditions(cfg, decoder):
    return [1] if decoder == "ar" else cfg["decode"]["decoder_budgets"].get(
        decoder, cfg["decode"]["budgets"])


def _tiny_workdir(tmp_path: Path) -> Path:
    from tiny_models import save_tiny

    work = tmp_path / "run"
    save_tiny(work / "models" / "tiny-llama", "llama", seed=0, n_layers=4)
    return work


@pytest.mark.slow
@needs(bool(_missing()), f"pipeline commands not available: {_missing()}")
def test_default_dag_end_to_end_on_tiny_models_survives_an_interrupt(tmp_path):
    work = _tiny_workdir(tmp_path)
    config = str(REPO / "tests" / "pipeline_config" / "config.yaml")
    cfg = yaml.safe_load(Path(config).read_text())
    args = ["--cores", "2", "--configfile", config, "--rerun-incomplete"]

    # interrupt the run as Ctrl-C would once decoding is under way, then start it again. The
    # child gets SIGINT's default action back: a shell starts background commands with SIGINT
    # ignored, and Python then never raises KeyboardInterrupt (CI run as `.ci/run &`)
    env = snakemake_env()
    proc = subprocess.Popen([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(work),
                             *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if len(list((work / "results" / "decode").rglob("*.jsonl"))) >= 2:
            os.killpg(proc.pid, signal.SIGINT)
            break
        time.sleep(0.2)
    assert proc.wait(timeout=120) != 0, "the run finished before it could be interrupted"
    resumed = snakemake(*args, cwd=work, check=True)

    tables = ["expected_accepted", "relative_gains", "equal_size", "online", "online_gain",
              "consistency", "drift", "reuse"]
    for name in tables:
        for ext in ("csv", "md", "tex"):
            assert (work / "results" / "tables" / f"{name}.{ext}").stat().st_size > 0
    for name in ["expected_accepted", "accepted_vs_tree_size", "relative_gains", "online"]:
        for ext in ("png", "pdf"):
            assert (work / "results" / "figures" / f"{name}.{ext}").stat().st_size > 1000
    assert not [p for p in (work / "results").rglob("*") if p.name.endswith((".tmp", ".partial"))]

    # every decoder ran every prompt at each of its distinct conditions, recorded in one
    # conditions file per target x temperature x decoder; auto picked once for every task
    n_prompts = cfg["prompts"]["n"]
    for answers in (work / "results" / "decode").rglob("*.jsonl"):
        t = answers.parent.name
        doc = read_conditions(
            str(work / "results" / "conditions" / "tiny-llama" / t / f"{answers.stem}.json"))
        decoder, conds = doc["decoder"], doc["conditions"]
        assert (doc["pair"], doc["temperature"]) == ("tiny-llama", float(t.removeprefix("T")))
        runs = {(c["budget"], c["depth"]) for c in conds}
        assert decoder == answers.stem and len(conds) == len(decode_conditions(cfg, decoder))
        records = [json.loads(line) for line in answers.read_text().splitlines()]
        assert len(records) == n_prompts * len(runs)
        assert {(r["budget"], r["depth"]) for r in records} == runs
        auto = [c for c in conds if c["spec"] == "auto"]
        assert {(r["budget"], r["depth"]) for r in records if r["budget_auto"]} == {
            (c["budget"], c["depth"]) for c in auto}
    # the part-times job timed the pair over every prompt turn, and each decode job of the
    # resumed run asked for the wall time worked out from it (resources.runtime.decode: auto)
    from targetrows.core.pool import PoolShape
    from targetrows.cost.job_time import MeasuredPair, decode_minutes, decode_work
    from targetrows.decoding.budget import Fixed, parse_budget
    from targetrows.decoding.registry import get_decoder

    pair = MeasuredPair.from_json(json.loads((work / "results" / "parts" / "tiny-llama.json")
                                             .read_text()))
    assert pair.turns == sum(len(json.loads(line)["turns"])
                             for f in (work / "resources" / "prompts").glob("*.jsonl")
                             for line in f.read_text().splitlines())
    jobs = re.finditer(r"rule decode:\n((?:    .*\n)+)", resumed.stdout + resumed.stderr)
    asked = {re.search(r"decoder=(\w+)", job[1])[1]: int(re.search(r"runtime=(\d+)", job[1])[1])
             for job in jobs}
    assert asked, "the resumed run ran no decode job"
    for decoder, minutes in asked.items():
        specs = cfg["decode"]["decoder_budgets"].get(decoder, cfg["decode"]["budgets"])
        budgets = [parse_budget(b, "") for b in specs] if decoder != "ar" else [Fixed(1)]
        job = decode_work(get_decoder(decoder), budgets, cfg["decode"]["max_new_tokens"],
                          PoolShape(cfg["pool"]["top_k"], cfg["pool"]["depth"]))
        assert minutes == decode_minutes(pair, job, 1.5), decoder
    log = (work / "results" / "logs" / "decode" / "tiny-llama" / "T0" / "fts.log")
    assert "fts condition 2: {'matched': 8} -> budget" in log.read_text()
    assert "baseline pearl at 8" in log.read_text()
    assert "budget auto ->" in log.read_text()

    import pandas as pd

    from targetrows.decoding.registry import draft_free_decoders, rule_names

    scored = rule_names() + draft_free_decoders()  # the draft-free along the logged paths
    acc = pd.read_csv(work / "results" / "tables" / "expected_accepted.csv")
    assert set(acc["rule"]) == set(scored)
    assert len(acc) == len(scored) * len(cfg["score"]["budgets"]) * len(cfg["temperatures"])
    gains = pd.read_csv(work / "results" / "tables" / "relative_gains.csv")
    assert {"racer", "recycle", "sequoia"} <= set(gains["baseline"])
    gain = pd.read_csv(work / "results" / "tables" / "online_gain.csv")
    fts = gain[(gain["decoder"] == "fts") & (gain["metric"] == "nodes") & ~gain["auto"]]
    assert sorted(fts.loc[fts["baseline"] == "pearl", "baseline_budget"]) == sorted(
        [3, 8, 8] * len(cfg["temperatures"]))
    # and each of ours over each prior-art decoder, at the same budget
    others = fts[fts["baseline"] != "pearl"]
    assert set(others["baseline"]) == {"draft_rank", "sequoia", "racer", "recycle"}
    assert (others["baseline_budget"] == others["budget"]).all()
    # rerank over draft_rank, condition by condition, and how each run drafted
    rerank = gain[(gain["decoder"] == "rerank") & (gain["baseline"] == "draft_rank")]
    drafted = rerank.loc[~rerank["auto"], "draft_kind"]
    assert len(drafted) and (drafted == "eagle3").all() and not rerank["overlap"].any()
    assert set(rerank["draft_kind"]) <= {"eagle3", "none"}  # an auto pick of no tree: none
    assert gain["auto"].sum() > 0  # auto picks compared with the baseline's auto picks
    # every temperature-0 answer of every decoder but ar compared with ar's, on the CPU in
    # float32 (the test config's dtype auto on a CPU without bfloat16 units) or bfloat16
    drift = pd.read_csv(work / "results" / "tables" / "drift.csv")
    assert set(drift["decoder"]) == set(cfg["decode"]["decoders"]) - {"ar"}
    assert (drift["identical"] + drift["near_tie"] == drift["answers"]).all()
    online = pd.read_csv(work / "results" / "tables" / "online.csv")
    assert set(online["decoder"]) == set(cfg["decode"]["decoders"])
    assert (online.loc[online["decoder"] == "ar", "speedup"] == 1).all()
    gains = pd.read_csv(work / "results" / "tables" / "relative_gains.csv")
    assert {"first_token", "target_rerank"} <= set(gains["rule"])
    assert "target_rerank" in set(gains.loc[gains["baseline"] == "sequoia", "rule"])
    finite = gains.dropna(subset=["lo", "hi"])  # NaN where the baseline accepted nothing
    assert len(finite) and (finite["lo"] <= finite["hi"]).all()

    # the claims, each judged: the speed claims unmeasured (an EAGLE-3 head on the job's one
    # device, recorded in the conditions files), the offline ones on the head's pair
    from targetrows.analysis.claims import CLAIMS
    from targetrows.analysis.reuse import COMPARED
    from targetrows.analysis.verdicts import VERDICTS

    claims = pd.read_csv(work / "results" / "claims.csv").set_index("claim")
    assert len(claims) == len(CLAIMS) and set(claims["verdict"]) <= set(VERDICTS)
    assert claims.loc["6 rerank faster", "verdict"] == "not measured"
    assert "no standalone draft" in claims.loc["6 rerank faster", "why"]
    assert claims.loc["3 rerank, T=0", "verdict"] != "not measured"
    assert set(gains["draft_kind"]) == {"eagle3"}
    assert {("cpu", "cpu")} == {(doc["devices"]["target"], doc["devices"]["draft"]) for doc in (
        read_conditions(str(p)) for p in (work / "results" / "conditions").rglob("*.json"))}
    reuse = pd.read_csv(work / "results" / "tables" / "reuse.csv")
    assert set(reuse["source"]) == {"toy pair", "tiny-llama"}
    assert set(reuse["row"]) == set(COMPARED) and (reuse["hits"] <= reuse["positions"]).all()

    # a finished run has nothing left to do, and its report builds
    again = snakemake(*args, "-n", cwd=work, check=True)
    assert "Nothing to be done" in again.stdout + again.stderr
    snakemake("--configfile", config, "--report", str(work / "report.zip"), cwd=work, check=True)
    assert (work / "report.zip").stat().st_size > 10_000

    # the head trained on the target's replies; the distilled draft, the other option, reads the
    # same replies (one replies job for both trainings)
    head = json.loads((work / "resources" / "models" / "tiny-llama-eagle3" /
                       "train_eagle3_report.json").read_text())
    assert head["replies"] == "resources/replies/tiny-llama" and head["steps_done"] == 3
    built = snakemake(*args, "resources/models/tiny-llama-draft", cwd=work, check=True)
    assert job_counts(built.stdout + built.stderr) == {"distill_draft": 1, "total": 1}
    draft = json.loads((work / "resources" / "models" / "tiny-llama-draft" /
                        "distill_report.json").read_text())
    assert draft["replies"] == "resources/replies/tiny-llama"


def test_the_schemas_defaults_are_the_librarys():
    """A setting's default lives in the library's dataclass; the config schema repeats it only
    so that Snakemake fills it in, and must say the same."""
    from targetrows.analysis import stats
    from targetrows.core.pool import PoolShape
    from targetrows.cost.job_time import decode_minutes
    from targetrows.decoding.config import DecodeConfig
    from targetrows.hf.pass_builder import DEFAULT_CAPACITY
    from targetrows.rowlog.record import RecordConfig
    from targetrows.train.replies import RepliesConfig
    from targetrows.train.reranker import RerankerConfig

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())

    def default(*path):
        node = schema
        for key in path:
            node = node["properties"][key]
        return node["default"]

    pool, decode, record, replies, rerank = (PoolShape(), DecodeConfig(), RecordConfig(),
                                             RepliesConfig(), RerankerConfig())
    pairs = {
        ("pool", "top_k"): pool.top_k, ("pool", "depth"): pool.depth,
        ("decode", "max_new_tokens"): decode.max_new_tokens, ("decode", "seed"): decode.seed,
        ("decode", "batch_size"): decode.batch_size,
        ("decode", "max_context"): DEFAULT_CAPACITY,
        ("resources", "runtime_margin"): inspect_default(decode_minutes, "margin"),
        ("record", "stride"): record.stride, ("record", "seed"): record.seed,
        ("record", "max_new_tokens"): record.max_new_tokens,
        ("rerank", "folds"): rerank.folds, ("rerank", "seed"): rerank.seed,
        ("report", "bootstrap"): inspect_default(stats.paired_gain, "n_boot"),
        ("report", "seed"): inspect_default(stats.paired_gain, "seed"),
        ("replies", "prompts"): replies.prompts, ("replies", "self_prompts"): replies.self_prompts,
        ("replies", "sampled"): replies.sampled, ("replies", "seed"): replies.seed,
        ("replies", "max_new_tokens"): replies.max_new_tokens,
    }
    for path, library in pairs.items():
        assert default(*path) == library, f"schema {'.'.join(path)}: {default(*path)} != {library}"


def inspect_default(function, name):
    import inspect

    return inspect.signature(function).parameters[name].default
