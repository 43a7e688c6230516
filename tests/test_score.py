"""Scoring a row log: the vectorised scorer against a brute-force one built from each rule's
definition written out node by node (tests/brute_rules.py) and the core's Tree and
expected_accepted, pool by pool; and against online draft_rank decoding."""

import dataclasses

import brute_rules as brute
import numpy as np
import pytest

from targetrows import expected_accepted, expected_accepted_greedy
from targetrows.cli import main
from targetrows.core.pool import PoolShape
from targetrows.core.rules.batch import top_order
from targetrows.core.toy import ToyPair
from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import rule_names
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.record import RecordConfig, record_prompt
from targetrows.rowlog.score import read_table, score_log, write_table

BUDGETS = [1, 2, 3, 5, 8, 13, 200]


def toy_log(temperature, stride=1, top_k=4, depth=4, n_prompts=4, new=12, stop_ids=(),
            vocab=16, closeness=0.85, prompt_len=4):
    pair = ToyPair(vocab, seed=3, closeness=closeness)
    config = RecordConfig(temperature=temperature, stride=stride,
                          max_new_tokens=new, root_top=vocab, seed=0,
                          stop_ids=frozenset(stop_ids), pool=PoolShape(top_k=top_k, depth=depth))
    rng = np.random.default_rng(1)
    segments = []
    for i in range(n_prompts):
        prompt = rng.integers(0, vocab, prompt_len - (i == 0) * (prompt_len - 1)).tolist()
        seg = record_prompt(pair.target, pair.draft, prompt, config, seed=10 + i)
        segments.append(dict(seg, question=f"q{i // 2}", task=f"task{i % 2}", turn=i % 2))
    header = dict(temperature=float(temperature), depth=depth, top_k=top_k, stride=stride,
                  target="toy-t", draft="toy-d", stop_ids=sorted(stop_ids), complete=True)
    return rowlog.from_segments(header, segments)


def dense_root_row(log, r, vocab):
    """The full root row from the sparse one (root_top covers the whole toy vocabulary)."""
    tokens, probs = log.root_row(r)
    row = np.zeros(vocab)
    row[tokens] = probs
    assert len(np.unique(tokens)) == vocab
    return row


def accept(tree, edge, cont, greedy):
    return expected_accepted_greedy(tree, cont) if greedy else expected_accepted(tree, edge)


def brute_force(log, budgets, vocab):
    """{(segment, position, rule, budget): (accepted, nodes, committed)} from the core, one pool
    and one budget at a time."""
    greedy = log.header["temperature"] == 0
    out = {}
    for r in np.flatnonzero(log.rec_scored):
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        traj = log.trajectory(s).tolist()
        tokens, parents, logq, edge = log.pool(r)
        pool = Tree(tokens, parents)
        t0 = traj[t]
        stop = bool(log.seg_stopped[s]) and t == len(traj) - 1
        stale = log.stale(r).astype(np.float64)
        nxt = np.flatnonzero((log.rec_segment == s) & (log.rec_position == t + 1))
        for b in budgets:
            def score(sel, cont=traj[t:], e=edge, p=pool):
                return accept(p.subtree(sel), e[sel], cont, greedy), len(sel) - 1

            a, n = score(np.array(brute.draft_rank(pool, logq, b)))
            out[s, t, "draft_rank", b] = (a, n, a + 1)
            root = dense_root_row(log, r, vocab)
            with np.errstate(divide="ignore"):
                by_token = {int(tok): np.log(root[tok]) for tok in pool.tokens[pool.children(0)]}
                stale_by_token = {int(tok): np.log(p) for tok, p in
                                  zip(pool.tokens[pool.children(0)], stale, strict=True)}
            a, n = score(np.array(brute.rerank(pool, logq, b, by_token)))
            out[s, t, "target_rerank", b] = (a, n, a + 1)
            if np.isnan(stale).any():
                a, n = score(np.array(brute.draft_rank(pool, logq, b)))
            else:
                a, n = score(np.array(brute.rerank(pool, logq, b, stale_by_token)))
            out[s, t, "stale_rerank", b] = (a, n, a + 1)
            if stop:
                for rule in ("first_token", "first_token_redraft", "pearl"):
                    out[s, t, rule, b] = (0.0, 0, 1.0)
                continue
            ntok, npar, nlogq, nedge = log.pool(int(nxt[0]))
            npool = Tree(ntok, npar)
            a, n = score(np.array(brute.draft_rank(npool, nlogq, b)), traj[t + 1 :], nedge, npool)
            out[s, t, "first_token_redraft", b] = (a, n, a + 2)
            for rule, kept in (("pearl", brute.pearl(pool, logq, b, t0)),
                               ("first_token", brute.first_token(pool, logq, b, t0))):
                tokens, parents, at = brute.tree_after(pool, kept, t0)
                tree = Tree(tokens, parents)
                tedge = np.r_[1.0, edge[at[1:]]]
                a = accept(tree, tedge, traj[t + 1 :], greedy)
                out[s, t, rule, b] = (a, tree.budget, a + 2)
    return out


