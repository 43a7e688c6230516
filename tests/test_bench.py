"""`targetrows bench` on tiny random models (CPU): end to end, its files, the assisted-generation
draft, prompt lookup, an EAGLE-3 head with a standalone --assistant, the report's summary and
goals, bad input."""

import csv
import json
import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_heads import save_tiny_head
from tiny_models import DRAFT_VOCAB, TARGET_VOCAB, TOKENIZER_SIZE, save_tiny_pair, tiny_model

from targetrows.bench import plan as bench_plan
from targetrows.bench import report as bench_report
from targetrows.bench import run as bench
from targetrows.bench.baselines import hf_generate
from targetrows.cli import main
from targetrows.cost.parttimes import PartTimes, PassCurve
from targetrows.decoding.registry import decoder_names


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("bench"), "qwen2")


@pytest.fixture(scope="module")
def head(pair, tmp_path_factory):
    """A tiny EAGLE-3 head for the pair's 2-layer target (it reads hidden states 0, 1, 1)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(pair[0])
    return save_tiny_head(tmp_path_factory.mktemp("head") / "h", config, layer_ids=[0, 1, 1],
                          layout="speculators")  # inputs: the embedding is one


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "q.jsonl"
    lines = [
        {"question_id": 1, "category": "a", "turns": ["Count to five."]},
        {"question_id": 2, "category": "b", "turns": ["Name a color.", "Another?"]},
        {"question_id": 3, "category": "b", "turns": ["Not used."]},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_bench_end_to_end(pair, prompts_file, tmp_path):
    target, draft = pair
    out = tmp_path / "results"
    code = main(
        [
            "bench",
            "--target",
            target,
            "--draft",
            draft,
            "--prompts",
            prompts_file,
            "--num-prompts",
            "2",
            "--temperature",
            "0",
            "1",
            "--budget",
            "6",
            "--max-new-tokens",
            "8",
            "--top-k",
            "3",
            "--depth",
            "3",
            "--out-dir",
            str(out),
            "--name",
            "run",
        ]
    )
    assert code == 0
    rows = list(csv.DictReader(open(out / "run.csv")))
    methods = [*bench.HF_METHODS, *decoder_names(learned=False)]
    assert len(rows) == 2 * 2 * len(methods)
    assert {r["method"] for r in rows} == set(methods)
    assert {r["question_id"] for r in rows} == {"1", "2"}
    for r in rows:
        assert float(r["tokens_per_s"]) > 0 and 0 < int(r["new_tokens"]) <= 8
        if r["method"] not in bench.HF_METHODS:
            assert float(r["bound_tokens_per_s"]) > 0 and int(r["rounds"]) >= 1
            assert float(r["predicted_tokens_per_s"]) > 0
            assert float(r["mean_t_round"]) >= float(r["mean_t_verify"])
        if r["method"] not in bench.HF_METHODS and r["method"] != "ar":
            assert r["budget"] == "6"
    # Greedy: every method, prompt lookup included, reproduces HF generate (padding rows
    # suppressed, draft resized)
    greedy = [r for r in rows if float(r["temperature"]) == 0]
    assert all(r["same_as_hf_generate"] == "True" for r in greedy)
    assert sum(r["method"] == "hf_prompt_lookup" for r in greedy) == 2
    report = (out / "run.md").read_text()
    for needle in (
        "# targetrows bench",
        "### Temperature 0",
        "### Temperature 1",
        "| fts | 6 |",
        "| hf_prompt_lookup | - |",
        "x HF lookup",
        "prompt lookup tokens 10",
        "## Part times",
        "measured/predicted [min-max]",
        "## Goals",
        "machine:",
        "versions:",
        "command:",
        # RACER's first pass ranks the target's rows at every prompt position: priced as such
        "racer's first pass, which ranks the target's rows at every prompt position",
    ):
        assert needle in report
    assert "recycle's first pass" not in report  # Token Recycling reads no prompt rows


def test_a_peer_engine_is_timed_beside_our_decoders(pair, prompts_file, tmp_path, capsys):
    """--peer runs another engine in its own process, interleaved with every method: here a
    plain token-by-token loop written without targetrows (tests/hf_peer.py), whose greedy
    tokens equal HF generate's, and our decoders are compared with it in the goals."""
    target, draft = pair
    peer = f"{sys.executable} {Path(__file__).parent / 'hf_peer.py'} {target}"
    args = ["bench", "--target", target, "--draft", draft, "--prompts", prompts_file,
            "--num-prompts", "2", "--decoders", "ar", "draft_rank", "--budget", "4",
            "--max-new-tokens", "6", "--top-k", "3", "--depth", "2", "--out-dir", str(tmp_path),
            "--name", "peer", "--dtype", "float32"]
    assert main([*args, "--peer", f"loop={peer}"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "peer.csv")))
    mine = [r for r in rows if r["method"] == "peer:loop"]
    assert len(mine) == 2 and all(r["same_as_hf_generate"] == "True" for r in mine)
    report = (tmp_path / "peer.md").read_text()
    assert "| peer:loop |" in report and "- peer:loop: hf-loop" in report
    assert "best decoder >= 1.0x peer:loop" in report
    capsys.readouterr()
    assert main([*args, "--peer", f"loop={peer} --fail-after 1"]) == 2
    assert "peer loop: out of memory (pretend)" in capsys.readouterr().err
    assert main([*args, "--peer", "loop"]) == 2
    assert "give NAME=COMMAND" in capsys.readouterr().err


