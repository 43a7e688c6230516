"""Batched decoding: every decoder, many sequences at once, each token-identical to its batch-1
run (`targetrows.decoding.batch`, `targetrows.hf.lanes`)."""

import dataclasses

import numpy as np
import pytest

from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.core.tree import Tree
from targetrows.decoding.batch import generate_batch
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import decode_passes, generate
from targetrows.decoding.registry import decoder_names, get_decoder
from targetrows.decoding.schedule import BatchStats, run_batched

STOP = 7  # a token the toy and the tiny models emit now and then: some sequences stop early


def _configs(decoder, n, temperature=0.0, budgets=(8, 3, 12, 1, 6), **kw):
    """One config per prompt: its own seed, budget and length (trees of different sizes and
    sequences that end at different rounds in one batch)."""
    from rerankers import decode_config

    return [decode_config(decoder, budget=budgets[i % len(budgets)], temperature=temperature,
                          max_new_tokens=12 + 5 * (i % 4), seed=100 + i,
                          stop_ids=frozenset({STOP}), **kw) for i in range(n)]


def _one_by_one(target, draft, prompts, configs):
    return [generate(target, draft if c.decoder.needs_draft else None, p, c).tokens
            for p, c in zip(prompts, configs, strict=True)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_toy_every_decoder_equals_its_batch_1_runs(temperature):
    """Every registered decoder at batch 1, 3 and 8 on prompts of 1 to 29 tokens: each
    sequence's tokens equal its own `generate` (at T > 0 too: draws come from its own seed)."""
    pair = ToyPair(vocab_size=50, seed=3, closeness=0.8)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 50, size=int(n)).tolist() for n in (1, 29, 4, 17, 2, 9, 11)]
    for name in decoder_names():
        configs = _configs(name, len(prompts), temperature)
        want = _one_by_one(pair.target, pair.draft, prompts, configs)
        for batch_size in (1, 3, 8):
            stats = BatchStats()
            got = generate_batch(pair.target, pair.draft, prompts, configs, batch_size, stats)
            assert [r.tokens for r in got] == want, (name, batch_size)
            if batch_size > 1:  # the passes were batched, not run one sequence at a time
                assert stats.mean_batch > 1.5, (name, batch_size, stats)


def test_a_sequences_tokens_do_not_depend_on_its_batch():
    """Same seed, same tokens, whichever sequences share the batch (T = 1, toy)."""
    pair = ToyPair(vocab_size=40, seed=5, closeness=0.7)
    prompts = [[1, 2, 3], [9] * 12, [4], [30, 31]]
    configs = _configs("fts", 4, temperature=1.0)
    alone = generate_batch(pair.target, pair.draft, prompts[:1], configs[:1], 8)[0].tokens
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0]):
        got = generate_batch(pair.target, pair.draft, [prompts[i] for i in order],
                             [configs[i] for i in order], 4)
        assert got[order.index(0)].tokens == alone


def _failing_jobs(bad, n: int, started: list, done: list, raised=ValueError):
    """n fts jobs on the toy pair; the jobs in `bad` raise `raised` from their own steps at
    their first round's verify pass (not inside a pass)."""
    def job(i):
        def run(target, draft):
            started.append(i)
            steps = decode_passes(target, draft, [1, 2], DecodeConfig("fts", max_new_tokens=8,
                                                                      seed=i))
            if i in bad:
                yield from _fail_at_verify(steps, i, raised)
            out = yield from steps
            done.append(i)
            return out
        return run
    return [job(i) for i in range(n)]


def _fail_at_verify(steps, i: int, raised):
    request = next(steps)
    while len(request.item[2]) == 1:  # drafting and the root pass: one-node trees
        request = steps.send((yield request))
    raise raised(f"sequence {i} is bad")


def test_a_failing_sequence_fails_alone_and_the_call_raises_the_first_failure():
    """Jobs 2 and 5 of 9 fail in their own steps at batch 3: every other job, those sharing
    their passes and those after them, finishes and is handed over; the call then raises job
    2's error (the first in job order, not the last to fail), noting how many failed."""
    pair = ToyPair(vocab_size=30, seed=1)
    started, done, failed, handed = [], [], [], []
    with pytest.raises(ValueError, match="sequence 2 is bad") as raised:
        run_batched(pair.target, pair.draft, _failing_jobs({2, 5}, 9, started, done), 3,
                    on_done=lambda j, r: handed.append(j),
                    on_failed=lambda j, e: failed.append((j, str(e))))
    assert sorted(started) == list(range(9))
    assert sorted(done) == sorted(handed) == [0, 1, 3, 4, 6, 7, 8]
    assert sorted(failed) == [(2, "sequence 2 is bad"), (5, "sequence 5 is bad")]
    assert "2 of 9 jobs failed" in " ".join(raised.value.__notes__)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_ctrl_c_in_a_sequences_own_steps_stops_the_whole_call(batch):
    """An interrupt raised by one sequence's own steps (not inside a pass) is no job failure:
    it stops the call at once, and nothing starts or finishes after it."""
    pair = ToyPair(vocab_size=30, seed=1)
    started, done, failed = [], [], []
    with pytest.raises(KeyboardInterrupt):
        run_batched(pair.target, pair.draft,
                    _failing_jobs({1}, 9, started, done, KeyboardInterrupt), batch,
                    on_failed=lambda j, e: failed.append(j))
    assert not failed and max(started) <= 2 and 1 not in done
    assert len(done) <= 1  # at most job 0, had it finished before job 1's round


