"""The one pass every model runs (`targetrows.hf.pass_builder`, `lanes`): padded passes
over the whole cache (what `--graphs` replays on a GPU, run here eagerly or through the CPU's
graph stand-in) equal unpadded ones, every decoder through either equals Hugging Face greedy,
compaction equals a fresh prefill, and the cache's limit is a limit."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replayed_graphs import REPLAY, CaptureError, counting_launches, replay_in_place  # noqa: E402
from test_batch import (  # noqa: E402
    HF_PROMPTS,
    STOP,
    _configs,
    _head_draft,
    _one_by_one,
    assert_same_entries,
)
from test_decoders_hf import hf_greedy, noisy_copy  # noqa: E402
from tiny_heads import save_tiny_head  # noqa: E402
from tiny_models import ARCHS, tiny_model  # noqa: E402

from targetrows.core.pool import PoolShape, pool_passes  # noqa: E402
from targetrows.core.tree import Tree  # noqa: E402
from targetrows.decoding.batch import generate_batch  # noqa: E402
from targetrows.decoding.loop import generate  # noqa: E402
from targetrows.decoding.registry import decoder_names, get_decoder, pass_widths  # noqa: E402
from targetrows.decoding.schedule import run_batched  # noqa: E402
from targetrows.hf.graphs import BucketGraphs, HostInputs, apply_graphs, pass_shape  # noqa: E402
from targetrows.hf.kv_cache import CapacityError  # noqa: E402
from targetrows.hf.loading import load_eagle3  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402
from targetrows.hf.pass_builder import BUCKETS, PassShape  # noqa: E402

CAPACITY = 64
PADDED = PassShape(capacity=CAPACITY, pad=True, full_span=True)


def padded(model, shape: PassShape = PADDED):
    """`model` (an `HFModel` or a head) set to padded passes over the whole cache."""
    model.set_pass_shape(shape)
    return model


def _commit_prefix(model, ctx) -> None:
    """All of `ctx` but its last token committed (nothing for a context of two or fewer)."""
    if len(ctx) > 2:
        model.logits(ctx[:-2], Tree.root_only(ctx[-3]), [0])
        model.commit(ctx[:-1])


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_a_padded_pass_equals_the_unpadded_pass(arch, dtype, tol):
    """Lanes at different lengths, fed 1, 3, 5 and 7 tokens (padded to buckets 1, 4, 8 and 8)
    beside a lane that asks for nothing (all padding): each lane's rows, KV entries and
    features equal those of its own unpadded pass."""
    hf = tiny_model(arch, seed=0, n_layers=2, dtype=dtype)
    lanes = padded(HFModel(hf, name="t", feature_layers=[0, 1])).lanes(4)
    contexts = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11], [4, 4, 9]]
    trees = [Tree([5, 9, 8, 7, 6], [-1, 0, 0, 1, 3]), Tree([3], [-1]),
             Tree([11, 12, 13], [-1, 0, 0]), Tree([9, 1, 2, 3, 4, 5, 6], [-1, 0, 1, 1, 0, 4, 5])]
    for active in ([0, 1, 2], [3, 1]):
        for lane, ctx in zip(lanes, contexts, strict=True):
            lane.reset(None)
            _commit_prefix(lane, ctx)
        steps = [lanes[i].logits_passes(contexts[i], trees[i], range(len(trees[i])))
                 for i in active]
        requests = [next(s) for s in steps]
        results = requests[0].group.run_batch([r.item for r in requests])
        for i, s, result in zip(active, steps, results, strict=True):
            with pytest.raises(StopIteration) as done:
                s.send(result)
            one = HFModel(hf, name="one", feature_layers=[0, 1])
            _commit_prefix(one, contexts[i])
            want = one.logits(contexts[i], trees[i], range(len(trees[i])))
            torch.testing.assert_close(done.value.value, want, rtol=tol, atol=tol)
            assert_same_entries(lanes[i], one, tol)


@pytest.fixture(scope="module")
def llama():
    target = tiny_model("llama", seed=0, n_layers=2, dtype=torch.float64)
    return target, noisy_copy(target, 0.01, seed=2)


def test_every_decoder_through_padded_passes_equals_hf_greedy(llama):
    """T = 0, target and draft both padded, at batch 1 and 3: each sequence's tokens equal
    Hugging Face greedy up to its stop, and its unpadded batch-1 run."""
    target_hf, draft_hf = llama
    eager = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    target, draft = padded(HFModel(target_hf, name="t")), padded(HFModel(draft_hf, name="d"))
    greedy = [hf_greedy(target_hf, p, 27) for p in HF_PROMPTS]
    for name in decoder_names():
        configs = _configs(name, len(HF_PROMPTS), pool=PoolShape(top_k=4, depth=3))
        want = _one_by_one(*eager, HF_PROMPTS, configs)
        got = _one_by_one(target, draft, HF_PROMPTS, configs)
        assert got == want, name
        for tokens, ref, config in zip(got, greedy, configs, strict=True):
            assert tokens == ref[: len(tokens)], name
            assert len(tokens) == config.max_new_tokens or tokens[-1] == STOP
        batched = generate_batch(target, draft, HF_PROMPTS, configs, 3)
        assert [r.tokens for r in batched] == want, name


def test_every_decoder_in_float32_at_batch_1_3_and_8_equals_hf_greedy(tmp_path):
    """float32, with a standalone draft and with an EAGLE-3 head: every decoder's tokens at
    batch 1, 3 and 8 equal Hugging Face greedy (up to a stop) and its own batch-1 run."""
    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float32)
    folder = save_tiny_head(tmp_path / "h", target_hf.config, draft_vocab_size=150)
    prompts = HF_PROMPTS[:8]
    greedy = [hf_greedy(target_hf, p, 27) for p in prompts]
    target = HFModel(target_hf, name="t")
    drafts = {"standalone": HFModel(noisy_copy(target_hf, 0.01, seed=2), name="d"),
              "eagle3": None}
    for kind in drafts:
        if kind == "eagle3":
            target = HFModel(target_hf, name="t")
            drafts[kind] = load_eagle3(str(folder), target)
        draft = drafts[kind]
        for name in decoder_names():
            if kind == "eagle3" and not get_decoder(name).needs_draft:
                continue
            configs = _configs(name, len(prompts), pool=PoolShape(top_k=4, depth=3))
            want = _one_by_one(target, draft, prompts, configs)
            for tokens, ref in zip(want, greedy, strict=True):
                assert tokens == ref[: len(tokens)], (kind, name)
            for batch in (3, 8):
                got = generate_batch(target, draft, prompts, configs, batch)
                assert [r.tokens for r in got] == want, (kind, name, batch)


def test_outputs_replayed_in_place_are_read_before_the_next_replay(llama, monkeypatch, tmp_path):
    """A graph's outputs are overwritten by its next replay: decoders with a standalone draft
    and with an EAGLE-3 head (its steps on graphs too), at batch 1 and 3, give their unpadded
    tokens when each bucket's outputs live in one place (nothing handed over is a view that a
    later pass overwrites)."""
    replay_in_place(monkeypatch)
    target_hf, draft_hf = llama
    head_target = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path / "h", head_target.config, draft_vocab_size=150)
    graphs = pass_shape("on", CAPACITY)
    pairs = []
    for t_hf, d_hf in ((target_hf, draft_hf), (head_target, None)):
        models = []
        for on_graphs in (False, True):
            t = HFModel(t_hf, name="t")
            d = load_eagle3(str(folder), t) if d_hf is None else HFModel(d_hf, name="d")
            if on_graphs:
                padded(t, graphs), padded(d, graphs)
            models.append((t, d))
        pairs.append(models)
    prompts = HF_PROMPTS[:5]
    for (eager, replayed) in pairs:
        for name in ("draft_rank", "fts", "fts_redraft"):
            configs = _configs(name, len(prompts), pool=PoolShape(top_k=4, depth=3))
            want = _one_by_one(*eager, prompts, configs)
            assert _one_by_one(*replayed, prompts, configs) == want, name
            batched = generate_batch(*replayed, prompts, configs, 3)
            assert [r.tokens for r in batched] == want, name
        for model in replayed:
            assert model.pass_group.stats.captured > 0


def test_the_graph_stand_in_fails_where_a_cuda_graph_would(monkeypatch):
    """The CPU stand-in for graphs (tests/replayed_graphs.py) replays a pass that reads only
    its buffers, and raises on what a CUDA graph would refuse to capture (a host wait, a
    boolean index) or would replay wrongly (a Python value, a tensor made anew per pass)."""
    replay_in_place(monkeypatch)
    state = {"offset": 0.0, "made": [torch.zeros(4)]}

    class Buffers:
        def __init__(self):
            self.host = HostInputs(torch.device("cpu"), x=((4,), torch.float32))
            self.x = self.host.x

    def run(compute):
        graphs = BucketGraphs(torch.device("cpu"), lambda width: Buffers(), compute)
        outs = []
        for i in range(3):
            inputs = graphs.inputs(4)
            inputs.host.send(x=np.full(4, float(i)))
            outs.append(graphs.run(inputs, 4).clone())
            state["offset"] += 1
            state["made"].append(torch.full((4,), state["offset"]))  # each kept: a new address
        assert graphs.stats.captured == 1
        return outs

    assert [o.tolist() for o in run(lambda b: 2 * b.x + 1)] == [[1.0] * 4, [3.0] * 4, [5.0] * 4]
    with pytest.raises(CaptureError, match="waits"):
        run(lambda b: b.x * b.x.sum().item())
    with pytest.raises(CaptureError, match="boolean"):
        run(lambda b: b.x[b.x >= 0])
    for frozen in (lambda b: b.x + state["offset"], lambda b: b.x + state["made"][-1]):
        with pytest.raises(CaptureError, match="differs from its capture"):
            run(frozen)


def test_launches_count_a_replay_once_and_every_kernel_outside_it(monkeypatch):
    """What benchmarks/host_reads.py counts as a GPU's launches: a replay is one, whatever its
    pass runs; a copy in (which the CPU does not make for `host_to_device`) and an operation
    outside a pass count one each, a view none."""
    from targetrows.hf.torch_rows import host_to_device

    replay_in_place(monkeypatch)

    class Buffers:
        def __init__(self):
            self.host = HostInputs(torch.device("cpu"), x=((4,), torch.float32))

    graphs = BucketGraphs(torch.device("cpu"), lambda width: Buffers(),
                          lambda b: (2 * b.host.x + 1).sin().cumsum(0))
    inputs = graphs.inputs(4)
    graphs.run(inputs, 4)  # the capture: not counted
    with counting_launches() as counts:
        inputs.host.send(x=np.arange(4, dtype=np.float32))
        out = graphs.run(inputs, 4).clone().view(2, 2)
        host_to_device(np.arange(3), torch.device("cpu"))
        with torch.inference_mode():  # where `to` and `reshape` reach a dispatch mode whole
            out.to(torch.float64)  # a copy
            out.reshape(-1).to(torch.float32)  # views of it
            out.expand(2, 2, 2).reshape(-1)  # a copy
    assert counts.pop(REPLAY) == 1 and sum(counts.values()) == 5, counts
    np.testing.assert_allclose(out.reshape(-1).numpy(),
                               np.cumsum(np.sin(2 * np.arange(4) + 1)), atol=1e-6)


def test_host_inputs_go_over_in_one_copy_to_fixed_addresses():
    """A pass's host-filled inputs are views of one buffer, each at a fixed address and
    aligned for its dtype, and one send copies every one in (the buffer's last bytes too)."""
    inputs = HostInputs(torch.device("cpu"), allowed=((2, 3, 5), torch.bool),
                        ids=((2, 3), torch.int64), scale=((7,), torch.float32))
    where = [inputs.allowed.data_ptr(), inputs.ids.data_ptr(), inputs.scale.data_ptr()]
    assert len({t.untyped_storage().data_ptr() for t in (inputs.allowed, inputs.ids,
                                                            inputs.scale)}) == 1
    assert all(t.data_ptr() % t.element_size() == 0 for t in (inputs.ids, inputs.scale))
    rng = np.random.default_rng(0)
    for _ in range(2):
        sent = dict(allowed=rng.random((2, 3, 5)) < 0.5,
                    ids=rng.integers(-2**40, 2**40, size=(2, 3)),
                    scale=rng.standard_normal(7).astype(np.float32))
        inputs.send(**sent)
        assert [inputs.allowed.data_ptr(), inputs.ids.data_ptr(),
                inputs.scale.data_ptr()] == where
        for name, value in sent.items():
            np.testing.assert_array_equal(getattr(inputs, name).numpy(), value)


def test_lanes_asked_for_again_replay_their_graphs_and_retire_the_earlier_ones(llama,
                                                                               monkeypatch):
    """A model's lanes at one count keep their cache and graphs: the next batch at that count
    replays the graphs the first captured (and gives the same tokens), and lanes made before
    it can no longer reach the rows they handed over. Lanes at another count get a cache of
    their own size: batches at 3, then 2, then 4 each give their batch-1 tokens."""
    replay_in_place(monkeypatch)
    target_hf, draft_hf = llama
    shape = pass_shape("on", CAPACITY)
    target, draft = padded(HFModel(target_hf, name="t"), shape), padded(
        HFModel(draft_hf, name="d"), shape)
    earlier = target.lanes(3)
    group = earlier[0].pass_group
    prompts = HF_PROMPTS[:4]
    configs = _configs("draft_rank", len(prompts), pool=PoolShape(top_k=4, depth=3))
    want = _one_by_one(target, draft, prompts, configs)
    assert [r.tokens for r in generate_batch(target, draft, prompts, configs, 3)] == want
    captured = group.stats.captured
    assert captured > 0
    assert [r.tokens for r in generate_batch(target, draft, prompts, configs, 3)] == want
    assert group.stats.captured == captured
    with pytest.raises(RuntimeError, match="later lanes"):
        earlier[0].logits([5, 17], Tree.root_only(17), [0])
    with pytest.raises(RuntimeError, match="later lanes"):
        earlier[1].reset()
    for batch in (2, 4):  # a cache of another size each time: 4 rows never fit one of 3
        assert [r.tokens for r in generate_batch(target, draft, prompts, configs, batch)] == want


def _head_pair(folder, target_hf, shape: PassShape | None = None):
    target = HFModel(target_hf, name="t")
    head = load_eagle3(str(folder), target)
    if shape is not None:
        padded(target, shape), padded(head, shape)
    return target, head


@pytest.mark.parametrize("batch", [1, 3])
def test_a_padded_head_step_drafts_what_an_unpadded_step_does(tmp_path, batch):
    """An EAGLE-3 head's padded steps, over lanes at different lengths and positions (trees of
    other shapes): each lane's rows, keys, values and outputs g equal the unpadded batch-1
    head's (float64)."""
    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path / "h", target_hf.config, draft_vocab_size=150)
    eager = _head_pair(folder, target_hf)
    target, head = _head_pair(folder, target_hf, PADDED)
    contexts = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11, 4]]
    trees = [Tree([5, 9, 8, 7, 6], [-1, 0, 0, 1, 3]), Tree([3, 4], [-1, 0]),
             Tree([4, 12, 13, 14], [-1, 0, 0, 2])]
    jobs = [lambda t, d, c=c, tree=tree: _head_draft(t, d, c, tree)
            for c, tree in zip(contexts, trees, strict=True)]
    got = run_batched(target, head, jobs, batch)
    for job, drafted in zip(jobs, got, strict=True):
        want = run_batched(*eager, [job], 1)[0]
        for g, w in zip(drafted, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_head_lanes_asked_for_again_retire_the_earlier_ones(tmp_path):
    """An EAGLE-3 head's lanes, asked for again at the same count over the same target lanes,
    take over the rows: the earlier head lanes raise, the new ones draft."""
    from targetrows.core.passes import run_now

    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    target, head = _head_pair(save_tiny_head(tmp_path / "h", target_hf.config,
                                             draft_vocab_size=150), target_hf, PADDED)
    t_lanes = target.lanes(2)
    earlier, now = head.lanes(2, t_lanes), head.lanes(2, t_lanes)
    tree = Tree([5, 9, 8], [-1, 0, 0])
    with pytest.raises(RuntimeError, match="later lanes"):
        run_now(_head_draft(t_lanes[0], earlier[0], [2, 8, 1, 5], tree))
    rows = run_now(_head_draft(t_lanes[0], now[0], [2, 8, 1, 5], tree))[0]
    assert rows.shape[0] == len(tree)


@torch.inference_mode()
def test_compaction_after_acceptance_equals_a_fresh_prefill(llama):
    """A tree pass, then a commit of a path through it that is not where the nodes were fed:
    the entries moved into place equal those a fresh prefill of the committed context makes,
    and the row beside it is untouched."""
    target_hf, _ = llama
    other, lane = padded(HFModel(target_hf, name="t", feature_layers=[0, 1])).lanes(2)
    other.logits([9, 7, 3, 1, 4, 2, 6, 5], Tree.root_only(5), [0])  # the row beside it
    beside = [(k.clone(), v.clone()) for k, v in other.kv_entries()[0]]
    ctx = [5, 17, 42, 8]
    lane.logits(ctx, Tree.root_only(ctx[-1]), [0])
    lane.commit(ctx)
    tree = Tree([8, 1, 2, 3, 4, 5], [-1, 0, 0, 2, 3, 1])  # the path 8 -> 2 -> 3 -> 4
    lane.logits(ctx, tree, range(len(tree)))
    committed = ctx + [2, 3, 4]
    lane.commit(committed)
    for (keys, values), (k, v) in zip(other.kv_entries()[0], beside, strict=True):
        assert torch.equal(keys, k) and torch.equal(values, v)
    fresh = HFModel(target_hf, name="fresh", feature_layers=[0, 1])
    fresh.logits(committed, Tree.root_only(committed[-1]), [0])
    assert lane.cached_tokens.tolist() == committed
    assert_same_entries(lane, fresh, 1e-10)


@torch.inference_mode()
def test_a_commit_moves_the_path_in_every_layer_at_once():
    """On a GPU a commit's compaction is launches the host makes one by one, after the verify
    pass's read: it must not take a copy per layer (a 36-layer 8B's would be 144)."""
    launched = []
    for n_layers in (1, 4):
        lane = padded(HFModel(tiny_model("llama", seed=0, n_layers=n_layers))).lanes(2)[1]
        ctx = [5, 17, 42, 8]
        lane.logits(ctx, Tree.root_only(ctx[-1]), [0])
        lane.commit(ctx)
        lane.logits(ctx, Tree([8, 1, 2, 3], [-1, 0, 0, 2]), range(4))
        with counting_launches() as counts:
            lane.commit(ctx + [2, 3])  # nodes 2 and 3, fed after node 1: moved
        launched.append(sum(counts.values()))
    assert launched[0] == launched[1] <= 4, launched


@torch.inference_mode()
def test_a_padded_cache_is_allocated_once(llama):
    """Padded passes (a graph's fixed shapes) keep every entry and feature in one buffer made
    at the limit: contexts past a growing cache's first size (256 entries) and a new sequence
    write into the same memory, so a graph's replay never meets a buffer that moved."""
    target_hf, _ = llama
    model = padded(HFModel(target_hf, name="t", feature_layers=[0, 1]),
                   PassShape(capacity=400, pad=True, full_span=True))
    lane = model.lanes(2)[0]
    where = set()
    for ctx in ([5, 17, 42], [i % 50 + 1 for i in range(300)], [9, 8] * 180):
        lane.reset()
        lane.logits(ctx, Tree.root_only(ctx[-1]), [0])
        lane.commit(ctx)
        lane.logits(ctx, Tree([ctx[-1], 3, 4], [-1, 0, 1]), [1, 2])
        cache = lane._group().cache
        where.add((cache.parts[0].data_ptr(), cache.features.data_ptr()))
    assert len(where) == 1


@torch.inference_mode()
def test_an_unpadded_cache_grows_and_keeps_what_it_holds(llama):
    """On the CPU an unpadded cache starts at 256 entries and grows as a sequence needs: a
    context past it keeps its rows and entries those of a plain forward."""
    target_hf, _ = llama
    model = HFModel(target_hf, name="t", feature_layers=[0, 1])
    first = model._group().cache.capacity
    ctx = [i % 50 + 1 for i in range(300)]
    model.logits(ctx[:200], Tree.root_only(ctx[199]), [0])
    model.commit(ctx[:200])
    rows = model.logits(ctx, Tree([ctx[-1], 3, 4], [-1, 0, 1]), [0, 1, 2])
    assert first == 256 and model._group().cache.capacity >= 302
    with torch.no_grad():
        want = [target_hf(torch.tensor([seq])).logits[0, -1]
                for seq in (ctx, ctx + [3], ctx + [3, 4])]
    torch.testing.assert_close(rows, torch.stack(want)[:, : rows.shape[1]], rtol=1e-9,
                               atol=1e-9)


@pytest.mark.parametrize("shape", [PassShape(capacity=8), PassShape(capacity=8, pad=True,
                                                                    full_span=True)],
                         ids=["unpadded", "padded"])
def test_a_sequence_may_fill_the_cache_and_no_more(llama, shape):
    """A row holds `capacity` real entries: a context that fills it exactly is served, with
    the rows of a model without a limit; one entry more is an error naming the setting (the
    entry after the last is padding's scratch entry, never a real one's)."""
    target_hf, _ = llama
    model = padded(HFModel(target_hf, name="t"), shape)
    ctx = list(range(1, 8))
    model.logits(ctx, Tree.root_only(7), [0])
    model.commit(ctx)
    rows = model.logits(ctx + [9], Tree.root_only(9), [0])  # the 8th entry: the last one
    want = HFModel(target_hf, name="free").logits(ctx + [9], Tree.root_only(9), [0])
    torch.testing.assert_close(rows, want, rtol=1e-10, atol=1e-10)
    model.commit(ctx + [9])
    with pytest.raises(CapacityError, match="--max-context"):
        model.logits(ctx + [9, 10], Tree.root_only(10), [0])


@torch.inference_mode()
def test_padding_never_writes_a_real_entry(tmp_path):
    """A row filled to the cache's last entry sits in padded passes while its neighbour grows
    pools on the device (a standalone draft's and a head's): its entries stay a prefill's."""
    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path / "h", target_hf.config, draft_vocab_size=150)
    shape = PassShape(capacity=16, pad=True, full_span=True)
    full = list(range(3, 19))  # 16 tokens: the target's row full, the head's 15 entries
    for kind in ("standalone", "eagle3"):
        target = padded(HFModel(target_hf, name="t"), shape)
        draft = (padded(load_eagle3(str(folder), target), shape) if kind == "eagle3"
                 else padded(HFModel(noisy_copy(target_hf, 0.05, seed=2), name="d"), shape))
        t_lanes = target.lanes(2)
        lanes = draft.lanes(2, t_lanes) if kind == "eagle3" else draft.lanes(2)
        t_lanes[0].logits(full, Tree.root_only(full[-1]), [0])
        t_lanes[0].commit(full)
        lanes[0].logits(full, Tree.root_only(full[-1]), [0])
        lanes[0].commit(full)
        before = [(k.clone(), v.clone()) for k, v in lanes[0].kv_entries()[0]]
        from targetrows.core.passes import run_now
        run_now(pool_passes(lanes[1], [5, 6, 7], 3, 3, None))
        for (keys, values), (k, v) in zip(lanes[0].kv_entries()[0], before, strict=True):
            assert torch.equal(keys, k) and torch.equal(values, v), kind


