"""Temperature-0 drift (`targetrows.bench.drift`): where a run parts from the reference, the
target's top-2 gap there and how far rounding between pass shapes moves a row there."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from tiny_models import tiny_model

from targetrows.bench.drift import (
    MIN_TIE_STEPS,
    Parting,
    drift_summary,
    explain_parting,
    near_tie_steps,
    parting,
    rounding_step,
    row_spread,
)
from targetrows.core.tree import Tree
from targetrows.hf.model import HFModel


def test_parting_is_the_first_difference_or_where_a_run_stops():
    assert parting([1, 2, 3], [1, 2, 3]) is None
    assert parting([1, 2, 3], [1, 5, 3]) == 1
    assert parting([1, 2, 3], [1, 2]) == 2
    assert parting([], []) is None


def test_rounding_steps_are_the_spacing_of_the_dtype_at_that_size():
    bf16 = float(torch.finfo(torch.bfloat16).eps)
    assert rounding_step(22.875, bf16) == 0.125  # bfloat16 numbers in [16, 32) are 1/8 apart
    assert rounding_step(-3.0, bf16) == 2.0**-6
    a = torch.tensor(22.875, dtype=torch.bfloat16)
    assert float(torch.nextafter(a, torch.tensor(99.0, dtype=torch.bfloat16)) - a) == 0.125


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_row_spread_compares_the_same_row_across_pass_shapes(dtype):
    """The row at one context from a prefill and as a node of tree passes, against ar's step:
    within a few rounding steps of each other (rows at another context are over twenty times
    farther apart), and agreeing on the best token."""
    model = HFModel(tiny_model("llama", n_layers=2, dtype=dtype), name="t")
    ctx = [5, 17, 42, 9, 100, 7]
    spread = row_spread(model, ctx, sizes=(2, 8, 32))
    assert set(spread.steps) == {"prefill", "tree 2", "tree 8", "tree 32"}
    assert spread.same_argmax
    assert spread.max_steps < (64 if dtype == torch.bfloat16 else 1e3)
    other = model.logits(ctx[:-1] + [8], Tree.root_only(8), [0]).double()
    here = model.logits(ctx, Tree.root_only(ctx[-1]), [0]).double()
    assert float((other - here).abs().max()) / spread.step > 20 * max(spread.max_steps, 1)
    assert near_tie_steps([spread]) == max(MIN_TIE_STEPS, 2 * spread.max_steps)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_row_spread_in_a_batch_takes_the_row_from_a_lane_beside_others(dtype):
    """With batch_size 4 the same row also comes from lane 0 of batched passes whose other lanes
    sit at other contexts: padded and masked, it stays the same row (to float64's rounding;
    within bfloat16's spread, and the same best token)."""
    model = HFModel(tiny_model("llama", n_layers=2, dtype=dtype), name="t")
    ctx = [5, 17, 42, 9, 100, 7]
    spread = row_spread(model, ctx, sizes=(2, 8), batch_size=4)
    assert set(spread.steps) == {"prefill", "tree 2", "tree 8", "batch 4 step", "batch 4 tree 2",
                                 "batch 4 tree 8"}
    assert spread.same_argmax
    assert spread.max_steps < (64 if dtype == torch.bfloat16 else 1e3)
    assert row_spread(model, ctx, sizes=(2, 8), batch_size=4) == spread  # seeded: repeatable
    p = explain_parting(model, ctx[:3], ctx[3:], [ctx[3], 11], batch_size=4)
    assert p.threshold_steps == near_tie_steps([row_spread(model, ctx[:4], batch_size=4)])


def test_a_parting_names_its_gap_against_the_spread_measured_there():
    model = HFModel(tiny_model("qwen3", n_layers=2, dtype=torch.bfloat16), name="t")
    prompt, reference = [5, 17, 42], [3, 9, 250]
    assert explain_parting(model, prompt, reference, list(reference)) is None
    short = explain_parting(model, prompt, reference, reference[:2])
    assert short.position == 2 and short.gap is None and not short.near_tie
    p = explain_parting(model, prompt, reference, [3, 11, 250])
    assert p.position == 1 and p.dtype == "torch.bfloat16"
    row = model.logits(prompt + [3], Tree.root_only(3), [0]).float()[0]
    gap, best = abs(float(row[9] - row[11])), float(row.max())
    assert p.gap == pytest.approx(gap)
    assert p.gap_steps == pytest.approx(gap / rounding_step(best, 2.0**-7))
    assert p.threshold_steps >= MIN_TIE_STEPS
    assert p.near_tie == (p.gap_steps <= p.threshold_steps)


def test_drift_summary_counts_identical_runs_near_ties_and_real_differences():
    tie, real = Parting(4, 0.1, 1.0, 2.0, "bf16"), Parting(2, 3.0, 96.0, 2.0, "bf16")
    records = [dict(dtype="bf16", decoder="fts", parting=p) for p in (None, tie, real, None)]
    records += [dict(dtype="bf16", decoder="ar", parting=None)]
    (fts, ar) = drift_summary(records)
    assert (fts["runs"], fts["identical"], fts["near_tie"], fts["beyond"]) == (4, 2, 1, 1)
    assert fts["max_gap_steps"] == 96.0 and fts["first_parting"] == 2
    assert (ar["runs"], ar["identical"], ar["first_parting"]) == (1, 1, None)
    assert np.isclose(tie.gap_steps, 1.0) and tie.near_tie and not real.near_tie


def test_drift_command_compares_answers_with_ars_turn_by_turn(tmp_path, monkeypatch):
    """`targetrows decode` writes ar's and fts's answers (float32: identical); `targetrows drift`
    finds none parted, then finds a planted parting in a second turn and calls it no near-tie
    (the token planted is far from the target's best); an answer decoded in batches is measured
    against batched passes too."""
    import json

    from tiny_models import save_tiny_pair

    from targetrows.cli import main

    target, draft = save_tiny_pair(tmp_path, "llama")
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in [
        {"question_id": 1, "category": "mt_bench", "turns": ["hi there", "and then?"]},
        {"question_id": 2, "category": "mt_bench", "turns": ["count to ten"]}]))
    common = ["--target", target, "--draft", draft, "--dtype", "float32", "--prompts",
              str(prompts), "--max-new-tokens", "6", "--no-progress"]
    ar, fts = tmp_path / "ar.jsonl", tmp_path / "fts.jsonl"
    assert main(["decode", *common, "--decoder", "ar", "--out", str(ar)]) == 0
    assert main(["decode", *common, "--decoder", "fts", "--budgets", "4", "--out", str(fts)]) == 0
    out = tmp_path / "drift.csv"
    drift = ["drift", "--target", target, "--dtype", "float32", "--prompts", str(prompts),
             "--reference", str(ar), "--out", str(out)]
    assert main([*drift, "--answers", str(fts)]) == 0
    rows = list(__import__("csv").DictReader(open(out)))
    assert [(r["decoder"], r["question_id"], r["identical"]) for r in rows] == [
        ("fts", "1", "True"), ("fts", "2", "True")]

    records = [json.loads(line) for line in fts.read_text().splitlines()]
    reference = [json.loads(line) for line in ar.read_text().splitlines()]
    second = reference[0]["token_ids"][1]
    planted = 0 if second[2] != 0 else 1
    records[0]["token_ids"][1] = second[:2] + [planted] + second[3:]
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main([*drift, "--answers", str(tampered)]) == 0
    rows = list(__import__("csv").DictReader(open(out)))
    first = rows[0]
    assert (first["identical"], first["turn"], first["position"]) == ("False", "1", "2")
    assert first["near_tie"] == "False" and float(first["gap_steps"]) > 1e3
    assert rows[1]["identical"] == "True"
    from targetrows.bench import answer_drift

    batch_sizes = []

    def explain(*args):
        batch_sizes.append(args[4])
        return explain_parting(*args)

    monkeypatch.setattr(answer_drift, "explain_parting", explain)
    records[0]["batch_size"] = 3
    tampered.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main([*drift, "--answers", str(tampered)]) == 0
    assert batch_sizes == [3]
    # answers without their reference are refused by name
    assert main(["drift", "--target", target, "--prompts", str(prompts), "--reference",
                 str(ar), "--answers", str(ar), "--out", str(out)]) == 0  # ar's own: left out
    del reference[1]
    ar.write_text("".join(json.dumps(r) + "\n" for r in reference))
    assert main([*drift, "--answers", str(fts)]) == 2
