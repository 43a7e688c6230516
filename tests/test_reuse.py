"""The exact-reuse table (claim 1): the same-last-token case isolated on the toy pair and on row
logs, checked against the toy pair's own rows; a target whose rows depend on the last token
alone shows no instance; the stale row as context; intervals at the level they are labelled."""

import numpy as np
import pytest
from test_rowlog import toy_record, write_prompts

from targetrows.analysis import reuse
from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.rowlog.record import RecordConfig, ToyEncoder, record_file


def test_the_toy_pairs_same_last_token_rows_differ_and_a_last_token_target_shows_none():
    roots, found = reuse.toy_positions(0.0, prompts=3, max_new_tokens=24)
    same = found[reuse.SAME_LAST[1]]
    assert roots > 10 and 0 < len(same["tv"]) <= roots
    assert (same["tv"] > 0).all() and same["best_differs"].mean() > 0.5
    assert found[reuse.SHORT]["next_best_exact"].all()  # greedy: the exact row's first comes next
    # planted: rows that depend on the last token alone; the store keyed by it is then exact,
    # and only the row one token short (another last token) still differs
    pair = ToyPair(vocab_size=32, seed=0, closeness=0.8)
    _, bigram = reuse.toy_positions(0.0, prompts=3, max_new_tokens=24,
                                    row=lambda c: pair.target_row(c[-1:]))
    assert len(bigram[reuse.SAME_LAST[1]]["tv"]) == len(same["tv"])
    assert np.allclose(bigram[reuse.SAME_LAST[1]]["tv"], 0)
    assert (bigram[reuse.SHORT]["tv"] > 0).mean() > 0.9


def test_same_last_token_on_row_logs_against_the_toy_pairs_own_rows(tmp_path):
    pair, log, _ = toy_record(tmp_path)
    positions, got = reuse.log_same_last(log, 1)
    assert positions == log.n_records
    expected = []
    for r in range(log.n_records):
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        context = [*log.prompt(s), *log.trajectory(s)[:t]]
        earlier = [e for e in range(r) if log.rec_segment[e] == s
                   and [*log.prompt(s), *log.trajectory(s)[:log.rec_position[e]]][-1] == context[-1]]
        if earlier:
            e = int(log.rec_position[earlier[-1]])
            exact, other = pair.target_row(context), pair.target_row(context[:len(context) - t + e])
            expected.append((0.5 * np.abs(exact - other).sum(), exact.argmax() != other.argmax()))
    assert len(expected) == len(got["tv"]) > 0
    whole, differs = map(np.array, zip(*expected, strict=True))
    assert (got["tv"] <= whole + 1e-6).all() and (got["tv"] > 0).all()  # a lower bound
    assert np.array_equal(got["best_differs"], differs)  # each row holds its first-ranked token


def test_the_sparse_bound_never_exceeds_the_whole_rows_and_meets_it_when_it_holds_them():
    rng = np.random.default_rng(1)
    for _ in range(50):
        p, q = rng.dirichlet(np.ones(20)), rng.dirichlet(np.ones(20))
        whole = 0.5 * np.abs(p - q).sum()
        top_p, top_q = np.argsort(-p)[:6], np.argsort(-q)[:6]
        bound = reuse.sparse_tv(top_p, p[top_p], p[top_p].min(), top_q, q[top_q], q[top_q].min())
        assert 0 <= bound <= whole + 1e-12
        every = np.arange(20)
        assert reuse.sparse_tv(every, p, 0.0, every, q, 0.0) == pytest.approx(whole)


def test_a_position_without_a_stale_row_is_left_out_not_counted_as_zero(tmp_path):
    # a one-token prompt has no row one token short at its start (stale_p NaN)
    prompts = write_prompts(tmp_path / "p.jsonl", [{"question_id": 1, "category": "qa",
                                                    "turns": ["x"]}])
    pair = ToyPair(16, seed=5, closeness=0.9)
    config = RecordConfig(temperature=1.0, max_new_tokens=6, root_top=4, seed=7,
                          pool=PoolShape(top_k=3, depth=3))
    log = record_file(pair.target, pair.draft, ToyEncoder(16), prompts,
                      str(tmp_path / "log.npz"), config, quiet=True)
    assert np.isnan(log.stale(0)).all() and log.rec_position[0] == 0
    got = reuse.log_positions(log)
    assert len(got["tv"]) == int(log.rec_scored.sum()) - 1
    assert (got["tv"] > 0).all()


def test_stale_rows_on_row_logs_equal_the_toy_pairs_own_rows(tmp_path):
    pair, log, _ = toy_record(tmp_path)
    got = reuse.log_positions(log)
    expected = []
    for r in np.flatnonzero(log.rec_scored):
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        context = [*log.prompt(s), *log.trajectory(s)[:t]]
        tokens, parents, _, _ = log.pool(r)
        first = tokens[parents == 0]
        exact = pair.target_row(context)[first]
        stale = pair.target_row(context[:-1])[first]
        expected.append((0.5 * np.abs(exact - stale).sum(),
                         first[np.argmax(exact)] != first[np.argmax(stale)]))
    tv, differs = map(np.array, zip(*expected, strict=True))
    assert got["tv"] == pytest.approx(tv, abs=1e-5)  # the log keeps float32
    assert np.array_equal(got["best_differs"], differs)


def test_the_intervals_are_95_percent_intervals_by_prompt():
    # 40 prompts of 5 hits each, prompt means spread with sd 0.1: a 95% interval of their
    # mean spans about 2 * 1.96 * 0.1 / sqrt(40); a 50% one would span a third of that
    rng = np.random.default_rng(0)
    means = rng.normal(0.5, 0.1, 40)
    hits = {"prompt_id": np.repeat([f"q{i}" for i in range(40)], 5),
            "tv": np.repeat(means, 5), "best_differs": np.repeat(means > 0.5, 5),
            "next_best_exact": np.ones(200, bool), "next_best_other": np.zeros(200, bool)}
    row = reuse.summary("p", 0.0, reuse.SAME_LAST[1], 300, hits, n_boot=4000)
    width = 2 * 1.96 * means.std(ddof=1) / np.sqrt(40)
    assert row["tv_hi"] - row["tv_lo"] == pytest.approx(width, rel=0.2)
    assert row["tv_lo"] < means.mean() < row["tv_hi"]
    assert (row["hits"], row["prompts"], row["positions"]) == (200, 40, 300)


def test_a_row_without_hits_or_with_one_prompt_has_no_interval():
    empty = {k: np.array([]) for k in reuse.FIELDS}
    row = reuse.summary("p", 0.0, reuse.SAME_LAST[2], 10, empty)
    assert row["hits"] == 0 and np.isnan(row["tv"]) and np.isnan(row["tv_lo"])
    one = {"prompt_id": np.array(["q", "q"]), "tv": np.array([0.2, 0.4]),
           "best_differs": np.array([True, False]), "next_best_exact": np.array([True, True]),
           "next_best_other": np.array([False, True])}
    row = reuse.summary("p", 0.0, reuse.SAME_LAST[1], 10, one)
    assert row["tv"] == pytest.approx(0.3) and np.isnan(row["tv_lo"])