def test_bench_auto_budget(pair, prompts_file, tmp_path):
    target, draft = pair
    code = main(
        [
            "bench",
            "--target",
            target,
            "--draft",
            draft,
            "--prompt",
            "Hi there",
            "--decoders",
            "ar",
            "fts",
            "--no-hf",
            "--budget",
            "auto",
            "--max-new-tokens",
            "6",
            "--top-k",
            "3",
            "--depth",
            "2",
            "--out-dir",
            str(tmp_path),
            "--name",
            "auto",
        ]
    )
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "auto.csv")))
    assert [r["method"] for r in rows] == ["ar", "fts"]
    assert rows[0]["budget"] == rows[0]["depth"] == ""  # ar drafts no pool
    report = (tmp_path / "auto.md").read_text()
    picked = re.search(r"fts, T=0: budget auto -> (no tree, ar \(best tree: )?(\d+) at depth "
                       r"(\d+)", report)
    budget, depth = int(picked[2]), int(picked[3])  # the best tree
    assert 1 <= budget <= 3 + 3 * 3  # within the candidate pool
    assert 1 <= depth <= 2  # at most --depth
    if picked[1]:  # no tree beat ar on this machine: fts ran as ar (budget and depth 0)
        assert rows[1]["budget"] == rows[1]["depth"] == "0"
        assert "| fts | 0 (no tree, ar) | 0 |" in report
    else:
        assert (int(rows[1]["budget"]), int(rows[1]["depth"])) == (budget, depth)
        assert f"| fts | {budget} | {depth} |" in report


# a verify pass of n nodes: 10 ms + 40 ms per node beyond the first; no tree beats ar's one
# 10 ms pass per token
DEAR_TREES = PartTimes(PassCurve((1, 2, 200), (0.01, 0.05, 7.97)), PassCurve((1,), (0.002,)), 3)


@pytest.mark.parametrize("batch", ["1", "2"])
def test_an_auto_pick_of_no_tree_runs_as_ar(pair, tmp_path, monkeypatch, capsys, batch):
    """Where no tree beats ar (tree passes timed dear), `auto` picks no tree: the bench runs
    the tree decoder with ar's config (no draft, no tree: ar's tokens), its rows say budget and
    depth 0 and the best tree it passed over is named; batched too, its pick per sequence at
    the batch size."""
    from targetrows.bench import batched

    monkeypatch.setattr(bench, "measure", lambda *a: DEAR_TREES)
    monkeypatch.setattr(batched, "measure", lambda *a: DEAR_TREES)
    ran = []  # (config's decoder, draft given, prompt, new tokens) of every timed decode

    def spy(original):
        def run(target, draft, prompts, configs, *args):
            results = original(target, draft, prompts, configs, *args)
            for p, c, r in zip(*((prompts, configs, results) if batch == "2" else
                                 ([prompts], [configs], [results])), strict=True):
                if c.max_new_tokens == 6:  # not a warm-up
                    ran.append((c.name, draft is not None, tuple(p), tuple(r.tokens)))
            return results
        return run

    monkeypatch.setattr(bench, "generate", spy(bench.generate))
    monkeypatch.setattr(batched, "generate_batch", spy(batched.generate_batch))
    target, draft = pair
    code = main(["bench", "--target", target, "--draft", draft, "--prompt", "Hi there",
                 "--prompt", "Count to five", "--decoders", "ar", "fts", "--no-hf", "--budget",
                 "auto", "--max-new-tokens", "6", "--top-k", "3", "--depth", "2",
                 "--batch-size", batch, "--dtype", "float32", "--out-dir", str(tmp_path),
                 "--name", "notree"])
    assert code == 0
    assert {name for name, *_ in ran} == {"ar"}  # fts ran with ar's config
    if batch == "1":
        assert not any(drafted for _, drafted, _, _ in ran)
    tokens = {}
    for _, _, prompt, new in ran:  # ar's and fts's tokens are one
        assert tokens.setdefault(prompt, new) == new
    assert len(tokens) == 2 and len(ran) == 4
    rows = list(csv.DictReader(open(tmp_path / "notree.csv")))
    fts = [r for r in rows if r["method"] == "fts"]
    assert fts and all(r["budget"] == r["depth"] == "0" for r in fts)
    report = (tmp_path / "notree.md").read_text()
    if batch == "1":
        assert all(float(r["mean_nodes"]) == float(r["mean_draft_passes"]) == 0 for r in fts)
        assert "| fts | 0 (no tree, ar) | 0 |" in report
        said = report
    else:
        assert float(fts[0]["mean_nodes"]) == 0 and float(fts[0]["same_as_ar"]) == 1.0
        assert "| fts | 0 (no tree, ar) | 0 |" in report
        said = capsys.readouterr().err
        assert "predicted tokens/s per sequence at batch size 2 " in said
    assert "fts, T=0: budget auto -> no tree, ar (best tree: " in said


