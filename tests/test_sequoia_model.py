"""Sequoia as a registered rule: online selection (`Rule.select`) and offline scoring
(`Rule.expected`, the row-log scorer) give the same trees on logged pools; its acceptance
vector is fitted on row logs as Sequoia estimates it, cross-fitted by prompt, stored as JSON
and refused by name when malformed; the commands fit, score and decode with it. (The DP and
the fill against exhaustive search and Sequoia's code: test_sequoia.py; its decoder's
losslessness: test_lossless_toy.py and the Hugging Face tests.)"""

import json

import numpy as np
import pytest
from test_reranker import logs, scrambled, written  # noqa: F401 (a fixture)
from test_score import toy_log

from targetrows import Tree, expected_accepted, expected_accepted_greedy
from targetrows.cli import main
from targetrows.core.pool import PoolShape
from targetrows.core.rules.fitted import load_fitted
from targetrows.core.rules.sequoia import optimal_shape, sibling_ranks
from targetrows.core.rules.sequoia_model import AcceptanceVector
from targetrows.core.toy import ToyPair
from targetrows.cost.calibration import acceptance_curve
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.registry import get_rule
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.score import score_log
from targetrows.train import reranker as rr
from targetrows.train.sequoia import fit_acceptance

BUDGETS = [1, 2, 3, 5, 8, 13, 40]
RISING = AcceptanceVector("sequoia", (0.5, 0.1, 0.3, 0.05))  # rank 3 above rank 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("model", [RISING, AcceptanceVector("sequoia", (0.7, 0.2, 0.1))])
def test_scored_trees_are_the_trees_select_picks(temperature, model):
    """For every logged pool and budget, the scorer's accepted and nodes are those of the tree
    `select` picks online from the same pool, scored node by node by the core."""
    log = toy_log(temperature, n_prompts=3, new=8)
    table = score_log(log, BUDGETS, rules=("sequoia",), rerankers={"sequoia": model})
    rule = get_rule("sequoia")
    smaller = 0
    for i, r in enumerate(np.flatnonzero(log.rec_scored)):
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        tokens, parents, logq, edge = log.pool(r)
        pool = Tree(tokens, parents)
        for j, b in enumerate(BUDGETS):
            chosen = rule.select(pool, logq, b, reranker=model)
            tree = pool.subtree(chosen)
            want = (expected_accepted_greedy(tree, log.trajectory(s)[t:].tolist())
                    if temperature == 0 else expected_accepted(tree, edge[chosen]))
            row = i * len(BUDGETS) + j
            assert table["accepted"][row] == pytest.approx(want, abs=1e-12)
            assert table["nodes"][row] == len(chosen) - 1 <= b
            smaller += len(chosen) - 1 < min(b, len(pool) - 1)
    assert smaller  # some shapes ask for nodes the pool lacks: the tree is smaller than B


def test_select_fills_the_optimal_shape_from_the_pool():
    """By hand: the online tree is the shape's nodes the pool holds, by draft rank among
    siblings, each pool's depth the shape's limit."""
    pair = ToyPair(vocab_size=16, seed=1, closeness=0.8)
    from targetrows.core.pool import expand

    pool, logq = expand(pair.draft_row, [1, 2, 3], top_k=4, depth=3)
    ranks = sibling_ranks(pool.parents, logq)[0]
    for b in (3, 7, 12):
        shape = optimal_shape(RISING.p, b, 3)
        chosen = get_rule("sequoia").select(pool, logq, b, reranker=RISING)
        path_ranks = {tuple(_ranks_along(pool, ranks, n)) for n in chosen[1:]}
        shape_paths = {tuple(_ranks_along_shape(shape, j)) for j in range(1, b + 1)}
        assert path_ranks <= shape_paths  # every verified node is a shape node
        missing = shape_paths - path_ranks  # and every shape node left out is not in the pool
        for ranks_path in missing:
            assert not _in_pool(pool, ranks, ranks_path)


def _ranks_along(pool, ranks, node):
    out = []
    while node > 0:
        out.append(int(ranks[node]))
        node = int(pool.parents[node])
    return out[::-1]


def _ranks_along_shape(shape, j):
    out = []
    while j > 0:
        out.append(int(shape.ranks[j]))
        j = int(shape.parents[j])
    return out[::-1]


def _in_pool(pool, ranks, path):
    node = 0
    for r in path:
        kids = [c for c in pool.children(node) if ranks[c] == r]
        if not kids:
            return False
        node = kids[0]
    return True


