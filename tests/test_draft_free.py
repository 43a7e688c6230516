"""The draft-free decoders (racer, recycle) in the round loop: what their state learns from the
target's rows (every verified node's top-k, and RACER's prompt rows) against a brute force that
replays the target's passes on the toy pair, what is kept from one prompt to the next, and the
trees they verify. Losslessness is in test_lossless_toy.py and test_decoders_hf.py with every
other decoder."""

import numpy as np
import pytest

from targetrows.core.passes import run_now
from targetrows.core.recycle import TOKEN_RECYCLING_TEMPLATE, fill_template, template_prefix
from targetrows.core.toy import ToyPair
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate, new_state

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


class Recorded:
    """A toy target that records every pass: (context, tree, nodes) of each `logits` call."""

    def __init__(self, model):
        self.model = model
        self.passes = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits_passes(self, context, tree, nodes):
        self.passes.append((list(context), tree, [int(n) for n in nodes]))
        return (yield from self.model.logits_passes(context, tree, nodes))

    def logits(self, context, tree, nodes):
        return run_now(self.logits_passes(context, tree, nodes))


def brute_table(pair, passes, k):
    """{token: its top-k ids} written pass after pass: each node's row is the target's at its
    context; a pass writes its nodes shallowest first (then by index), so the deepest, last
    node carrying a token wins within a pass, and a later pass over an earlier one."""
    table = {}
    for context, tree, nodes in passes:
        for n in sorted(nodes, key=lambda n: (tree.depth[n], n)):
            row = pair.target_row(context + tree.path_tokens(n))
            table[int(tree.tokens[n])] = np.argsort(-row, kind="stable")[:k].tolist()
    return table


def table_of(state):
    seen = np.flatnonzero(state.table.ids[:, 0] >= 0)
    return {int(t): state.table.ids[t].tolist() for t in seen}


