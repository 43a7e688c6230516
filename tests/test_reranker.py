"""Learned rerankers: trained on row logs, cross-fitted by prompt (no prompt is scored by a model
that saw it), stored as JSON and refused by name when malformed or for another rule, and run
by every command like any rule (their scores against brute force: test_score.py; their
decoders' losslessness: test_lossless_toy.py and the Hugging Face tests)."""

import dataclasses
import json

import numpy as np
import pytest
from test_score import toy_log

from targetrows.cli import main
from targetrows.core.rules import learned
from targetrows.core.rules.learned import STALE_FEATURES, Reranker
from targetrows.decoding.config import DecodeConfig
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.score import score_log
from targetrows.train import reranker as rr


@pytest.fixture(scope="module")
def logs():
    """Two toy row logs (temperature 1) of eight prompts each, under two task names."""
    out = []
    for task in ("a", "b"):
        log = toy_log(1.0, n_prompts=8, new=10, closeness=0.7)
        log.seg_task = np.array([task] * len(log.seg_task), dtype=object)
        out.append(log)
    return out


def scrambled(log, keys: set[str], seed: int = 0):
    """`log` with the target's rows at the prompts `keys` shuffled, pool by pool (each node's
    edge probability moved to another node of its pool): other data for those prompts only."""
    rng = np.random.default_rng(seed)
    prompt = np.array([f"{t}/{q}" for t, q in zip(log.seg_task, log.seg_question, strict=True)])
    edge = log.edge_p.copy()
    for r in np.flatnonzero(np.isin(prompt[log.rec_segment], list(keys))):
        lo, hi = log.pool_offsets[r], log.pool_offsets[r + 1]
        edge[lo:hi] = edge[lo:hi][rng.permutation(hi - lo)]
    return dataclasses.replace(log, edge_p=edge)


@pytest.mark.parametrize("rule", ["learned_rerank", "learned_stale_rerank"])
def test_cross_fitting_keeps_each_prompt_out_of_its_model(logs, rule):
    """Fold k's model never reads fold k's prompts: scrambling their rows leaves it unchanged
    to the bit, while the model of the other fold, which trained on them, moves."""
    config = rr.RerankerConfig(budgets=(1, 2, 4), folds=2, seed=3, sweeps=2)
    model, meta = rr.train_reranker(logs, rule, config)
    keys = sorted({k for log in logs for k in rr._Pools(log).key})
    assert sorted(model.fold_of) == keys and meta["prompts"] == len(keys)
    assert set(model.fold_of.values()) == {0, 1}
    moved = 0
    for k in range(2):
        held = {p for p, f in model.fold_of.items() if f == k}
        other, _ = rr.train_reranker([scrambled(log, held) for log in logs], rule, config)
        assert other.fold_of == model.fold_of and other.folds[k] == model.folds[k]
        moved += other.folds[1 - k] != model.folds[1 - k] or other.weights != model.weights
        assert model.for_prompt(sorted(held)[0]).weights == model.folds[k]
    assert moved  # the scrambled rows did reach the models that trained on them
    assert model.for_prompt("unseen/prompt").weights == model.weights
    again, _ = rr.train_reranker(logs, rule, config)
    assert (again.weights, again.folds, again.fold_of) == (model.weights, model.folds,
                                                          model.fold_of)  # seeded


def test_the_fit_never_falls_below_its_start_on_its_own_prompts(logs):
    budgets = np.asarray((1, 2, 4))
    keys = {k for log in logs for k in rr._Pools(log).key}
    data = rr._data(logs, keys, STALE_FEATURES, budgets)
    start = rr._start("learned_stale_rerank", STALE_FEATURES, data, budgets)
    fitted = rr.fit(data, STALE_FEATURES, start, budgets, sweeps=3)
    assert data.objective(fitted, budgets) >= data.objective(start, budgets)


def test_a_search_that_does_not_hold_out_of_sample_leaves_the_baseline(logs, monkeypatch):
    """fit_checked keeps the search's weights exactly when they beat the rule's baseline on
    training prompts they were not fitted on (two inner folds, each fitted on the other), and
    below four prompts, where nothing can be held out, always keeps the baseline."""
    from targetrows.core.rules.learned import ALL_FEATURES

    keys = sorted({k for log in logs for k in rr._Pools(log).key})
    budgets = np.asarray((1, 2, 4))
    config = rr.RerankerConfig(budgets=(1, 2, 4), sweeps=2)
    rule, names = "learned_rerank", ALL_FEATURES
    start = np.zeros(len(names))
    start[names.index("root_logp")] = 1.0

    def held_out_gain(search) -> float:  # the gate, worked out here from the inner folds
        inner = learned.prompt_folds(keys, 2, config.seed + 1)
        gain = 0.0
        for j in range(2):
            train = rr._data(logs, {k for k, f in inner.items() if f != j}, names, budgets)
            test = rr._data(logs, {k for k, f in inner.items() if f == j}, names, budgets)
            gain += test.objective(search(train), budgets) - test.objective(start, budgets)
        return gain

    real = rr.fit
    searches = {"the baseline's opposite": lambda data, *a: -start,
                "the baseline itself": lambda data, *a: start.copy(),
                "the real search": lambda data, *a: real(data, names, start, budgets, 2)}
    verdicts = set()
    for name, search in searches.items():
        monkeypatch.setattr(rr, "fit", search)
        weights, fitted = rr.fit_checked(logs, keys, rule, names, budgets, config)
        assert fitted == (held_out_gain(search) > 1e-9), name
        everything = rr._data(logs, set(keys), names, budgets)
        assert np.array_equal(weights, search(everything) if fitted else start), name
        verdicts.add(fitted)
    assert verdicts == {True, False}  # the opposite never holds out of sample; the search does
    monkeypatch.setattr(rr, "fit", lambda data, *a: 2 * start)  # would be kept, but no holdout
    weights, fitted = rr.fit_checked(logs, keys[:3], rule, names, budgets, config)
    assert not fitted and np.array_equal(weights, start)