def test_graphs_on_where_they_cannot_run_fails_and_auto_stays_eager(llama):
    target_hf, _ = llama
    model = HFModel(target_hf, name="t")
    with pytest.raises(ValueError, match="CUDA"):
        apply_graphs([model], "on")
    assert apply_graphs([model], "auto") == [] and not model.engine.shape.pad
    with pytest.raises(ValueError, match="auto, on, off"):
        apply_graphs([model], "always")


def test_max_context_is_honoured_without_graphs(llama):
    """`--max-context` limits eager passes too: never ignored."""
    target_hf, _ = llama
    model = HFModel(target_hf, name="t")
    apply_graphs([model], "off", capacity=5)
    assert model.max_entries == 5
    with pytest.raises(CapacityError, match="--max-context"):
        model.logits(list(range(1, 7)), Tree.root_only(6), [0])


def test_buckets():
    shape = PassShape(buckets=(1, 2, 4, 8))
    assert [shape.bucket(n) for n in (1, 2, 3, 5, 8, 9, 300)] == [1, 2, 4, 8, 8, 9, 300]
    with pytest.raises(ValueError, match="increasing"):
        PassShape(buckets=(4, 2))
    with pytest.raises(ValueError, match="graphs need pad"):
        PassShape(graphs=True)
    assert np.all(np.diff(PassShape().buckets) > 0)


