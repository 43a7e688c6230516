"""A pool grown on the device (`targetrows.hf.device_pool`), by a standalone draft and by an
EAGLE-3 head, is the pool `grow` chooses level by level on the host: the same nodes, numbered
the same, at batch 1, over batched lanes and with static passes; budget-pruned, under several
roots; read once; and the draft keeps what it fed."""

from contextlib import contextmanager, nullcontext
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_decoders_hf import noisy_copy  # noqa: E402
from tiny_heads import save_tiny_head  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from targetrows.core.passes import run_now  # noqa: E402
from targetrows.core.pool import (  # noqa: E402
    PoolShape,
    grow_on_host,
    grows_on_device,
    guessed_pools_passes,
    guessed_pools_read_later,
    pool_passes,
    pool_passes_read_later,
)
from targetrows.core.tree import Tree  # noqa: E402
from targetrows.decoding.schedule import run_batched  # noqa: E402
from targetrows.hf.loading import load_eagle3  # noqa: E402
from targetrows.hf.model import HFModel, HFSequence  # noqa: E402
from targetrows.hf.pass_builder import PassShape  # noqa: E402
from targetrows.hf.torch_rows import TorchRows  # noqa: E402

CONTEXTS = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11], [40, 41]]
# (top_k, depth, budget): unpruned, then pruned ones that `grow` ends one or two levels early
SHAPES = [(4, 3, None), (3, 4, 3), (4, 4, 6), (2, 5, 9)]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path_factory.mktemp("h") / "head", target_hf.config,
                            draft_vocab_size=150)
    return target_hf, noisy_copy(target_hf, 0.05, seed=2), str(folder)


def _pair(weights, kind: str, static: bool = False, graphs: bool = False):
    """(target, draft): a standalone draft or an EAGLE-3 head, with padded passes over the
    whole cache (`static`; on graphs: replayed by the CPU stand-in, which the caller sets up)
    or unpadded ones."""
    target_hf, draft_hf, folder = weights
    target = HFModel(target_hf, name="t")
    draft = load_eagle3(folder, target) if kind == "eagle3" else HFModel(draft_hf, name="d")
    if static:
        shape = PassShape(capacity=128, pad=True, full_span=True, graphs=graphs)
        target.set_pass_shape(shape)
        draft.set_pass_shape(shape)
    return target, draft


def _on_host(head, context, top_k, depth, budget):
    tokens, parents, logq = [context[-1]], [-1], [0.0]
    run_now(grow_on_host(head, context, tokens, parents, logq, [0], top_k, depth, budget))
    return Tree(tokens, parents), np.array(logq)


@contextmanager
def fetches():
    """Every read from the device inside the block (`TorchRows._fetch`), as the name of the
    model that made it and the number of tensors it asked for."""
    reads = []
    fetch = TorchRows._fetch

    def counted(self, *tensors, **where):
        reads.append((self.name, len(tensors)))
        return fetch(self, *tensors, **where)

    TorchRows._fetch = counted
    try:
        yield reads
    finally:
        TorchRows._fetch = fetch


def _same_pool(got, want) -> None:
    (tree, logq), (ref, ref_logq) = got, want
    np.testing.assert_array_equal(tree.tokens, ref.tokens)
    np.testing.assert_array_equal(tree.parents, ref.parents)
    np.testing.assert_allclose(logq, ref_logq, rtol=0, atol=1e-10)