def test_prompt_lookup_proposes_and_keeps_greedy_tokens():
    """At T=0 prompt lookup verifies copied candidates (target passes wider than one token) and
    returns exactly the tokens of plain greedy generate()."""
    model = tiny_model("qwen2", seed=0, vocab_size=TARGET_VOCAB)
    prompt = [5, 17, 42, 9] * 4 + [5, 17]  # repeated n-grams: lookup finds matches
    widths = []  # new tokens of each target pass

    def count(_, args, kwargs):
        ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
        widths.append(ids.shape[1])

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        looked_up = hf_generate(model, prompt, 0.0, 24, set(), 0, TOKENIZER_SIZE,
                                prompt_lookup_tokens=5)
    finally:
        hook.remove()
    assert looked_up == hf_generate(model, prompt, 0.0, 24, set(), 0, TOKENIZER_SIZE)
    assert len(looked_up) == 24
    assert max(widths[1:]) > 1  # after the prefill, some pass verified candidates
    with pytest.raises(ValueError, match="not both"):
        hf_generate(model, prompt, 0.0, 4, set(), 0, TOKENIZER_SIZE, assistant=model,
                    prompt_lookup_tokens=5)


@pytest.mark.parametrize("assistant", [True, False])
def test_bench_with_an_eagle3_head(pair, head, tmp_path, assistant):
    """--draft HEAD --assistant DRAFT: hf_assisted runs with the standalone draft; without
    --assistant it is skipped (Hugging Face cannot run a head) and the report says why."""
    target, draft = pair
    argv = ["bench", "--target", target, "--draft", head, "--prompt", "Count to five.",
            "--decoders", "ar", "fts", "--budget", "4", "--max-new-tokens", "6", "--top-k", "3",
            "--depth", "2", "--out-dir", str(tmp_path), "--name", "head"]
    assert main(argv + (["--assistant", draft] if assistant else [])) == 0
    rows = list(csv.DictReader(open(tmp_path / "head.csv")))
    methods = {"hf_generate", "hf_prompt_lookup", "ar", "fts"} | ({"hf_assisted"} if assistant else set())
    assert {r["method"] for r in rows} == methods and len(rows) == len(methods)
    assert all(r["same_as_hf_generate"] == "True" for r in rows)
    report = (tmp_path / "head.md").read_text()
    assert ("- assistant: " + draft in report) is assistant
    assert ("Not run: hf_assisted: no standalone draft" in report) is not assistant


def test_assistant_gets_the_target_width():
    target = tiny_model("llama", seed=0, vocab_size=TARGET_VOCAB)
    draft = tiny_model("llama", seed=1, n_layers=1, vocab_size=DRAFT_VOCAB)
    assistant = bench.assistant_for(target, draft, TOKENIZER_SIZE)
    assert assistant is not draft
    assert assistant.config.vocab_size == TARGET_VOCAB
    assert draft.get_output_embeddings().weight.shape[0] == DRAFT_VOCAB  # the draft is untouched
    ids = torch.tensor([[5, 17, 42]])
    with torch.no_grad():
        mine, theirs = assistant(ids).logits[0], draft(ids).logits[0]
    torch.testing.assert_close(mine[:, :TOKENIZER_SIZE], theirs[:, :TOKENIZER_SIZE])
    assert bool((mine[:, TOKENIZER_SIZE:] < -1e3).all())  # padding rows are never proposed
    same = tiny_model("llama", seed=1, n_layers=1, vocab_size=TARGET_VOCAB)
    assert bench.assistant_for(target, same, TOKENIZER_SIZE) is same


def _rows():
    """Two prompts: HF generate at 10 and 20 tokens/s, ours slightly slower and faster, prompt
    lookup fastest of all."""
    out = []
    for qid, hf, assisted, lookup, ar, fts, peer, share in (
        ("1", 10.0, 8.0, 15.0, 9.6, 12.0, 10.0, 0.02),
        ("2", 20.0, 16.0, 32.0, 19.8, 26.0, 20.0, 0.04),
    ):
        for method, tps in (
            ("hf_generate", hf),
            ("hf_assisted", assisted),
            ("hf_prompt_lookup", lookup),
            ("ar", ar),
            ("fts", fts),
            ("peer:vllm", peer),
        ):
            row = {
                "method": method,
                "temperature": 0.0,
                "question_id": qid,
                "budget": "",
                "tokens_per_s": tps,
                "same_as_hf_generate": method not in ("peer:vllm", "fts") or qid == "1",
            }
            if method == "fts" and qid == "2":  # parted from HF greedy at a near-tie
                row["near_tie"] = True
            if method in ("ar", "fts"):
                row.update(
                    rounds=10,
                    mean_committed=2.0,
                    mean_accepted=0.5,
                    mean_nodes=4.0,
                    mean_t_draft=0.01,
                    mean_t_root=0.0,
                    mean_t_verify=0.02,
                    mean_t_bookkeeping=share * 0.05,
                    mean_t_round=0.05,
                    overlap=0.0,
                    bound_tokens_per_s=tps / 0.95,
                    bound_speedup=1.2,
                    measured_over_bound=0.95 if method == "ar" else 0.8,
                    predicted_tokens_per_s=tps / 0.9,
                    measured_over_predicted=(0.9 if method == "ar" else 0.8) * (1 + int(qid) / 10),
                )
            out.append(row)
    return out