def test_an_interrupt_stops_at_once_and_every_answer_handed_over_is_whole():
    """Ctrl-C in the middle of a batch's pass: the call raises it from that pass, nothing runs
    after it, and the answers handed to `on_done` so far are complete decodes."""
    pair = ToyPair(vocab_size=30, seed=1)
    passes, answered = [0], []

    class Interrupting:  # the target's batched pass, interrupted at its 12th
        def __init__(self, inner):
            self.inner = inner

        def run_batch(self, items):
            passes[0] += 1
            if passes[0] == 12:
                raise KeyboardInterrupt
            return self.inner.run_batch(items)

    lanes = pair.target.lanes(4)
    group = Interrupting(lanes[0]._group)
    lanes = [dataclasses.replace(lane, _group=group) for lane in lanes]
    target = dataclasses.replace(pair.target)
    target.lanes = lambda n, target_lanes=None: lanes
    configs = _configs("draft_rank", 8)
    prompts = [[1, 2], [3], [4, 5, 6], [7, 8], [9], [10, 11], [12], [13, 14]]
    jobs = [lambda t, d, p=p, c=c: decode_passes(t, d, p, c)
            for p, c in zip(prompts, configs, strict=True)]
    with pytest.raises(KeyboardInterrupt):
        run_batched(target, pair.draft, jobs, 4, on_done=lambda j, r: answered.append((j, r)))
    assert passes[0] == 12
    want = _one_by_one(pair.target, pair.draft, prompts, configs)
    assert answered and all(r.tokens == want[j] for j, r in answered)


def test_the_same_command_runs_the_same_passes_in_the_same_order():
    """The pass schedule is a function of the requests: eight runs, one schedule (sequences
    of unequal rounds, so groups of equal size meet)."""
    pair = ToyPair(vocab_size=50, seed=3, closeness=0.8)
    prompts = [[1, 2, 3], [9] * 12, [4], [30, 31], [5, 6], [7]]
    schedules = set()
    for _ in range(8):
        stats = BatchStats()
        generate_batch(pair.target, pair.draft, prompts, _configs("fts", 6, overlap=True), 4,
                       stats)
        schedules.add(tuple(stats.schedule))
    assert len(schedules) == 1
    assert any(kind.endswith("side") for kind, _ in stats.schedule)  # root passes alongside


def test_state_carried_across_prompts_is_refused_in_a_batch():
    pair = ToyPair(vocab_size=30, seed=1)
    config = DecodeConfig("racer", keep_across_prompts=True, max_new_tokens=4)
    with pytest.raises(ValueError, match="batch size 1"):
        generate_batch(pair.target, None, [[1], [2]], config, 2)


# -- Hugging Face models (tiny, random weights, float64) ------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_decoders_hf import PROMPTS, hf_greedy, noisy_copy  # noqa: E402
from tiny_heads import save_tiny_head  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from targetrows.hf.loading import load_eagle3  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402

# prompts of 1 to 14 tokens
HF_PROMPTS = PROMPTS + [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7], [11, 12]]


@pytest.fixture(scope="module")
def llama():
    target = tiny_model("llama", seed=0, n_layers=2, dtype=torch.float64)
    return target, noisy_copy(target, 0.01, seed=2)


def test_hf_every_decoder_equals_batch_1_and_greedy(llama):
    """T = 0, batch 3 and 8, prompts of 1 to 14 tokens, budgets 1 to 12, early stops: each
    sequence's tokens equal its batch-1 run, and HF greedy generate up to its stop."""
    target_hf, draft_hf = llama
    target, draft = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    greedy = [hf_greedy(target_hf, p, 27) for p in HF_PROMPTS]
    for name in decoder_names():
        configs = _configs(name, len(HF_PROMPTS), pool=PoolShape(top_k=4, depth=3))
        want = _one_by_one(target, draft, HF_PROMPTS, configs)
        for tokens, ref, config in zip(want, greedy, configs, strict=True):
            assert tokens == ref[: len(tokens)], name
            assert len(tokens) == config.max_new_tokens or tokens[-1] == STOP
        for batch_size in (3, 8):
            got = generate_batch(target, draft, HF_PROMPTS, configs, batch_size)
            assert [r.tokens for r in got] == want, (name, batch_size)