@pytest.mark.parametrize("steps", ["alone", "lanes", "static lanes", "lanes on graphs"])
@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_pool_grown_on_the_device_is_the_hosts_node_for_node(weights, kind, steps,
                                                               monkeypatch):
    from replayed_graphs import replay_in_place

    replay_in_place(monkeypatch)  # graphs stood in on the CPU (an EAGLE-3 head's ranking too)
    target, draft = _pair(weights, kind, static=steps in ("static lanes", "lanes on graphs"),
                          graphs=steps == "lanes on graphs")
    _, reference = _pair(weights, kind)
    assert grows_on_device(draft)
    for shape in SHAPES:
        jobs = [lambda t, d, c=c, s=shape: pool_passes(d, c, *s) for c in CONTEXTS]
        got = run_batched(target, draft, jobs, 1 if steps == "alone" else 3)
        for context, pool in zip(CONTEXTS, got, strict=True):
            _same_pool(pool, _on_host(reference, context, *shape))


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_pools_under_guesses_grown_on_the_device_are_the_hosts(weights, kind):
    """Several roots (first-token redrafting's guesses), at batch 1 and 3."""
    target, draft = _pair(weights, kind)
    _, reference = _pair(weights, kind)
    reference.grow_passes = None  # the host's level-by-level growth (`grows_on_device` False)
    for batch in (1, 3):
        jobs = [lambda t, d, c=c: guessed_pools_passes(d, c, 3, 3, 3) for c in CONTEXTS]
        for context, pool in zip(CONTEXTS, run_batched(target, draft, jobs, batch), strict=True):
            _same_pool(pool, run_now(guessed_pools_passes(reference, context, 3, 3, 3)))


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
@torch.inference_mode()
def test_the_draft_keeps_what_a_pool_grown_on_the_device_fed(weights, kind):
    """After a pool grown on the device, the draft's rows at the pool's unfed nodes (the last
    level) equal a fresh draft's, with only those nodes fed (their ancestors' entries, and a
    head's g, were adopted where they were fed); rows at every node too; and a commit along
    the pool keeps the fed entries of its path."""
    target, draft = _pair(weights, kind)
    context = CONTEXTS[1]
    tree, _ = run_now(pool_passes(draft, context, 3, 4, None))
    entries = draft._pool_entries()
    slot = draft._state.slot
    fed, unfed = np.flatnonzero(slot >= 0), np.flatnonzero(slot < 0)
    rows = draft.logits(context, tree, unfed)
    assert draft._pool_entries() == entries + len(unfed)  # no ancestor fed again
    _, fresh = _pair(weights, kind)
    torch.testing.assert_close(rows, fresh.logits(context, tree, unfed), rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(draft.logits(context, tree, range(len(tree))),
                               fresh.logits(context, tree, range(len(tree))),
                               rtol=1e-10, atol=1e-10)
    path = tree.path_tokens(int(fed[-1]))  # down to the deepest fed node
    draft.commit(context + path)
    fresh.reset()
    after = context + path
    torch.testing.assert_close(draft.logits(after, Tree.root_only(after[-1]), [0]),
                               fresh.logits(after, Tree.root_only(after[-1]), [0]),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_pool_grown_on_the_device_is_read_once(weights, kind, monkeypatch):
    """One read for the whole pool, however deep: a GPU waits once, not once per level."""
    target, draft = _pair(weights, kind)
    context = CONTEXTS[1]
    run_now(pool_passes(draft, context, 3, 1, None))  # the committed entries, fed and read
    monkeypatch.setattr(TorchRows, "_defer_checks", True)
    with fetches() as reads:
        run_now(pool_passes(draft, context, 3, 5, None))
    assert reads == [(draft.name, 4 * 5)]  # select, kept, tokens, log-probs of 5 levels


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_pruned_pool_drafted_to_full_depth_on_a_gpu_is_the_hosts(weights, kind):
    """A GPU has no read to stop a pruned pool on, so it drafts to the full depth, feeding the
    dead nodes (their keys -inf, their children dead); what it reads is still `grow`'s pool,
    node for node, down to a budget of 1."""
    from replayed_graphs import gpu_branches

    target, draft = _pair(weights, kind)
    _, reference = _pair(weights, kind)
    for shape in [*SHAPES[1:], (5, 5, 2), (1, 4, 1), (4, 5, 14)]:
        for context in CONTEXTS:
            with gpu_branches(count_waits=False):
                got = run_now(pool_passes(draft, context, *shape))
            _same_pool(got, _on_host(reference, context, *shape))


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_pool_grown_on_a_gpu_waits_for_nothing_before_its_one_read(weights, kind):
    """The GPU's branches (one sort for each top-k, no early stop), run on the CPU under a
    dispatch mode that flags each operation that makes a GPU's host wait
    (tests/replayed_graphs.py): none from the roots' pass to the pool's one read, pruned or
    not, alone and under guesses."""
    from replayed_graphs import gpu_branches

    target, draft = _pair(weights, kind)
    context = CONTEXTS[1]
    run_now(pool_passes(draft, context, 3, 1, None))  # the committed entries, fed and read
    for grow in (lambda: pool_passes(draft, context, 3, 4, None),
                 lambda: pool_passes(draft, context, 3, 4, 5),
                 lambda: guessed_pools_passes(draft, context, 2, 3, 3)):
        with gpu_branches() as waits:
            run_now(grow())
        assert not waits, waits


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_pool_read_later_comes_with_the_targets_next_read(weights, kind):
    """With a GPU's branches, a pool (and pools under guesses) read later is not read when
    drafted, but with the target's next read on the device (the draw of t0: one wait for
    both), after which giving the pool reads nothing more; the pool is the one read at once,
    and the draft keeps what it fed (its rows at the pool's nodes equal a fresh draft's)."""
    from replayed_graphs import gpu_branches

    context = CONTEXTS[1]
    for later, at_once in ((lambda d: pool_passes_read_later(d, context, 3, 4, 5),
                            lambda d: pool_passes(d, context, 3, 4, 5)),
                           (lambda d: guessed_pools_read_later(d, context, 2, 3, 3),
                            lambda d: guessed_pools_passes(d, context, 2, 3, 3))):
        target, draft = _pair(weights, kind)
        _, reference = _pair(weights, kind)
        root = target.logits(context, Tree.root_only(context[-1]), [0])
        for d in (draft, reference):
            run_now(pool_passes(d, context, 3, 1, None))  # the committed entries
        with gpu_branches(), fetches() as reads:
            read = run_now(later(draft))
            assert reads == []
            target.draw(root, 0.0)
            assert [name for name, _ in reads] == ["t"]
            tree, logq = read()
            assert len(reads) == 1
            want = run_now(at_once(reference))
        _same_pool((tree, logq), want)
        nodes = range(len(tree))
        torch.testing.assert_close(draft.logits(context, tree, nodes),
                                   reference.logits(context, tree, nodes), rtol=1e-10,
                                   atol=1e-10)


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_pool_read_later_is_read_when_asked_for_and_dropped_by_a_reset(weights, kind):
    """Asked for before any read came, the pool is read then; a pool left unread when its
    draft is reset (an abandoned round) never reaches the draft: the next read does not
    adopt it."""
    from replayed_graphs import gpu_branches

    target, draft = _pair(weights, kind)
    context = CONTEXTS[1]
    run_now(pool_passes(draft, context, 3, 1, None))
    with gpu_branches():
        tree, _ = run_now(pool_passes_read_later(draft, context, 3, 3, None))()
        assert len(tree) == 1 + 3 + 9 + 9
        abandoned = run_now(pool_passes_read_later(draft, context, 3, 3, None))
        draft.reset()
        root = target.logits(context, Tree.root_only(context[-1]), [0])
        target.draw(root, 0.0)
    tree, _ = abandoned()  # never read: the lists hold the root alone
    assert len(tree) == 1


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_the_targets_rows_at_the_pools_first_level_come_with_the_pool(weights, kind):
    """With a GPU's branches, a pool read later gives the tokens of its first level on the
    device (`first_level`), in the pool's order; the target's log-probs there, queued before
    the pool is read (what a rule that re-scores with the root row reads), come in the pool's
    one read and equal the log-probs read at the read pool's first-level tokens."""
    from replayed_graphs import gpu_branches

    target, draft = _pair(weights, kind)
    context = CONTEXTS[1]
    root = target.logits(context, Tree.root_only(context[-1]), [0])
    run_now(pool_passes(draft, context, 3, 1, None))
    for temperature in (0.0, 0.7):
        with gpu_branches(), fetches() as reads:
            read = run_now(pool_passes_read_later(draft, context, 3, 3, 5))
            value = target.logprobs_read_later((root, root), read.first_level, temperature)
            tree, _ = read()
            logp = value()
        assert len(reads) == 1
        first = tree.tokens[tree.children(0)]
        np.testing.assert_array_equal(read.first_level.cpu().numpy()[0], first)
        np.testing.assert_allclose(logp, target.logprobs((root, root), first[None],
                                                         temperature), rtol=0, atol=1e-12)


@pytest.mark.parametrize("decoder", ["lrerank", "lrerank_stale", "fts", "fts_redraft"])
def test_rounds_read_together_on_a_gpu_verify_the_trees_read_apart(weights, decoder,
                                                                  monkeypatch):
    """A decode with the GPU's branches (pools, rows and t0 queued into one read) verifies,
    round by round, the trees of a decode that reads each apart: the same tokens and parents,
    the same tokens committed."""
    from replayed_graphs import gpu_branches
    from rerankers import decode_config

    from targetrows.decoding import loop

    config = decode_config(decoder, budget=8, max_new_tokens=20, pool=PoolShape(10, 3))
    verify = loop._verify
    runs = []

    def recorded(target, ctx, tree, *args, **kw):
        runs[-1][1].append((tree.tokens.tolist(), tree.parents.tolist()))
        return (yield from verify(target, ctx, tree, *args, **kw))

    monkeypatch.setattr(loop, "_verify", recorded)
    for gpu in (False, True):
        target, draft = _pair(weights, "standalone")
        runs.append(([], []))
        with gpu_branches() if gpu else nullcontext():
            runs[-1][0].extend(loop.generate(target, draft, CONTEXTS[1], config).tokens)
    assert runs[0] == runs[1]
    assert sum(len(tokens) > 1 for tokens, _ in runs[0][1]) >= 3  # trees with draft nodes


def test_first_token_redrafting_reads_twice_a_round_when_t0_is_a_guess(weights):
    """With the GPU's branches and a draft that is the target itself (so at T = 0 t0, the
    target's argmax, is always the draft's first guess), fts_redraft's round reads twice:
    the guesses' pools with t0, then the verify pass's draws; none of its rounds drafts again
    under t0."""
    from replayed_graphs import gpu_branches
    from rerankers import decode_config

    from targetrows.decoding.loop import generate

    target_hf = weights[0]
    target, draft = HFModel(target_hf, name="t"), HFModel(target_hf, name="d")
    config = decode_config("fts_redraft", budget=6, max_new_tokens=16, pool=PoolShape(3, 3))
    with gpu_branches(), fetches() as reads:
        result = generate(target, draft, CONTEXTS[1], config)
    rounds = len(result.rounds)
    assert all(r.draft_passes == 3 + 1 for r in result.rounds)  # the guesses' pools alone
    assert len(reads) == 2 * rounds


def _decode(target, draft, prompts, config, lanes: int, trees: list):
    """The tokens for each prompt over `lanes` lanes, and each round's verified tree appended
    to `trees` as (tokens, parents), whichever way it was chosen."""
    from targetrows.decoding import loop

    def recorded_verify(target, ctx, tree, *args, **kw):
        trees.append((tree.tokens.tolist(), tree.parents.tolist()))
        return (yield from verify(target, ctx, tree, *args, **kw))

    def recorded_settle(self, tree):
        read = settle(self, tree)
        trees.append((read.tokens.tolist(), read.parents.tolist()))
        # what was fed from the device is the read tree's
        np.testing.assert_array_equal(tree.tokens.cpu().numpy(), read.tokens)
        np.testing.assert_array_equal(tree.depth.cpu().numpy(), read.depth)
        np.testing.assert_array_equal(tree.ancestors.cpu().numpy(), read.ancestor_mask())
        return read

    verify, settle = loop._verify, HFSequence.settle_tree
    with mock.patch.object(loop, "_verify", recorded_verify), \
            mock.patch.object(HFSequence, "settle_tree", recorded_settle):
        jobs = [lambda t, d, p=p: loop.decode_passes(t, d, p, config) for p in prompts]
        return [r.tokens for r in run_batched(target, draft, jobs, lanes)]


@pytest.mark.parametrize("steps", ["alone", "lanes", "static lanes"])
@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
@pytest.mark.parametrize("decoder", ["draft_rank", "rerank"])
def test_trees_chosen_on_the_device_are_the_hosts(weights, decoder, kind, steps, monkeypatch):
    """draft_rank and rerank with their trees chosen on the device
    (`targetrows.hf.device_tree`) verify the trees the rule chooses on the host from the read
    pool (and, for rerank, the root row's log-probs at its first level), and commit the same
    tokens, greedy and sampled (the same draws: the pass's rows are in the same order), with
    the GPU's branches (the pool read with the draws) and without; the tokens, depths and
    ancestors fed from the device are the read tree's."""
    from replayed_graphs import gpu_branches
    from rerankers import decode_config

    from targetrows.decoding import planners

    lanes = 1 if steps == "alone" else 3
    for temperature, gpu, pool in ((0.0, False, PoolShape(4, 4)), (0.8, True, PoolShape(2, 6))):
        config = decode_config(decoder, budget=9, max_new_tokens=16, pool=pool,
                               temperature=temperature, seed=3)
        runs = []
        for on_device in (True, False):
            if not on_device:
                monkeypatch.setattr(planners, "_chosen_on_device", lambda *args: None)
            target, draft = _pair(weights, kind, static=steps == "static lanes")
            trees: list = []
            with gpu_branches() if gpu else nullcontext():
                tokens = _decode(target, draft, CONTEXTS[:lanes], config, lanes, trees)
            runs.append((tokens, sorted(trees)))  # lanes' rounds in the order they ran
        monkeypatch.undo()
        assert runs[0] == runs[1]
        assert sum(len(t) > 1 for t, _ in runs[0][1]) >= 3  # trees with draft nodes
        assert max(len(set(p)) for _, p in runs[0][1]) >= 4  # and depth


@pytest.mark.parametrize("decoder", ["draft_rank", "rerank"])
def test_trees_chosen_on_the_device_are_read_once_a_round_on_a_gpu(weights, decoder):
    """With the GPU's branches, a draft_rank or rerank round reads the device once: the
    verify pass's draws, which bring the pool, and so the tree, with them."""
    from replayed_graphs import gpu_branches
    from rerankers import decode_config

    from targetrows.decoding.loop import generate

    for kind in ("standalone", "eagle3"):
        target, draft = _pair(weights, kind)
        config = decode_config(decoder, budget=9, max_new_tokens=16, pool=PoolShape(4, 4))
        with gpu_branches(), fetches() as reads:
            result = generate(target, draft, CONTEXTS[1], config)
        assert len(reads) == len(result.rounds), (kind, reads)


def test_a_tree_chosen_on_the_device_unlike_the_rules_is_an_error(weights, monkeypatch):
    """The host checks every tree chosen on the device against the rule's own choice: a rule
    that chooses otherwise (here, one node fewer) stops the decode with an error."""
    from rerankers import decode_config

    from targetrows.core.rules.rule import Rule
    from targetrows.decoding.loop import generate

    select = Rule.select
    monkeypatch.setattr(Rule, "select", lambda *a, **kw: select(*a, **kw)[:-1])
    target, draft = _pair(weights, "standalone")
    config = decode_config("draft_rank", budget=9, max_new_tokens=8, pool=PoolShape(4, 4))
    with pytest.raises(RuntimeError, match="chosen on the device .* is not the rule's"):
        generate(target, draft, CONTEXTS[1], config)


@pytest.mark.parametrize("cached", ["nothing", "all but the root", "the root too"])
def test_a_tree_fed_from_the_device_gets_the_rows_of_the_tree_read(weights, cached):
    """A draft_rank tree chosen on the device and fed from there (`tree_on_device_passes`)
    gets the rows a fresh target gives the read tree at every node, whatever the target's
    cache held of the context (a tail to feed first, or the root fed again); committed after,
    the target's next rows are a fresh target's too."""
    from targetrows.core.rules.root_pool import draft_rank

    target, draft = _pair(weights, "standalone")
    reference = HFModel(weights[0], name="reference")
    context = CONTEXTS[1]
    held = {"nothing": 0, "all but the root": len(context) - 1, "the root too": len(context)}
    if held[cached]:
        prefix = context[: held[cached]]
        target.logits(prefix, Tree.root_only(prefix[-1]), [0])
        target.commit(prefix)
    read = run_now(pool_passes_read_later(draft, context, 3, 3, 6))
    chosen = read.choose(6, lambda tree, logq: draft_rank.select(tree, logq, 6))
    rows = run_now(target.tree_on_device_passes(context, chosen))
    tree = target.settle_tree(chosen)
    assert len(tree) == 7
    torch.testing.assert_close(rows, reference.logits(context, tree, range(len(tree))),
                               rtol=1e-10, atol=1e-10)
    deepest = int(np.argmax(tree.depth))
    path = [int(n) for n in tree.ancestor_mask()[deepest].nonzero()[0][1:]]
    after = context + tree.tokens[path].tolist() + [7]
    target.commit(after[:-1])
    fresh = HFModel(weights[0], name="fresh")
    torch.testing.assert_close(target.logits(after, Tree.root_only(7), [0]),
                               fresh.logits(after, Tree.root_only(7), [0]), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
@torch.inference_mode()
def test_frontier_ties_go_to_the_lower_pool_index(weights, kind):
    """A draft whose every token ties (its output layer zeroed): each level's frontier is its
    first nodes in pool order, on the device as on the host (a stable sort; an unstable one
    reorders 36 equal keys), at batch 1 and 3."""
    import copy

    target_hf, draft_hf, folder = weights
    drafts = []
    for _ in range(2):
        target = HFModel(target_hf, name="t")
        if kind == "eagle3":
            draft = load_eagle3(folder, target)
            draft.head.lm_head.weight.zero_()
        else:
            tied = copy.deepcopy(draft_hf)
            tied.get_output_embeddings().weight.zero_()
            draft = HFModel(tied, name="d")
        drafts.append((target, draft))
    (target, draft), (_, reference) = drafts
    for batch in (1, 3):
        jobs = [lambda t, d, c=c: pool_passes(d, c, 6, 3, None) for c in CONTEXTS]
        for context, pool in zip(CONTEXTS, run_batched(target, draft, jobs, batch), strict=True):
            _same_pool(pool, _on_host(reference, context, 6, 3, None))