@pytest.mark.parametrize("decoder", ["racer", "recycle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_table_holds_the_targets_top_k_at_every_verified_node(decoder, temperature):
    pair = ToyPair(vocab_size=24, seed=2, closeness=0.8)
    target = Recorded(pair.target)
    config = DecodeConfig(decoder, budget=12, temperature=temperature, max_new_tokens=40,
                          recycle_k=5)
    state = new_state(target, config)
    result = generate(target, None, PROMPT, config, state)
    assert len(result.rounds) > 3 and state.table.k == 5
    assert table_of(state) == brute_table(pair, target.passes, 5)
    if temperature == 0.0:  # and the trees were worth it: some draft tokens accepted
        assert sum(r.accepted for r in result.rounds) > 0


def test_racer_writes_the_prompts_rows_first_and_recycle_does_not():
    pair = ToyPair(vocab_size=24, seed=2, closeness=0.8)
    target = Recorded(pair.target)
    config = DecodeConfig("racer", budget=12, max_new_tokens=1)
    state = new_state(target, config)
    result = generate(target, None, PROMPT, config, state)
    context, chain, nodes = target.passes[0]  # one chain over the prompt, under its first token
    assert context == PROMPT[:1] and chain.tokens.tolist() == PROMPT
    assert chain.parents.tolist() == list(range(-1, len(PROMPT) - 1))
    assert nodes == list(range(len(PROMPT)))
    # the verify pass reads the root's row from the prompt pass: it asks for the tree alone
    assert target.passes[1][0] == PROMPT and 0 not in target.passes[1][2]
    assert result.rounds[0].target_passes == 2
    prompt_rows = brute_table(pair, target.passes[:1], 8)
    assert set(prompt_rows) == set(PROMPT)
    assert table_of(state) == brute_table(pair, target.passes, 8)
    target = Recorded(pair.target)
    config = DecodeConfig("recycle", budget=12, max_new_tokens=1)
    state = new_state(target, config)
    generate(target, None, PROMPT, config, state)
    assert len(target.passes) == 1 and target.passes[0][1].budget == 0  # nothing known yet
    assert set(table_of(state)) == {PROMPT[-1]}  # the root's row, from its verify pass


def test_prompt_rows_come_in_parts_for_a_long_prompt(monkeypatch):
    from targetrows.decoding import planners

    monkeypatch.setattr(planners, "PROMPT_ROWS_AT_ONCE", 4)
    pair = ToyPair(vocab_size=24, seed=2, closeness=0.8)
    target = Recorded(pair.target)
    config = DecodeConfig("racer", budget=12, max_new_tokens=1)
    state = new_state(target, config)
    result = generate(target, None, PROMPT, config, state)
    parts = target.passes[:3]  # 11 tokens: 4 + 4 + 3, each part's chain after the last
    assert [(len(c), ch.tokens.tolist()) for c, ch, _ in parts] == [
        (1, PROMPT[:4]), (5, PROMPT[4:8]), (9, PROMPT[8:])]
    assert result.rounds[0].target_passes == 4
    assert table_of(state) == brute_table(pair, target.passes, 8)


def test_recycles_tree_is_token_recyclings_template_filled_from_the_table():
    pair = ToyPair(vocab_size=24, seed=2, closeness=0.8)
    target = Recorded(pair.target)
    config = DecodeConfig("recycle", budget=30, max_new_tokens=12)
    state = new_state(target, config)
    generate(target, None, PROMPT, config, state)
    # replay: before each verify pass, the table the passes so far wrote, filled into the
    # template's first 30 nodes, is the tree that pass verified
    for j, (context, tree, _) in enumerate(target.passes):
        state.table.clear()
        for token, ids in brute_table(pair, target.passes[:j], 8).items():
            state.table.update([token], [ids])
        want = fill_template(state.table, context[-1], *template_prefix(TOKEN_RECYCLING_TEMPLATE, 30))
        assert tree == want
    assert max(t.budget for _, t, _ in target.passes) > 10


@pytest.mark.parametrize("decoder", ["racer", "recycle"])
def test_keep_across_prompts(decoder):
    """Off (the default), a state handed from one prompt to the next is cleared: the second
    prompt decodes as with a fresh state. On, what the first taught carries over: the second
    prompt's first tree already holds nodes. Either way the tokens are the target's."""
    pair = ToyPair(vocab_size=24, seed=4, closeness=0.8)
    first, second = PROMPT, [5, 3, 5, 9, 2]
    ar = generate(pair.target, None, second, DecodeConfig("ar", max_new_tokens=20)).tokens
    runs = {}
    for keep in (False, True):
        config = DecodeConfig(decoder, budget=12, max_new_tokens=20, keep_across_prompts=keep)
        state = new_state(pair.target, config)
        generate(pair.target, None, first, config, state)
        runs[keep] = generate(pair.target, None, second, config, state)
        assert runs[keep].tokens == ar
    fresh = generate(pair.target, None, second, DecodeConfig(decoder, budget=12, max_new_tokens=20))
    assert [r.nodes for r in runs[False].rounds] == [r.nodes for r in fresh.rounds]
    assert [r.nodes for r in runs[True].rounds] != [r.nodes for r in fresh.rounds]
    if decoder == "recycle":  # no prompt rows: only a kept table gives the first round a tree
        assert fresh.rounds[0].nodes == 0 and runs[True].rounds[0].nodes > 0


def test_bad_recycle_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="recycle_k"):
        DecodeConfig("racer", recycle_k=0)
    with pytest.raises(ValueError, match="keep_across_prompts"):
        DecodeConfig("racer", keep_across_prompts="yes")
    with pytest.raises(ValueError, match="scores with a trained model"):
        DecodeConfig("sequoia")  # its acceptance vector is missing


# -- calibration: every budget's rounds from one path (targetrows.cost.draft_free) ------------


@pytest.mark.parametrize("decoder", ["racer", "recycle"])
def test_calibrating_one_budget_is_that_budgets_own_decode(decoder):
    """With one budget the union is that budget's tree: at T=0 its rounds are the decode's own,
    round for round (the decode's last, cut at max_new_tokens, aside)."""
    from targetrows.cost.draft_free import draft_free_rounds

    pair = ToyPair(vocab_size=24, seed=2, closeness=0.8)
    config = DecodeConfig(decoder, budget=12, max_new_tokens=40)
    committed, nodes = draft_free_rounds(pair.target, PROMPT, [12], config, 40)
    rounds = generate(pair.target, None, PROMPT, config).rounds
    assert len(rounds) > 5 and len(committed) == len(rounds)
    assert committed[:-1, 0].tolist() == [r.committed for r in rounds[:-1]]
    assert nodes[:, 0].tolist() == [r.nodes for r in rounds]


@pytest.mark.parametrize("decoder", ["racer", "recycle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_budget_is_scored_on_its_own_tree_and_learns_its_own_rows(decoder, temperature):
    """Replayed from the target's passes: at each round every budget's tree is the one a state
    fed only its own trees' rows (and RACER's prompt rows) builds, it lies inside the verified
    union, and its score is 1 + its nodes' reach probabilities under the target's rows."""
    from targetrows.core.acceptance import reach_probability
    from targetrows.cost.draft_free import draft_free_rounds

    pair = ToyPair(vocab_size=24, seed=2, closeness=0.8)
    target = Recorded(pair.target)
    budgets = [2, 6, 20]
    config = DecodeConfig(decoder, temperature=temperature)
    committed, nodes = draft_free_rounds(target, PROMPT, budgets, config, 30)
    verify = [p for p in target.passes if p[0][-1] == p[1].tokens[0] and p[0] != PROMPT[:1]]
    assert len(verify) == len(committed) > 3
    states = [new_state(pair.target, DecodeConfig(decoder, budget=b)) for b in budgets]
    for s in states:
        s.start()
        if s.prompt_pending:
            ids = [np.argsort(-pair.target_row(PROMPT[: i + 1]), kind="stable")[:8]
                   for i in range(len(PROMPT))]
            s.observe_prompt(PROMPT, np.array(ids))
    for (context, union, _), got, size in zip(verify, committed, nodes, strict=True):
        in_union = {tuple(union.path_tokens(i)): i for i in range(len(union))}
        for s, b, score, n in zip(states, budgets, got, size, strict=True):
            tree = s.tree(context, b)
            at = [in_union[tuple(tree.path_tokens(i))] for i in range(len(tree))]
            rows = np.array([pair.target_row(context + tree.path_tokens(i))
                             for i in range(len(tree))])
            edge = np.ones(len(tree))
            if temperature == 0.0:  # moved on only along the target's argmax
                edge[1:] = rows[tree.parents[1:]].argmax(axis=1) == tree.tokens[1:]
            else:
                edge[1:] = rows[tree.parents[1:], tree.tokens[1:]]
            assert n == tree.budget and len(set(at)) == len(tree)
            assert score == pytest.approx(1 + reach_probability(tree, edge)[1:].sum())
            s.observe_tree(tree, np.argsort(-rows, axis=1, kind="stable")[:, :8])
    assert np.all(np.diff(nodes, axis=1) >= 0) and nodes[:, -1].max() > nodes[:, 0].max()