def test_hf_sampling_at_batch_3_equals_batch_1(llama):
    """T = 1: each sequence's own seeded draws give its batch-1 tokens (float64)."""
    target_hf, draft_hf = llama
    target, draft = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    for name in ("draft_rank", "fts", "recycle"):
        configs = _configs(name, len(HF_PROMPTS), temperature=1.0,
                           pool=PoolShape(top_k=3, depth=3))
        want = _one_by_one(target, draft, HF_PROMPTS, configs)
        got = generate_batch(target, draft, HF_PROMPTS, configs, 3)
        assert [r.tokens for r in got] == want, name


@torch.inference_mode()
def test_a_batched_pass_equals_each_lanes_own_pass(llama):
    """Rows, KV entries and features of a batched pass over lanes at different lengths (a
    prompt's first pass beside trees after committed prefixes) equal batch-1 passes."""
    target_hf, _ = llama
    lanes = HFModel(target_hf, name="t", feature_layers=[0, 1]).lanes(3)
    trees = [Tree([5, 9, 8, 7, 6], [-1, 0, 0, 1, 3]), Tree([3, 4], [-1, 0]),
             Tree([11, 12, 13], [-1, 0, 0])]
    contexts = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11]]
    for lane, ctx in zip(lanes[:2], contexts[:2], strict=True):  # committed prefixes first
        lane.logits(ctx[:-2], Tree.root_only(ctx[-3]), [0])
        lane.commit(ctx[:-1])
    steps = [lane.logits_passes(ctx, tree, range(len(tree)))
             for lane, ctx, tree in zip(lanes, contexts, trees, strict=True)]
    requests = [next(s) for s in steps]
    assert len({id(r.group) for r in requests}) == 1
    out = requests[0].group.run_batch([r.item for r in requests])
    for lane, s, result, ctx, tree in zip(lanes, steps, out, contexts, trees, strict=True):
        with pytest.raises(StopIteration) as done:
            s.send(result)
        one = HFModel(target_hf, name="one", feature_layers=[0, 1])
        if len(ctx) > 2:
            one.logits(ctx[:-2], Tree.root_only(ctx[-3]), [0])
            one.commit(ctx[:-1])
        want = one.logits(ctx, tree, range(len(tree)))
        torch.testing.assert_close(done.value.value, want, rtol=1e-10, atol=1e-10)
        assert_same_entries(lane, one, 1e-10)


def assert_same_entries(model, reference, tol: float) -> None:
    """`model`'s row holds the keys, values and features `reference`'s does."""
    (layers, features), (ref_layers, ref_features) = model.kv_entries(), reference.kv_entries()
    for (keys, values), (ref_keys, ref_values) in zip(layers, ref_layers, strict=True):
        torch.testing.assert_close(keys, ref_keys, rtol=tol, atol=tol)
        torch.testing.assert_close(values, ref_values, rtol=tol, atol=tol)
    if ref_features is not None:
        torch.testing.assert_close(features, ref_features, rtol=tol, atol=tol)


def test_eagle3_head_lanes_equal_batch_1_and_greedy(tmp_path):
    """An EAGLE-3 head (a reduced draft vocabulary) at batch 3: its lanes read their target
    lanes' features, and every sequence equals its batch-1 run and greedy generate."""
    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)  # 3 feature layers
    folder = save_tiny_head(tmp_path / "h", target_hf.config, draft_vocab_size=150)
    target = HFModel(target_hf, name="t")
    head = load_eagle3(str(folder), target)
    greedy = [hf_greedy(target_hf, p, 27) for p in HF_PROMPTS]
    for name in [d for d in decoder_names() if get_decoder(d).needs_draft]:
        configs = _configs(name, len(HF_PROMPTS), pool=PoolShape(top_k=4, depth=3))
        want = _one_by_one(target, head, HF_PROMPTS, configs)
        for tokens, ref in zip(want, greedy, strict=True):
            assert tokens == ref[: len(tokens)], name
        got = generate_batch(target, head, HF_PROMPTS, configs, 3)
        assert [r.tokens for r in got] == want, name