def test_a_jobs_pass_widths_are_what_its_passes_feed_most(llama, monkeypatch):
    """On graphs (`pass_shape("on", ...)`, as `--graphs` sets them, with the job's widths: a
    pool's levels, 10 wide or 20 under two guesses; a full tree's verify pass, the budget and
    the root or t0), the width each model's passes feed most replays unpadded for every
    decoder (a draft's, one of the job's own widths); and no pass but a prefill feeds more
    than the widest of them."""
    from targetrows.hf.lanes import Lanes

    replay_in_place(monkeypatch)
    target_hf, draft_hf = llama
    pool, budget = PoolShape(top_k=10, depth=3), 12
    fed = {"t": [], "d": []}
    serve = Lanes._serve

    def recorded(passes, feeds):
        fed[passes.name].append(passes.shape.bucket(max(len(f.ids) for f in feeds)))
        return serve(passes, feeds)

    monkeypatch.setattr(Lanes, "_serve", recorded)
    for name in decoder_names():
        widths = pass_widths([name], pool, [budget])
        shape = pass_shape("on", CAPACITY, widths)
        target = padded(HFModel(target_hf, name="t"), shape)
        draft = padded(HFModel(draft_hf, name="d"), shape)
        config = _configs(name, 1, budgets=(budget,), pool=pool)[0]
        fed["t"].clear(), fed["d"].clear()
        generate(target, draft if config.decoder.needs_draft else None, HF_PROMPTS[1], config)
        for model, passes in fed.items():
            if not passes:
                assert model == "d" and not config.decoder.needs_draft, name
                continue
            commonest = max(set(passes), key=passes.count)
            # a draft's levels are 10 wide: padded to 16 were the job's widths left out
            assert commonest in (widths if model == "d" else shape.buckets), (name, passes)
            assert max(passes[1:]) <= max(widths), (name, model, passes, widths)
    assert pass_shape("on", CAPACITY, (10, 17)).buckets == (*BUCKETS[:4], 10, 16, 17,
                                                           *BUCKETS[5:])