def test_model_files_are_json_and_a_bad_one_is_refused_by_name(tmp_path):
    model = Reranker("learned_stale_rerank", ("draft_logp", "stale_logp"), (1.0, 0.5),
                     folds=((1.0, 0.0), (0.5, 0.5)), fold_of={"t/q0": 0, "t/q1": 1})
    path = tmp_path / "m.json"
    model.save(str(path))
    assert Reranker.load(str(path)) == model
    assert json.loads(path.read_text())["format"] == "targetrows-reranker"  # plain JSON
    doc = json.loads(path.read_text())
    for change, message in [
        ({"format": "other"}, "not a targetrows-reranker file"),
        ({"version": 9}, "version 9"),
        ({"features": ["draft_logp", "magic"]}, "unknown features \\['magic'\\]"),
        ({"features": ["root_logp", "draft_logp"]}, "reads the root row"),
        ({"weights": [1.0]}, "1 weights for 2 features"),
        ({"fold_of": {"t/q0": 5}}, "fold_of names a fold"),
        ({"fold_of": ["t/q0", 0]}, "fold_of must map prompt keys"),
        ({"fold_of": {"t/q0": 0.5}}, "the fold 0.5, not a whole number"),
        ({"rule": "target_rerank"}, "is for a learned rule"),
    ]:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(dict(doc, **change)))
        with pytest.raises(ValueError, match=message) as err:
            Reranker.load(str(bad))
        assert str(bad) in str(err.value) or "reranker for" in str(err.value)
    (tmp_path / "torn.json").write_text(path.read_text()[:40])
    with pytest.raises(ValueError, match="not JSON"):
        Reranker.load(str(tmp_path / "torn.json"))
    with pytest.raises(FileNotFoundError, match="train-reranker"):
        Reranker.load(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="trained for 'learned_stale_rerank'"):
        DecodeConfig("lrerank", reranker=model)  # lrerank runs learned_rerank
    with pytest.raises(ValueError, match="give one"):
        DecodeConfig("lrerank_stale")


def written(logs, folder) -> list[str]:
    """`logs` written as row-log files in `folder`: their paths."""
    paths = [str(folder / f"log{i}.npz") for i in range(len(logs))]
    for path, log in zip(paths, logs, strict=True):
        rowlog.write(path, log)
    return paths


def test_train_reranker_command_and_the_commands_that_read_it(logs, tmp_path, capsys):
    paths = written(logs, tmp_path)
    out = tmp_path / "rr"
    assert main(["train-reranker", *paths, "--budgets", "1", "2", "4", "--n-boot", "200",
                 "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "learned_stale_rerank | draft_rank | 2 |" in report and "us." in report
    files = [str(out / "learned_rerank.json"), str(out / "learned_stale_rerank.json")]
    table = tmp_path / "scores.csv"
    assert main(["score", paths[0], "--budgets", "2", "--reranker", *files,
                 "--out", str(table)]) == 0
    rules = set(np.loadtxt(table, delimiter=",", skiprows=1, usecols=6, dtype=str))
    assert {"learned_rerank", "learned_stale_rerank", "draft_rank"} <= rules
    # scored out of fold: the same as scoring with each prompt's fold model
    models = {r: Reranker.load(f) for r, f in zip(("learned_rerank", "learned_stale_rerank"),
                                                   files, strict=True)}
    rule = "learned_stale_rerank"
    direct = score_log(logs[0], [2], rules=(rule,), rerankers=models)
    prompts = np.array([f"{t}/{p}" for t, p in zip(direct["task"], direct["prompt_id"],
                                                    strict=True)])
    model = models[rule]
    for k in range(len(model.folds)):  # fold k's prompts: as scored by fold k's model alone
        alone = Reranker(rule, model.features, model.folds[k])
        by_fold = score_log(logs[0], [2], rules=(rule,), rerankers={rule: alone})
        mine = np.isin(prompts, [p for p, f in model.fold_of.items() if f == k])
        assert mine.any()
        np.testing.assert_array_equal(direct["accepted"][mine], by_fold["accepted"][mine])
    one = tmp_path / "one.npz"
    rowlog.write(str(one), toy_log(1.0, n_prompts=1, new=4))
    assert main(["train-reranker", str(one), "--out", str(tmp_path / "x")]) == 2
    assert "cannot be cross-fitted" in capsys.readouterr().err