def test_calibration_predicts_each_budgets_own_shape():
    """--budget auto scores the rule's tree at each budget (`acceptance_curve`): shapes are not
    nested, so the union of trees it verifies holds each, and each candidate depth keeps its
    own limit; at one context the predicted trees are those select picks from that pool."""
    from targetrows.core.pool import expand

    pair = ToyPair(vocab_size=24, seed=5, closeness=0.9)
    ctx, budgets = [4, 7, 1], [1, 3, 6, 12, 20]
    config = DecodeConfig("sequoia", budget=6, pool=PoolShape(3, 3), reranker=RISING)
    committed, nodes = acceptance_curve(pair.target, pair.draft, ctx, budgets, config, 1,
                                        depths=[1, 2, 3])
    pool, logq = expand(pair.draft_row, ctx, top_k=3, depth=3)
    rule = get_rule("sequoia")
    for row, depth in enumerate([1, 2, 3]):
        keep = np.flatnonzero(pool.depth <= depth)
        sub, sublogq = pool.subtree(keep), logq[keep]
        trees = [sub.subtree(rule.select(sub, sublogq, b, reranker=RISING)) for b in budgets]
        assert nodes[row].tolist() == [t.budget for t in trees]
        greedy = []
        for _ in range(depth + 1):
            greedy.append(int(np.argmax(pair.target_row(ctx + greedy))))
        want = [expected_accepted_greedy(t, greedy) + 1 for t in trees]
        assert committed[row].tolist() == pytest.approx(want)


def test_the_acceptance_vector_is_sequoias_estimate_cross_fitted(logs):  # noqa: F811
    """p[k - 1]: the mean reach of each scored pool's rank-k first-level node, over the
    training prompts (brute force); fold k's vector never reads fold k's prompts."""
    model, meta = fit_acceptance(logs, folds=2, seed=3)
    sums, counts = {}, {}
    for log in logs:
        for r in np.flatnonzero(log.rec_scored):
            s = int(log.rec_segment[r])
            key = f"{log.seg_task[s]}/{log.seg_question[s]}"
            tokens, parents, logq, edge = log.pool(r)
            ranks = sibling_ranks(parents, logq)[0]
            row = np.zeros(4)
            for n in np.flatnonzero(parents == 0):
                row[ranks[n] - 1] += edge[n]
            sums[key] = sums.get(key, 0) + row
            counts[key] = counts.get(key, 0) + 1
    keys = sorted(sums)
    assert sorted(model.fold_of) == keys and meta["positions"] == sum(counts.values())
    np.testing.assert_allclose(model.p, sum(sums.values()) / sum(counts.values()))
    for k in range(2):
        train = [key for key in keys if model.fold_of[key] != k]
        np.testing.assert_allclose(model.folds[k], sum(sums[key] for key in train)
                                   / sum(counts[key] for key in train))
        held = {p for p, f in model.fold_of.items() if f == k}
        other, _ = fit_acceptance([scrambled(log, held) for log in logs], folds=2, seed=3)
        assert other.folds[k] == model.folds[k] and other.p != model.p
        assert model.for_prompt(sorted(held)[0]).p == model.folds[k]
    greedy, _ = fit_acceptance([toy_log(0.0, n_prompts=4, new=8)], folds=2)
    assert sum(greedy.p) <= 1.0 + 1e-12  # one argmax per position: shares of positions


