"""The draft-free decoders (racer, recycle) scored on a row log (`targetrows.rowlog.draft_free`):
the top ids the recorder keeps along each path against the toy target's own rows, and each
score against a brute force that writes the table from those rows by hand and matches the
tree's paths against the logged continuation."""

import numpy as np
import pytest
from test_score import toy_log

from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import new_state
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.record import RecordConfig, record_prompt
from targetrows.rowlog.score import score_log

VOCAB, K = 16, 8


def top_ids(pair, context):
    return np.argsort(-pair.target_row(context), kind="stable")[:K].tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_log_keeps_the_targets_top_ids_along_prompt_and_trajectory(temperature):
    pair = ToyPair(VOCAB, seed=3, closeness=0.85)
    config = RecordConfig(temperature=temperature, stride=2, max_new_tokens=6, root_top=VOCAB,
                          pool=PoolShape(top_k=3, depth=3))
    prompt = [5, 1, 9, 2]
    seg = record_prompt(pair.target, pair.draft, prompt, config, seed=4)
    assert np.asarray(seg["prompt_topk"]).tolist() == [
        top_ids(pair, prompt[: i + 1]) for i in range(len(prompt))]
    traj = seg["trajectory"]
    assert np.asarray(seg["traj_topk"]).tolist() == [
        top_ids(pair, prompt + traj[:t]) for t in range(len(traj))]


def brute_scores(log, decoder, budgets):
    """{(segment, position, budget): (accepted, nodes)}: the table each round would read,
    written by hand from the target's rows at the prompt's positions (RACER) and the path's
    positions before the root; the tree from a fresh state holding that table; accepted = the
    deepest node whose path begins the logged continuation."""
    out = {}
    for r in np.flatnonzero(log.rec_scored):
        seg, t = int(log.rec_segment[r]), int(log.rec_position[r])
        prompt, traj = log.prompt(seg).tolist(), log.trajectory(seg).tolist()
        pair = ToyPair(VOCAB, seed=3, closeness=0.85)
        table = {}
        if decoder == "racer":
            for i in range(len(prompt)):
                table[prompt[i]] = top_ids(pair, prompt[: i + 1])
        for j in range(t):  # the row at prompt + traj[:j], under that context's last token
            context = prompt + traj[:j]
            table[context[-1]] = top_ids(pair, context)
        for b in budgets:
            state = new_state(pair.target, DecodeConfig(decoder, budget=b))
            state.start()
            for token, ids in table.items():
                state.table.update([token], [ids])
            tree = state.tree(prompt + traj[:t], b)
            deepest = max(len(p) for p in (tree.path_tokens(i) for i in range(len(tree)))
                          if traj[t : t + len(p)] == p)
            out[seg, t, b] = (deepest, tree.budget)
    return out


@pytest.mark.parametrize("decoder", ["racer", "recycle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_free_scores_match_a_brute_force_rebuilt_from_the_targets_rows(decoder, temperature):
    budgets = [1, 3, 8, 30]
    log = toy_log(temperature, stride=2, n_prompts=3, new=14, vocab=VOCAB)
    table = score_log(log, budgets, rules=(decoder,))
    want = brute_scores(log, decoder, budgets)
    segment_of = {(q, task, turn): s for s, (q, task, turn) in enumerate(
        zip(log.seg_question, log.seg_task, log.seg_turn, strict=True))}
    got = {}
    for i in range(len(table["rule"])):
        seg = segment_of[str(table["prompt_id"][i]), str(table["task"][i]), int(table["turn"][i])]
        got[seg, int(table["position"][i]), int(table["budget"][i])] = (
            table["accepted"][i], table["nodes"][i])
        assert table["committed"][i] == table["accepted"][i] + 1
    assert got == want
    accepted = np.array([a for a, _ in want.values()])
    assert accepted.max() > 0 and set(table["rule"]) == {decoder}


def test_a_log_without_path_rows_scores_its_rules_and_names_what_racer_needs(tmp_path):
    log = toy_log(0.0, n_prompts=2, new=6, vocab=VOCAB)
    assert log.has_path_rows
    assert {"racer", "recycle"} <= set(score_log(log, [2])["rule"])
    old = rowlog.RowLog(**dict(vars(log), prompt_topk=np.zeros((0, 0), np.int32),
                               traj_topk=np.zeros((0, 0), np.int32)))
    rowlog.write(tmp_path / "old.npz", old)
    read = rowlog.read(tmp_path / "old.npz")
    assert not read.has_path_rows
    assert "racer" not in set(score_log(read, [2])["rule"])
    with pytest.raises(ValueError, match="record it again"):
        score_log(read, [2], rules=("racer",))
    both = rowlog.concat([log, read], log.header)  # one part without them: the whole has none
    assert not both.has_path_rows
    rowlog.write(tmp_path / "new.npz", log)
    again = rowlog.read(tmp_path / "new.npz")
    assert np.array_equal(again.traj_topk, log.traj_topk) and again.has_path_rows