def test_a_resumed_run_batches_as_the_uninterrupted_one():
    """Rows that depend on the batch's companions (as a bfloat16 batched pass rounds them): a
    run resumed with its first answers known (`needed`) still gives every other answer the
    tokens of the uninterrupted run, because the segments it runs batch as they did."""
    pair = ToyPair(vocab_size=12, seed=4, closeness=0.7, scale=0.3)  # flat rows: near-ties

    class Companions:  # each lane's rows moved by who shares its pass
        def run_batch(self, items):
            shift = 0.05 * sum(len(context) for _, context, _, _ in items)
            return [m._rows(c, t, n) + shift * np.sin(np.arange(12) * len(items))
                    for m, c, t, n in items]

    group = Companions()
    target = dataclasses.replace(pair.target)
    target.lanes = lambda n, target_lanes=None: [dataclasses.replace(pair.target, _group=group)
                                                 for _ in range(n)]
    prompts = [[i % 12, (3 * i) % 12] for i in range(20)]
    configs = _configs("fts", 20, temperature=1.0)
    jobs = [lambda t, d, p=p, c=c: decode_passes(t, d, p, c)
            for p, c in zip(prompts, configs, strict=True)]
    full = [r.tokens for r in run_batched(target, pair.draft, jobs, 3)]
    for known in (1, 13, 14):
        needed = [j >= known for j in range(20)]
        resumed = run_batched(target, pair.draft, jobs, 3, needed=needed)
        assert [r.tokens for r in resumed[known:]] == full[known:], known
    # the test can fail: the same jobs batched from the first unknown one differ
    alone = [r.tokens for r in run_batched(target, pair.draft, jobs[13:], 3)]
    assert alone != full[13:]


def _head_draft(target, head, context, tree):
    """Steps: the target's root pass over `context` (its features), then the head's rows at
    every node of `tree`; returns those rows, the head's keys, values and g."""
    yield from target.logits_passes(context, Tree.root_only(context[-1]), [0])
    target.commit(context)
    rows = yield from head.logits_passes(context, tree, range(len(tree)))
    [(keys, values)], g = head.kv_entries()
    return rows, keys.clone(), values.clone(), g.clone()


def test_a_batched_head_step_drafts_what_each_lanes_own_step_does(tmp_path):
    """The head's batched steps over lanes at different lengths and positions (trees of other
    shapes): each lane's rows, keys, values and outputs g equal its batch-1 head's (float64),
    and the steps did run batched."""
    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path / "h", target_hf.config, draft_vocab_size=150)
    target = HFModel(target_hf, name="t")
    head = load_eagle3(str(folder), target)
    contexts = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11, 4]]
    trees = [Tree([5, 9, 8, 7, 6], [-1, 0, 0, 1, 3]), Tree([3, 4], [-1, 0]),
             Tree([4, 12, 13, 14], [-1, 0, 0, 2])]
    jobs = [lambda t, d, c=c, tree=tree: _head_draft(t, d, c, tree)
            for c, tree in zip(contexts, trees, strict=True)]
    stats = BatchStats()
    batched = run_batched(target, head, jobs, 3, stats)
    assert (f"{head.name} passes", 3) in stats.schedule
    for job, got in zip(jobs, batched, strict=True):
        want = run_batched(target, head, [job], 1)[0]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def _partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first, *part[i]]] + part[i + 1:]
        yield [[first], *part]


def test_lanes_split_into_passes_as_cheap_as_any_grouping():
    """`split_by_width` against every way to group up to 6 lanes into passes: its cost (the
    padded tokens plus a pass's cost each) is the least, and it covers each lane once."""
    from targetrows.hf.lanes import split_by_width

    rng = np.random.default_rng(0)
    for _ in range(60):
        widths = rng.choice([1, 1, 2, 9, 17, 60, 200], size=rng.integers(1, 7)).tolist()
        cost = int(rng.choice([0, 8, 64, 500]))

        def total(parts, widths=widths, cost=cost):
            return sum(cost + len(p) * max(widths[i] for i in p) for p in parts)

        parts = split_by_width(widths, cost)
        assert sorted(i for p in parts for i in p) == list(range(len(widths)))
        assert total(parts) == min(total(p) for p in _partitions(list(range(len(widths)))))
    assert split_by_width([1, 200, 1, 1], 64) == [[1], [0, 2, 3]]  # a prefill beside steps
    assert split_by_width([9, 9, 8], 64) == [[0, 1, 2]]


def test_an_unpadded_pass_is_cut_where_idle_rows_would_cost_more_than_a_pass():
    """`split_by_rows`: a prompt's prefill in rows 0 and 7 runs as two passes (six idle rows of
    500 tokens between them), one-token steps in the same rows as one; every feed once."""
    from types import SimpleNamespace

    from targetrows.hf.lanes import split_by_rows

    def feeds(rows, width):
        return [SimpleNamespace(row=r, ids=[0] * width) for r in rows]

    wide = feeds([7, 0, 1], 500)
    assert split_by_rows([0, 1, 2], wide, 64) == [[1, 2], [0]]
    narrow = feeds([7, 0, 1], 1)
    assert split_by_rows([0, 1, 2], narrow, 64) == [[1, 2, 0]]
    assert split_by_rows([2], narrow, 64) == [[2]]