def test_summary_and_goals_by_hand():
    settings = bench_plan.BenchSettings(decoders=("ar", "fts"), budget=4)
    summary = {s["method"]: s for s in bench_report.summarize(_rows(), settings)}
    assert summary["ar"]["vs_hf_generate"] == pytest.approx(np.median([0.96, 0.99]))
    assert summary["fts"]["vs_hf_assisted"] == pytest.approx(np.median([1.5, 1.625]))
    assert summary["fts"]["vs_hf_prompt_lookup"] == pytest.approx(np.median([0.8, 0.8125]))
    assert summary["hf_prompt_lookup"]["vs_hf_generate"] == pytest.approx(1.55)
    assert summary["fts"]["tps_min"] == 12.0 and summary["fts"]["tps_max"] == 26.0
    assert summary["fts"]["bookkeeping_share"] == pytest.approx(0.03)
    assert summary["ar"]["same_as_hf"] == "2/2"
    assert summary["fts"]["same_as_hf"] == "1/2 (+1 near-tie)"
    assert summary["fts"]["vs_ar"] == pytest.approx(np.median([12 / 9.6, 26 / 19.8]))
    found = bench_report.goals(list(summary.values()), settings)
    met = {goal: ok for goal, _, ok in found}
    value = {goal: v for goal, v, _ in found}
    # prompt lookup and the peers are other engines, never "the best decoder", however fast
    assert value["best decoder >= 1.4x our ar (T=0, draft alone)"] == "fts 1.28x"
    assert met["best decoder >= 1.4x our ar (T=0, draft alone)"] is False
    assert met["best decoder >= 2.0x HF prompt lookup (T=0)"] is False
    assert value["best decoder >= 1.0x peer:vllm (T=0, median tokens/s)"] == "fts 1.27x"
    assert met["best decoder >= 1.0x peer:vllm (T=0, median tokens/s)"] is True
    # fts's difference is a near-tie; the peer's is not
    identical = "every method token-identical to HF greedy, or parted from it at a near-tie (T=0)"
    assert value[identical] == "peer:vllm 1/2" and met[identical] is False
    assert met["ar >= 0.95x HF generate (T=0)"] is True
    lookup = {g: ok for g, _, ok in bench_report.goals(list(summary.values()), settings, True)}
    assert lookup["best decoder >= 1.8x our ar (T=0, draft + lookup)"] is False
    assert met["ar measured >= 90% of bound (T=0)"] is True
    assert met["fts measured >= 90% of bound (T=0)"] is False
    assert met["fts bookkeeping < 5% of a round (T=0)"] is True
    # measured / predicted: ar 0.99 and 1.08 (median 1.035), fts 0.88 and 0.96 (median 0.92)
    assert summary["ar"]["of_predicted"] == pytest.approx(1.035)
    assert met["ar measured within 15% of the cost model's prediction (T=0)"] is True
    assert value["fts measured within 15% of the cost model's prediction (T=0)"] == "92%"
    table = bench_report.summary_markdown(list(summary.values()), settings)
    assert "| 104% [99%-108%] |" in table
    assert "| fts |" in table and "1.56" in table  # the median ratio to HF assisted
    assert "| hf_prompt_lookup |" in table and "| 0.81 |" in table  # fts against prompt lookup


def test_unreadable_budget_is_a_usage_error(pair, capsys):
    target, draft = pair
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--target", target, "--draft", draft, "--prompt", "hi", "--budget", "x"])
    assert exit_info.value.code == 2
    assert "--budget 'x' is not a budget: give a positive integer, auto" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompt", "hi", "--budget", "0"], "--budget must be a positive integer (non-root nodes), got 0"),
        (["--prompt", " "], "empty"),
        (["--prompt", "hi", "--temperature", "-1"], "--temperature must be a number >= 0"),
        (["--prompt", "hi", "--decoders", "fts", "--no-draft"], "--draft is required"),
        (["--prompt", "hi", "--prompt-lookup-tokens", "0"], "--prompt-lookup-tokens must be"),
        (["--prompt", "hi", "--no-hf", "--assistant", "x"], "--assistant only serves"),
        (["--prompt", "hi", "--batch-size", "0"], "--batch-size must be an integer >= 1"),
    ],
)
def test_bad_input_exits_non_zero(pair, extra, message, capsys):
    target, draft = pair
    argv = ["bench", "--target", target, "--out-dir", "/nonexistent/x"]
    if "--no-draft" in extra:
        extra = [x for x in extra if x != "--no-draft"]
    else:
        argv += ["--draft", draft]
    try:
        status = main(argv + extra)
    except SystemExit as stop:  # refused by argparse itself (a budget's type)
        status = stop.code
    assert status == 2
    assert message in capsys.readouterr().err