def check_against_brute_force(log, vocab=16):
    table = score_log(log, BUDGETS, rules=rule_names(learned=False))  # the draft-free: their own file
    expect = brute_force(log, BUDGETS, vocab)
    seg_of = {(q, int(u)): i for i, (q, u) in enumerate(
        zip(log.seg_question, log.seg_turn, strict=True))}
    assert len(table["rule"]) == len(expect)
    for i in range(len(table["rule"])):
        s = seg_of[table["prompt_id"][i], int(table["turn"][i])]
        key = (s, int(table["position"][i]), table["rule"][i], int(table["budget"][i]))
        acc, nodes, committed = expect[key]
        assert table["accepted"][i] == pytest.approx(acc, rel=1e-9, abs=1e-12), key
        assert table["nodes"][i] == nodes, key
        assert table["committed"][i] == pytest.approx(committed, rel=1e-9, abs=1e-12), key
    return table


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_scores_match_brute_force(temperature):
    log = toy_log(temperature)
    table = check_against_brute_force(log)
    assert set(table["rule"]) == set(rule_names(learned=False))
    assert table["accepted"].max() > 1  # the draft is close enough for deep acceptance


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_stride_and_stops_match_brute_force(temperature):
    # stride 3 logs the pool at t + 1 for first_token; stop token 5 ends some trajectories
    log = toy_log(temperature, stride=3, new=15, stop_ids=(5,), n_prompts=6)
    assert log.seg_stopped.any() and (~log.rec_scored).any()
    check_against_brute_force(log)


def test_pools_of_different_sizes_are_padded():
    a, b = toy_log(1.0, top_k=3, n_prompts=2), toy_log(1.0, top_k=5, n_prompts=2)
    b.seg_question = np.array(["q8", "q9"])
    log = rowlog.concat([a, b], a.header)
    assert len(np.unique(np.diff(log.pool_offsets))) == 2
    check_against_brute_force(log)


def test_greedy_scores_are_counts_and_reach_the_depth():
    table = score_log(toy_log(0.0, closeness=0.99), [200], rules=rule_names(learned=False))
    assert np.array_equal(table["accepted"], np.round(table["accepted"]))
    assert table["accepted"].max() == 4  # the whole depth of the pool matched


def test_top_order_breaks_ties_like_a_stable_sort():
    rng = np.random.default_rng(0)
    score = rng.integers(-4, 3, (500, 40)).astype(float)  # many ties at every cut
    score[rng.random(score.shape) < 0.1] = -np.inf
    for k in (1, 3, 10, 39, 40):
        want = np.argsort(-score, axis=1, kind="stable")[:, :k]
        assert np.array_equal(top_order(score, k), want), k


def test_bad_budgets_and_rules():
    log = toy_log(1.0, n_prompts=1, new=3)
    for budgets in ([0], [], [2.5]):
        with pytest.raises(ValueError, match="budgets"):
            score_log(log, budgets)
    with pytest.raises(ValueError, match="unknown rules"):
        score_log(log, [2], rules=("magic",))