def test_acceptance_files_are_json_and_a_bad_one_is_refused_by_name(tmp_path):
    model = AcceptanceVector("sequoia", (0.6, 0.2), folds=((0.5, 0.3), (0.7, 0.1)),
                             fold_of={"t/q0": 0, "t/q1": 1}, meta={"temperature": 1.0})
    path = tmp_path / "sequoia.json"
    model.save(str(path))
    assert AcceptanceVector.load(str(path)) == model == load_fitted(str(path))
    assert model.digest == AcceptanceVector.load(str(path)).digest
    doc = json.loads(path.read_text())
    assert doc["format"] == "targetrows-acceptance"
    for change, message in [
        ({"format": "targetrows-reranker"}, "reranker file .*'features'"),
        ({"format": "other"}, "neither a targetrows-reranker nor a targetrows-acceptance"),
        ({"version": 9}, "version 9"),
        ({"rule": "draft_rank"}, "for rule 'sequoia', not 'draft_rank'"),
        ({"p": [0.6, 1.5]}, "must be probabilities"),
        ({"p": ["0.6", 0.2]}, "a list of probabilities"),
        ({"folds": [[0.5, 0.3]]}, "fold_of names a fold"),
        ({"folds": [[0.5], [0.7, 0.1]]}, "a fold has 1 ranks"),
        ({"fold_of": {"t/q0": 0.5}}, "the fold 0.5, not a whole number"),
        ({"p": None}, "a list of probabilities"),
    ]:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(dict(doc, **change)))
        with pytest.raises(ValueError, match=message) as err:
            load_fitted(str(bad))
        assert str(bad) in str(err.value)
    with pytest.raises(ValueError, match="not a targetrows-acceptance file"):
        AcceptanceVector.load(_write(tmp_path, dict(doc, format="x")))
    (tmp_path / "torn.json").write_text(path.read_text()[:30])
    with pytest.raises(ValueError, match="not JSON"):
        load_fitted(str(tmp_path / "torn.json"))
    with pytest.raises(FileNotFoundError, match="train-reranker"):
        load_fitted(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="runs rule 'learned_rerank'"):
        DecodeConfig("lrerank", reranker=model)
    with pytest.raises(ValueError, match="none was given"):
        get_rule("sequoia").select(Tree([0, 1], [-1, 0]), np.array([0.0, -1.0]), 1)


def _write(tmp_path, doc) -> str:
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_train_reranker_fits_sequoia_and_the_commands_read_it(logs, tmp_path):  # noqa: F811
    paths = written(logs, tmp_path)
    out = tmp_path / "models"
    assert main(["train-reranker", *paths, "--rules", "sequoia", "--budgets", "1", "2", "4",
                 "--n-boot", "200", "--out", str(out)]) == 0
    model = AcceptanceVector.load(str(out / "sequoia.json"))
    fitted, _ = fit_acceptance([rowlog.read(p) for p in paths], 2, 0)
    assert (model.p, model.folds, dict(model.fold_of)) == (fitted.p, fitted.folds,
                                                           dict(fitted.fold_of))
    report = (out / "report.md").read_text()
    assert "| rank | p |" in report and "sequoia | draft_rank | 2 |" in report
    table = tmp_path / "scores.csv"
    assert main(["score", paths[0], "--budgets", "2", "4", "--reranker", str(out / "sequoia.json"),
                 "--out", str(table)]) == 0
    assert "sequoia" in set(np.loadtxt(table, delimiter=",", skiprows=1, usecols=6, dtype=str))
    # scored out of fold: each prompt with the vector fitted without it
    direct = score_log(logs[0], [2, 4], rules=("sequoia",), rerankers={"sequoia": model})
    prompts = np.repeat([f"{t}/{p}" for t, p in zip(direct["task"][::2], direct["prompt_id"][::2],
                                                     strict=True)], 2)
    for k in range(len(model.folds)):
        alone = AcceptanceVector("sequoia", model.folds[k])
        by_fold = score_log(logs[0], [2, 4], rules=("sequoia",), rerankers={"sequoia": alone})
        mine = np.isin(prompts, [p for p, f in model.fold_of.items() if f == k])
        assert mine.any()
        np.testing.assert_array_equal(direct["accepted"][mine], by_fold["accepted"][mine])
    assert rr.MODEL_RULES[-1] == "sequoia"



def test_a_pools_depth_limit_is_its_drafted_depth_where_the_batch_says():
    """A pool that holds only part of what was drafted (calibration's union of trees) is shaped
    for the depth it was drafted to (`PoolBatch.levels`), not for its deepest node: here the
    deep chain's nodes are missing, so the tree keeps its first node only."""
    import dataclasses

    from targetrows.core.rules.batch import PoolBatch
    from targetrows.core.rules.sequoia import shape_of_pools

    pool = Tree([0, 1, 2, 3], [-1, 0, 0, 0])
    batch = PoolBatch.of_pool(pool, np.log([1.0, 0.6, 0.3, 0.1]))
    p = (0.9, 0.05, 0.01)
    assert np.flatnonzero(shape_of_pools(batch, p, 3)[0]).tolist() == [0, 1, 2, 3]
    deep = dataclasses.replace(batch, levels=np.array([3]))
    assert np.flatnonzero(shape_of_pools(deep, p, 3)[0]).tolist() == [0, 1]