def test_a_head_cannot_assist(pair, head, capsys):
    argv = ["bench", "--target", pair[0], "--draft", pair[1], "--assistant", head,
            "--prompt", "hi", "--out-dir", "/nonexistent/x"]
    assert main(argv) == 2
    assert f"--assistant {head!r} is an EAGLE-3 head" in capsys.readouterr().err


def _benchmark(name: str):
    """The script benchmarks/<name>.py as a module (the folder is no package)."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_smoke(tmp_path):
    """The GPU script's stages, tiny and on CPU (left out: the pipeline stage, as test_pipeline
    runs the same DAG, and the graphs stage, which the next test runs with graphs on):
    identity passes, every stage writes its section, the bench rows its CSV."""
    gpu_check = _benchmark("gpu_check")
    argv = ["--smoke", "--skip", "pipeline", "graphs", "--out-dir", str(tmp_path), "--name",
            "smoke"]
    assert gpu_check.main(argv) == 0
    report = (tmp_path / "smoke.md").read_text()
    assert report.count("mismatches with HF greedy generate: 0 -> PASS") == 2
    for title in ("## Host syncs per round", "## One target pass against tree size",
                  "## Bench: Qwen3-8B shape, Qwen3-0.6B",
                  "## Root pass alongside drafting on one GPU, a Qwen3-0.6B-shaped draft",
                  "## Root pass alongside drafting on one GPU, a random EAGLE-3 head",
                  "## Bench: Qwen3-8B shape with a random", "## Temperature-0 drift",
                  "## Batched decoding"):
        assert title in report
    assert "FAILED" not in report and "## Stage pipeline: skipped (--skip)" in report
    assert "## Stage graphs: skipped (--skip)" in report
    # the graphs stage's goals are written all the same, saying nothing was measured
    goals = report.split("### Goals")[1].split("## Stage identity")[0]
    assert "No graphs captured: the stage's setup did not run." in goals
    assert len(re.findall(r"^\| .+ \| not measured \(the part did not finish\) \| - \|$", goals,
                          re.M)) == 7
    rows = list(csv.DictReader(open(tmp_path / "smoke.csv")))
    assert {r["method"] for r in rows} >= {"hf_generate", "hf_assisted", "fts", "eagle3:fts"}


def test_gpu_check_graphs_stage_on_graphs_stood_in_on_the_cpu(monkeypatch, tmp_path):
    """The graphs stage with graphs on, replayed by the CPU stand-in that fails where a CUDA
    graph would (tests/replayed_graphs.py), and with the code's other GPU branches taken
    (pools drafted to full depth and read with t0 or the root row, checks queued, part times
    from timing events): every pass it captures replays as captured, tokens on graphs equal
    eager ones for every decoder, and nothing else makes the host wait. Each part writes its
    own section: one that fails (here the head's, made to) leaves the others, and the goals
    say what it did not measure; a decoder that fails (made to) is a row naming the error."""
    from replayed_graphs import gpu_branches, replay_in_place

    from targetrows.hf.eagle3 import Eagle3Draft

    gpu_check = _benchmark("gpu_check")
    stage = gpu_check.graphs
    replay_in_place(monkeypatch)
    monkeypatch.setattr(stage, "graphs_on", lambda device: True)
    generate, during = stage.generate, Counter()

    def decode(target, draft, prompt, config):  # the waits of decoding (not of loading, nor
        # HF's generate); one decoder made to fail, with a head
        if config.decoder.name == "sequoia" and isinstance(draft, Eagle3Draft):
            raise RuntimeError("a decoder that fails")
        before = Counter(waits)
        try:
            return generate(target, draft, prompt, config)
        finally:
            during.update(Counter(waits) - before)

    def head(self):
        raise RuntimeError("a part that fails")

    monkeypatch.setattr(stage, "generate", decode)
    monkeypatch.setattr(stage.GraphsStage, "head", head)
    others = ["identity", "syncs", "pass_costs", "bench", "overlap", "batched",
              "eagle3_identity", "eagle3_bench", "drift", "pipeline"]
    argv = ["--smoke", "--prompt-len", "16", "--max-new-tokens", "8", "--prompts", "1",
            "--budget", "8", "--skip", *others, "--out-dir", str(tmp_path), "--name", "g"]
    with gpu_branches() as waits:
        assert gpu_check.main(argv) == 1  # the head's part failed
    assert not during, during
    report = (tmp_path / "g.md").read_text()
    assert "padded, eager (no CUDA device)" not in report  # graphs were on (stood in)
    captured = r"Graphs captured on the 8B-shaped models \(target, draft, head\): (\d+) in"
    assert int(re.search(captured, report)[1]) > 0
    identity = re.findall(r"^\| (standalone|eagle3) \| (\w+) \| ([^|]+) \|", report, re.M)
    assert len(identity) > 10
    assert {same for draft, decoder, same in identity
            if (draft, decoder) != ("eagle3", "sequoia")} == {"True"}
    assert ("eagle3", "sequoia", "failed: RuntimeError: a decoder that fails") in identity
    assert "The first failure (eagle3, sequoia):" in report
    assert re.search(r"^\| tokens with graphs = eager in float32, every decoder \| False[^|]* \| "
                     r"no \|$", report, re.M)
    # the goals come after every part, however the parts ended
    assert report.index("### Goals") > report.index("## Bench with graphs: Qwen3-8B shape, a random")
    assert "## Stage graphs:head: FAILED" in report and "a part that fails" in report
    assert "| head step < 1 ms | not measured (the part did not finish) | - |" in report
    assert "### Tokens/s" in report and "### Pass costs" in report
    # the benches on graphs: every decoder's rows, named graphs:[eagle3:]<method> in the CSV
    methods = {r["method"] for r in csv.DictReader(open(tmp_path / "g.csv"))}
    assert methods >= {"graphs:ar", "graphs:draft_rank", "graphs:fts", "graphs:fts_redraft",
                       "graphs:eagle3:draft_rank", "graphs:eagle3:fts"}
    # the root pass beside drafting on graphs: the same tokens as after it
    beside = report.split("### Root pass beside drafting with graphs")[1].split("(stage")[0]
    assert len(re.findall(r"^\| (rerank|fts) \| (True|False) \|.* \| True \|$", beside,
                          re.M)) == 4
    # the kernels part: the CPU's operations, the products among the busiest
    kernels = report.split("### Where a pass's time goes")[1].split("(stage")[0]
    assert re.search(r"n=1: wall [\d.]+ ms, busy [\d.]+ ms", kernels)
    assert "aten::" in kernels and ("linear" in kernels or "mm" in kernels)


@pytest.mark.parametrize("same", [True, False])
def test_gpu_check_runs_a_graphs_part_only_where_its_budget_fits(monkeypatch, tmp_path, same):
    """Off --smoke, a graphs part runs where the budget its stage prices it at fits in the time
    left, and is skipped, saying so, where not; the goals come after the parts, from whatever
    ran (here the passes part alone: a stage without models stands in). Tokens on graphs that
    are not eager's in float32 fail the check."""
    from targetrows.cost.parttimes import PassCurve

    gpu_check = _benchmark("gpu_check")
    graphs = gpu_check.graphs

    class Stage:  # what the check reads of a graphs stage
        def __init__(self, args, device, keep):
            self.rep, self.start = {"bound_s": 1e-3}, 0.0

        def setup_markdown(self):
            return "## Graphs (stood in)"

        def need_s(self, part):
            return 1.0 if part == "passes" else 1e6

        def passes(self):
            curve = PassCurve((1, 64), (1.5e-3, 1.8e-3))
            self.rep["target_passes"] = {"eager": curve, "graphs": curve}
            return "### Pass costs (stood in)"

        def captured(self):
            return 0, 0.0

        def graph_models(self):
            return {}

        def same_tokens(self):
            return same

        def __getattr__(self, part):  # every other part: it must not run
            return lambda: pytest.fail(f"the {part} part ran past its budget")

    monkeypatch.setattr(graphs, "GraphsStage", Stage)
    others = ["identity", "syncs", "pass_costs", "bench", "overlap", "batched",
              "eagle3_identity", "eagle3_bench", "drift", "pipeline"]
    argv = ["--device", "cpu", "--time-limit", "600", "--skip", *others, "--out-dir",
            str(tmp_path), "--name", "b"]
    assert gpu_check.main(argv) == (0 if same else 1)
    report = (tmp_path / "b.md").read_text()
    assert "### Pass costs (stood in)\n\n(stage graphs:passes: 0 s of a 1 s budget)" in report
    for part in graphs.PARTS[1:]:
        assert re.search(rf"^## Stage graphs:{part}: skipped: \d+ s left, its budget 1000000 s$",
                         report, re.M), part
    goals = report.split("### Goals")[1]
    assert "| target's 1-token pass <= 2x its weight-streaming time | 1.50 ms, 1.5x | yes |" in goals
    assert "| a 64-node pass <= 1.3x the 1-token pass | 1.20x (64 nodes) | yes |" in goals
    assert goals.count("| not measured (the part did not finish) | - |") == 5
    assert report.index("### Goals") > report.index("## Stage graphs:head_bench: skipped")


def test_a_graphs_parts_budget_is_its_work_priced_at_what_was_measured():
    """Every part's budget is its work priced at the stage's measurements (the probe's curves,
    a round's overhead, the captures): with every price doubled, every budget doubles (no
    seconds come from elsewhere); a measured curve replaces the probe's (the slower of eager
    and graphs, size by size), and measured captures price the next ones."""
    from types import SimpleNamespace

    from targetrows.core.pool import PoolShape
    from targetrows.cost.parttimes import PassCurve
    from targetrows.hf.graphs import pass_shape

    budgets = _benchmark("gpu_budgets")
    run = budgets.Decoding(prompts=2, prompt_len=32, new_tokens=16, budget=8, pool=PoolShape(4, 3))
    stage = SimpleNamespace(
        sizes=(1, 8, 64), draft_sizes=(1, 8), head_widths=(1, 10), kernel_sizes=(1, 64),
        ctx=list(range(32)), repeats=3, bench_repeats=2, run=run, speed_decoders=("ar", "fts"),
        shape=pass_shape("on", 256, (9,)), tiny_run=replace(run, prompts=3, prompt_len=5),
        tiny_shape=pass_shape("on", 128), captured_by=lambda model: 0)

    def prices(scale, captured=(0, 0.0)):
        curve = PassCurve((1, 8, 64), (scale * 1e-3, scale * 2e-3, scale * 5e-3))
        return budgets.Prices({}, dict.fromkeys(("target", "draft", "tiny target", "tiny draft"),
                                                curve),
                              {"8b": scale * 3e-4, "tiny": scale * 1e-4}, lambda: captured)

    need = {}
    for scale in (1, 2):
        stage.prices = prices(scale)
        need[scale] = {part: budgets.need_s(stage, part) for part in budgets.WORK}
    for part, seconds in need[1].items():
        assert seconds > 0 and need[2][part] == pytest.approx(2 * seconds), part
    measured = prices(1, captured=(4, 2.0))
    measured.rep["target_passes"] = {"eager": PassCurve((1, 8), (1e-3, 4e-3)),
                                     "graphs": PassCurve((1, 8), (2e-3, 3e-3))}
    assert measured.curve("target").seconds == (2e-3, 4e-3)
    assert measured.captures_s("target", 3, 128) == pytest.approx(1.5)


def test_host_reads_a_round_stay_within_the_gpu_goal(tmp_path, monkeypatch):
    """With the code's GPU branches taken (benchmarks/host_reads.py), every decoder's round
    reads from the device at most 3 times, and makes no other host wait: 2 (the pool, with t0
    and the target's rows at the pool's first level where a rule reads them; the verify
    pass's draws) for every decoder but first-token redrafting (its pool under t0 when t0
    misses its guesses), the draft-free ones (the top-k of the verify pass's rows; the
    prompt's rows in the first round), and draft_rank and rerank, whose trees are chosen on
    the device and whose pools come with the draws: 1. On graphs (stood in), every pass of
    `ar` is a replay."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    out = tmp_path / "reads.md"
    assert _benchmark("host_reads").main(["--max-new-tokens", "8", "--budget", "8", "--top-k",
                                          "4", "--depth", "4", "--repeat", "1",
                                          "--deep-layers", "2", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    rows = [line.split("|")[1:-1] for line in lines
            if line.startswith("| ") and line.count("|") == 10 and "decoder" not in line]
    assert len(rows) == 19
    twin = [line.split("|")[1:-1] for line in lines  # the target's twin drafting: it accepts
            if line.startswith("| ") and line.count("|") == 6 and "decoder" not in line]
    assert len(twin) == 8 and all(float(row[2]) > 1 for row in twin), twin
    three = ("fts_redraft", "racer", "recycle")
    for draft, decoder, _, reads, waits, before, after, replays, launches in rows:
        assert float(replays) >= 1 and int(launches) > 0, (draft, decoder, replays, launches)
        if decoder.strip() == "ar":
            assert float(replays) == 1, replays
        once = decoder.strip() in ("ar", "draft_rank", "rerank")
        assert float(reads) <= (3 if decoder.strip() in three else 2), (draft, decoder, reads)
        assert float(reads) == 1 or not once, (draft, decoder, reads)
        assert float(waits) == 0, (draft, decoder, waits)
        # host time after reads: after the verify read (the walk, the commits) in every round,
        # and before the verify pass where a drafted decoder reads its pool (all but the two
        # whose trees are chosen on the device)
        assert float(after) > 0, decoder
        if draft.strip() != "-":
            assert (float(before) > 0) != once, (draft, decoder, before)


def test_draft_guesses_classify_and_score_positions_as_brute_force():
    """Copies are reply tokens whose bigram with the token before occurs in the prompt; tokens
    outside a draft vocabulary are neither; a hit is the draft's argmax at the exact context."""
    from targetrows.core.toy import ToyPair

    guesses = _benchmark("draft_guesses")
    prompt, reply = [5, 6, 7, 5], [6, 9, 6, 7, 3]
    assert guesses.position_kinds(prompt, reply, None) == ["copy", "new", "new", "copy", "new"]
    assert guesses.position_kinds(prompt, reply, np.array([3, 6, 7])) == [
        "copy", "outside", "new", "copy", "new"]
    pair = ToyPair(vocab_size=16, seed=3, closeness=0.7)
    prompt, reply = [1, 2, 3], []
    for j in range(6):  # the draft's own guess at even positions, a different token at odd ones
        guess = int(np.argmax(pair.draft_row(prompt + reply)))
        reply.append(guess if j % 2 == 0 else (guess + 1) % 16)
    hits = guesses.draft_hits(pair.target, pair.draft, prompt, reply)
    assert hits == [True, False, True, False, True, False]



def test_calibration_spread_predicts_and_measures_with_a_head_and_lookup(pair, head,
                                                                         prompts_file, tmp_path):
    """The calibration script on the tiny pair's target and head with prompt lookup mixed in:
    one measured value (the decoded prompts' tokens per round) and a prediction per placement,
    each within what a B=2 tree can commit."""
    spread = _benchmark("calibration_spread")
    out = tmp_path / "spread.md"
    assert spread.main(["--target", pair[0], "--draft", head, "--draft-lookup", "--prompts",
                        prompts_file, prompts_file, "--num-prompts", "2", "--budget", "2",
                        "--max-new-tokens", "8", "--out", str(out)]) == 0
    text = out.read_text()
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(spread.PLACEMENTS)
    assert all(1.0 <= float(r[4]) <= 3.0 for r in rows)
    assert "measured on 4 prompts (2 of each file" in text


def test_a_runs_predicted_speed_by_hand():
    """A run's prediction: the prompt's first pass, then rounds at the acceptance the cost
    model's choice predicted, priced by the part times given (the prompt's context's)."""
    from targetrows.core.pool import PoolShape
    from targetrows.cost.calibration import BudgetChoice
    from targetrows.cost.parttimes import PartTimes, PassCurve
    from targetrows.decoding.config import DecodeConfig

    parts = PartTimes(PassCurve((1, 9), (0.010, 0.018)), PassCurve((1, 41), (0.0021, 0.0061)), 100)
    settings = bench_plan.BenchSettings(decode=DecodeConfig(pool=PoolShape(4, 3)),
                                        decoders=("ar", "draft_rank"), budget=8)
    ar = {"method": "ar", "new_tokens": 20}
    assert bench_plan._predicted(ar, None, parts, 0.05, settings) == pytest.approx(
        20 / (0.05 + 0.2))
    choice = BudgetChoice(8, 2, (8,), (2,), ((0.0,),), ((2.0,),), ((8.0,),), parts, 100, 0.0)
    # depth 2: draft passes of 1 and 4 tokens (4.5 ms), a verify pass of 9 (18 ms): 2 tokens
    # per 22.5 ms, 10 rounds for 20 tokens
    dr = {"method": "draft_rank", "new_tokens": 20}
    assert bench_plan._predicted(dr, choice, parts, 0.05, settings) == pytest.approx(
        20 / (0.05 + 10 * 0.0225))


def test_goals_against_baselines_that_did_not_run_are_not_measured():
    """--no-hf: no HF baseline ran, so ar's goal against HF generate and the best decoder's
    against HF prompt lookup are unmeasured, not failed."""
    settings = bench_plan.BenchSettings(decoders=("ar", "fts"), budget=4)
    rows = [r for r in _rows() if not r["method"].startswith(("hf_", "peer:"))]
    for r in rows:
        r["same_as_hf_generate"] = ""
    found = bench_report.goals(bench_report.summarize(rows, settings), settings)
    met = {goal: ok for goal, _, ok in found}
    assert met["ar >= 0.95x HF generate (T=0)"] is None
    assert met["best decoder >= 2.0x HF prompt lookup (T=0)"] is None
    assert met["best decoder >= 1.4x our ar (T=0, draft alone)"] is False


def test_bench_at_batch_size_3_against_hf_batched_generate(pair, prompts_file, tmp_path):
    """--batch-size 3: every decoder decodes the prompts three at a time, beside HF's batched
    generate; at temperature 0 each prompt's tokens equal ar's, for every decoder (float32: in
    bfloat16 a batched product may round a near-tie the other way)."""
    target, draft = pair
    out = tmp_path / "results"
    code = main(["bench", "--target", target, "--draft", draft, "--prompts", prompts_file,
                 "--batch-size", "3", "--budget", "6", "--max-new-tokens", "8", "--top-k", "3",
                 "--depth", "3", "--dtype", "float32", "--out-dir", str(out), "--name", "batched"])
    assert code == 0
    rows = list(csv.DictReader(open(out / "batched.csv")))
    assert [r["method"] for r in rows] == ["hf_generate", *decoder_names(learned=False)]
    for r in rows:
        assert r["batch_size"] == "3" and r["prompts"] == "3"
        assert float(r["tokens_per_s"]) > 0 and 0 < int(r["new_tokens"]) <= 3 * 8
        if r["method"] != "hf_generate":
            assert float(r["same_as_ar"]) == 1.0, r["method"]
            assert float(r["sequences_per_pass"]) > 1.0, r["method"]
    assert "# targetrows bench at batch size 3" in (out / "batched.md").read_text()