def test_table_round_trip_and_cli(tmp_path):
    log = toy_log(1.0, n_prompts=2, new=5)
    path = tmp_path / "log.npz"
    rowlog.write(path, log)
    out = tmp_path / "table.csv"
    assert main(["score", str(path), "--budgets", "2", "8", "--out", str(out)]) == 0
    table = read_table(str(out))
    expect = score_log(rowlog.read(path), [2, 8])
    assert list(table) == list(expect)
    for k in expect:
        assert np.array_equal(table[k], expect[k]), k
    write_table(expect, str(tmp_path / "table.npz"))
    again = read_table(str(tmp_path / "table.npz"))
    assert all(np.array_equal(again[k], expect[k]) for k in expect)
    assert main(["score", str(tmp_path / "missing.npz"), "--out", str(out)]) == 2


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_scored_draft_rank_matches_online_decoding(temperature):
    """Mean accepted draft tokens per round of the online draft_rank decoder vs the scored
    expectation at the same budget, same pair and temperature: within 10%."""
    pair = ToyPair(32, seed=0, closeness=0.9)
    top_k, depth, budget, new = 4, 4, 8, 100
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 32, 5).tolist() for _ in range(20 if temperature else 10)]
    online = []
    for i, prompt in enumerate(prompts):
        config = DecodeConfig(decoder="draft_rank", budget=budget, temperature=temperature,
                              max_new_tokens=new, seed=i, pool=PoolShape(top_k=top_k, depth=depth))
        online += [r.accepted for r in generate(pair.target, pair.draft, prompt, config).rounds]
    # every 4th position: the expectation varies little between positions
    config = RecordConfig(temperature=temperature, max_new_tokens=new,
                          stride=4, pool=PoolShape(top_k=top_k, depth=depth))
    segments = [dict(record_prompt(pair.target, pair.draft, p, config, seed=100 + i),
                     question=i, task="toy", turn=0) for i, p in enumerate(prompts)]
    log = rowlog.from_segments(dict(temperature=temperature, depth=depth), segments)
    scored = score_log(log, [budget], rules=("draft_rank",))["accepted"]
    assert len(online) >= 5 * len(prompts) and len(scored) == 25 * len(prompts)
    assert abs(np.mean(scored) / np.mean(online) - 1) < 0.10, (np.mean(scored), np.mean(online))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_first_token_contains_pearl_at_every_position_and_budget(temperature):
    """On a recorded log, first_token's tree contains pearl's at each position and budget: its
    accepted draft tokens and non-root nodes are never below pearl's, and somewhere above."""
    budgets = [1, 2, 3, 5, 8, 13, 21, 40]
    table = score_log(toy_log(temperature, top_k=5, depth=5, new=16), budgets,
                      rules=("pearl", "first_token"))
    ft, pe = (table["rule"] == "first_token"), (table["rule"] == "pearl")
    for col in ("prompt_id", "turn", "position", "budget"):
        assert np.array_equal(table[col][ft], table[col][pe])
    assert np.all(table["nodes"][ft] >= table["nodes"][pe])
    assert np.all(table["accepted"][ft] >= table["accepted"][pe] - 1e-12)
    assert np.all(table["nodes"][ft] <= table["budget"][ft])
    assert table["nodes"][ft].sum() > table["nodes"][pe].sum()
    assert table["accepted"][ft].sum() > table["accepted"][pe].sum()


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("rule", ["learned_rerank", "learned_stale_rerank"])
def test_learned_rules_match_brute_force(temperature, rule):
    """Each learned rule's scores, features and all, against its definition written out node
    by node (tests/brute_rules.py), pool by pool; its fold models by prompt."""
    from rerankers import reranker

    log = toy_log(temperature, stride=2)
    base = reranker(rule, seed=5)
    keys = [f"task{i % 2}/q{i // 2}" for i in range(4)]
    model = dataclasses.replace(base, folds=(base.weights, reranker(rule, seed=6).weights),
                                fold_of={keys[0]: 1, keys[1]: 0})
    table = score_log(log, BUDGETS, rules=(rule,), rerankers={rule: model})
    greedy = temperature == 0
    row = 0
    for r in np.flatnonzero(log.rec_scored):
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        tokens, parents, logq, edge = log.pool(r)
        pool = Tree(tokens, parents)
        root = np.log(dense_root_row(log, r, 16))
        stale = log.stale(r).astype(np.float64)
        firsts = pool.tokens[pool.children(0)]
        stale_by_token = None if np.isnan(stale).any() else dict(
            zip(firsts.tolist(), np.log(stale), strict=True))
        features = brute.learned_features(pool, logq, dict(enumerate(root)) if
                                          rule == "learned_rerank" else None, stale_by_token)
        used = model.for_prompt(f"{log.seg_task[s]}/{log.seg_question[s]}")
        weights = dict(zip(used.features, used.weights, strict=True))
        for b in BUDGETS:
            chosen = brute.learned(pool, logq, b, features, weights)
            want = accept(pool.subtree(chosen), edge[chosen], log.trajectory(s)[t:].tolist(),
                          greedy)
            assert table["accepted"][row] == pytest.approx(want, rel=1e-9, abs=1e-12)
            assert table["nodes"][row] == len(chosen) - 1
            row += 1
    assert row == len(table["rule"])


def test_the_table_says_which_kind_of_draft_made_the_pools(tmp_path):
    from test_rowlog import toy_record

    from targetrows.analysis.tables import score_groups

    _, log, path = toy_record(tmp_path)  # the toy draft is a model of its own
    assert log.header["draft_kind"] == "standalone"
    table = score_log(rowlog.read(path), [2])
    assert set(table["draft_kind"]) == {"standalone"}
    older = dataclasses.replace(log, header={k: v for k, v in log.header.items()
                                             if k != "draft_kind"})
    assert set(score_log(older, [2])["draft_kind"]) == {""}  # recorded before it was kept
    # the tables read it back, and a score table without the column as unknown
    write_table(table, str(tmp_path / "a.csv"))
    write_table({k: v for k, v in table.items() if k != "draft_kind"}, str(tmp_path / "b.csv"))
    assert set(score_groups([str(tmp_path / "a.csv")])[0]["draft_kind"]) == {"standalone"}
    assert set(score_groups([str(tmp_path / "b.csv")])[0]["draft_kind"]) == {""}
