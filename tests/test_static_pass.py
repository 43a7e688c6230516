"""Static-shape passes (`targetrows.hf.static_pass`), run eagerly on the CPU, where the GPU's
graphs replay the same code: padded passes equal unpadded ones, every decoder through them
equals Hugging Face greedy, compaction equals a fresh prefill, and the capacity is a limit."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replayed_graphs import REPLAY, CaptureError, counting_launches, replay_in_place  # noqa: E402
from test_batch import HF_PROMPTS, STOP, _configs, _one_by_one  # noqa: E402
from test_decoders_hf import hf_greedy, noisy_copy  # noqa: E402
from tiny_models import ARCHS, tiny_model  # noqa: E402

from targetrows.core.pool import PoolShape  # noqa: E402
from targetrows.core.tree import Tree  # noqa: E402
from targetrows.decoding.batch import generate_batch  # noqa: E402
from targetrows.decoding.loop import generate  # noqa: E402
from targetrows.decoding.registry import decoder_names, pass_widths  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402
from targetrows.hf.static_pass import (  # noqa: E402
    BUCKETS,
    CapacityError,
    StaticShape,
    apply_graphs,
    use_static,
)

CAPACITY = 64


def static_model(hf_model, name="t", capacity=CAPACITY, **kw) -> HFModel:
    model = HFModel(hf_model, name=name, **kw)
    use_static(model, StaticShape(capacity=capacity))
    return model


def _step(model, ctx, tree):
    """One tree pass's rows, then the KV entries and features it leaves."""
    rows = model.logits(ctx, tree, range(len(tree)))
    kv = [(layer.keys.clone(), layer.values.clone()) for layer in model.kv_cache.layers]
    return rows, kv, model._kept.rows.clone()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_a_padded_static_pass_equals_the_unpadded_pass(arch, dtype, tol):
    """Lanes at different lengths, fed 1, 3, 5 and 7 tokens (padded to buckets 1, 4, 8 and 8)
    beside a lane that asks for nothing (all padding): each lane's rows, KV entries and
    features equal those of its own unpadded eager pass."""
    hf = tiny_model(arch, seed=0, n_layers=2, dtype=dtype)
    lanes = static_model(hf, feature_layers=[0, 1]).lanes(4)
    contexts = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11], [4, 4, 9]]
    trees = [Tree([5, 9, 8, 7, 6], [-1, 0, 0, 1, 3]), Tree([3], [-1]),
             Tree([11, 12, 13], [-1, 0, 0]), Tree([9, 1, 2, 3, 4, 5, 6], [-1, 0, 1, 1, 0, 4, 5])]
    for lane, ctx in zip(lanes, contexts, strict=True):  # committed prefixes of each length
        if len(ctx) > 2:
            lane.logits(ctx[:-2], Tree.root_only(ctx[-3]), [0])
            lane.commit(ctx[:-1])
    for active in ([0, 1, 2], [3, 1]):
        steps = [(lanes[i], lanes[i].logits_passes(contexts[i], trees[i], range(len(trees[i]))))
                 for i in active]
        requests = [next(s) for _, s in steps]
        results = requests[0].group.run_batch([r.item for r in requests])
        for i, (lane, s), result in zip(active, steps, results, strict=True):
            try:
                s.send(result)
            except StopIteration as done:
                rows = done.value
            one = HFModel(hf, name="one", feature_layers=[0, 1])
            ctx = contexts[i]
            if len(ctx) > 2:
                one.logits(ctx[:-2], Tree.root_only(ctx[-3]), [0])
                one.commit(ctx[:-1])
            want_rows, want_kv, want_features = _step(one, ctx, trees[i])
            torch.testing.assert_close(rows, want_rows, rtol=tol, atol=tol)
            for layer, (keys, values) in zip(lane.kv_cache.layers, want_kv, strict=True):
                torch.testing.assert_close(layer.keys, keys, rtol=tol, atol=tol)
                torch.testing.assert_close(layer.values, values, rtol=tol, atol=tol)
            torch.testing.assert_close(lane._kept.rows, want_features, rtol=tol, atol=tol)
        for lane, ctx in zip(lanes, contexts, strict=True):
            lane.reset(None)
            if len(ctx) > 2:
                lane.logits(ctx[:-2], Tree.root_only(ctx[-3]), [0])
                lane.commit(ctx[:-1])


@pytest.fixture(scope="module")
def llama():
    target = tiny_model("llama", seed=0, n_layers=2, dtype=torch.float64)
    return target, noisy_copy(target, 0.01, seed=2)


def test_every_decoder_through_static_passes_equals_hf_greedy(llama):
    """T = 0, target and draft both static, at batch 1 and 3: each sequence's tokens equal
    Hugging Face greedy up to its stop, and its eager batch-1 run."""
    target_hf, draft_hf = llama
    eager = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    target, draft = static_model(target_hf, "t"), static_model(draft_hf, "d")
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
    assert set(target._passes.stats.passes) <= {1, 2, 4, 8, 16, 32, 64, 128}


def test_outputs_replayed_in_place_are_read_before_the_next_replay(llama, monkeypatch, tmp_path):
    """A graph's outputs are overwritten by its next replay: decoders with a standalone draft
    and with an EAGLE-3 head (its steps static too), at batch 1 and 3, give their eager
    tokens when each bucket's outputs live in one place (nothing handed over is a view that a
    later pass overwrites)."""
    from tiny_heads import save_tiny_head

    from targetrows.hf.eagle3_checkpoint import load_eagle3
    from targetrows.hf.static_head import use_static_head

    replay_in_place(monkeypatch)
    target_hf, draft_hf = llama
    head_target = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path / "h", head_target.config, draft_vocab_size=150)
    shape = StaticShape(capacity=CAPACITY, graphs=True)
    pairs = []
    for t_hf, d_hf in ((target_hf, draft_hf), (head_target, None)):
        models = []
        for static in (False, True):
            t = HFModel(t_hf, name="t")
            d = load_eagle3(str(folder), t) if d_hf is None else HFModel(d_hf, name="d")
            if static:
                use_static(t, shape)
                (use_static(d, shape) if d_hf is not None else use_static_head(d, shape))
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
        assert all(m._passes.stats.captured > 0 if isinstance(m, HFModel)
                   else m._steps.stats.captured > 0 for m in replayed)


def test_the_graph_stand_in_fails_where_a_cuda_graph_would(monkeypatch):
    """The CPU stand-in for graphs (tests/replayed_graphs.py) replays a pass that reads only
    its buffers, and raises on what a CUDA graph would refuse to capture (a host wait, a
    boolean index) or would replay wrongly (a Python value, a tensor made anew per pass)."""
    from targetrows.hf.graphs import BucketGraphs, HostInputs

    replay_in_place(monkeypatch)
    state = {"offset": 0.0, "made": [torch.zeros(4)]}

    class Buffers:
        def __init__(self):
            self.host = HostInputs(torch.device("cpu"), x=((4,), torch.float32))
            self.x = self.host.x

    def run(compute):
        graphs = BucketGraphs(torch.device("cpu"), True, lambda width: Buffers(), compute)
        outs = []
        for i in range(3):
            inputs = graphs.inputs(4)
            inputs.host.send(x=np.full(4, float(i)))
            outs.append(graphs.run(inputs, 4, True).clone())
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
    from targetrows.hf.graphs import BucketGraphs, HostInputs
    from targetrows.hf.torch_rows import host_to_device

    replay_in_place(monkeypatch)

    class Buffers:
        def __init__(self):
            self.host = HostInputs(torch.device("cpu"), x=((4,), torch.float32))

    graphs = BucketGraphs(torch.device("cpu"), True, lambda width: Buffers(),
                          lambda b: (2 * b.host.x + 1).sin().cumsum(0))
    inputs = graphs.inputs(4)
    graphs.run(inputs, 4, True)  # the capture: not counted
    with counting_launches() as counts:
        inputs.host.send(x=np.arange(4, dtype=np.float32))
        out = graphs.run(inputs, 4, True).clone().view(2, 2)
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
    from targetrows.hf.graphs import HostInputs

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
        assert inputs.ids.dtype == torch.int64 and inputs.allowed.dtype == torch.bool
        for name, value in sent.items():
            np.testing.assert_array_equal(getattr(inputs, name).numpy(), value)


def test_lanes_asked_for_again_replay_their_graphs_and_retire_the_earlier_ones(llama,
                                                                               monkeypatch):
    """A model's static lanes at one count keep their group: the next batch at that count
    replays the graphs the first captured (and gives the same tokens), and lanes made before
    it can no longer reach the rows they handed over."""
    replay_in_place(monkeypatch)
    target_hf, draft_hf = llama
    shape = StaticShape(capacity=CAPACITY, graphs=True)
    target, draft = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
    use_static(target, shape)
    use_static(draft, shape)
    earlier = target.lanes(3)
    group = earlier[0]._passes
    prompts = HF_PROMPTS[:4]
    configs = _configs("draft_rank", len(prompts), pool=PoolShape(top_k=4, depth=3))
    want = [r.tokens for r in generate_batch(target, draft, prompts, configs, 3)]
    captured = group.stats.captured
    assert captured > 0
    assert [r.tokens for r in generate_batch(target, draft, prompts, configs, 3)] == want
    assert group.stats.captured == captured
    with pytest.raises(RuntimeError, match="later lanes"):
        earlier[0].logits([5, 17], Tree.root_only(17), [0])
    with pytest.raises(RuntimeError, match="later lanes"):
        earlier[1].reset()


@pytest.mark.parametrize("batch", [1, 3])
def test_a_static_head_step_drafts_what_an_eager_step_does(tmp_path, batch):
    """An EAGLE-3 head's static steps, padded to buckets, over lanes at different lengths and
    positions (trees of other shapes): each lane's rows, keys, values and outputs g equal the
    eager batch-1 head's (float64)."""
    from test_batch import _head_draft
    from tiny_heads import save_tiny_head

    from targetrows.decoding.schedule import run_batched
    from targetrows.hf.eagle3_checkpoint import load_eagle3
    from targetrows.hf.static_head import use_static_head

    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path / "h", target_hf.config, draft_vocab_size=150)
    eager = HFModel(target_hf, name="t")
    eager_head = load_eagle3(str(folder), eager)
    target = HFModel(target_hf, name="t")
    head = load_eagle3(str(folder), target)
    use_static(target, StaticShape(capacity=CAPACITY))
    use_static_head(head, StaticShape(capacity=CAPACITY))
    contexts = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11, 4]]
    trees = [Tree([5, 9, 8, 7, 6], [-1, 0, 0, 1, 3]), Tree([3, 4], [-1, 0]),
             Tree([4, 12, 13, 14], [-1, 0, 0, 2])]
    jobs = [lambda t, d, c=c, tree=tree: _head_draft(t, d, c, tree)
            for c, tree in zip(contexts, trees, strict=True)]
    got = run_batched(target, head, jobs, batch)
    for job, drafted in zip(jobs, got, strict=True):
        want = run_batched(eager, eager_head, [job], 1)[0]
        for g, w in zip(drafted, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_head_lanes_asked_for_again_retire_the_earlier_ones(tmp_path):
    """An EAGLE-3 head's static lanes, asked for again at the same count over the same target
    lanes, take over the rows: the earlier head lanes raise, the new ones draft."""
    from test_batch import _head_draft
    from tiny_heads import save_tiny_head

    from targetrows.core.passes import run_now
    from targetrows.hf.eagle3_checkpoint import load_eagle3
    from targetrows.hf.static_head import use_static_head

    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    target = HFModel(target_hf, name="t")
    head = load_eagle3(str(save_tiny_head(tmp_path / "h", target_hf.config,
                                          draft_vocab_size=150)), target)
    use_static(target, StaticShape(capacity=CAPACITY))
    use_static_head(head, StaticShape(capacity=CAPACITY))
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
    the entries moved into place equal those a fresh prefill of the committed context makes."""
    target_hf, _ = llama
    other, lane = static_model(target_hf, feature_layers=[0, 1]).lanes(2)
    other.logits([9, 7, 3, 1, 4, 2, 6, 5], Tree.root_only(5), [0])  # the row beside it
    beside = [(layer.keys.clone(), layer.values.clone()) for layer in other.kv_cache.layers]
    ctx = [5, 17, 42, 8]
    lane.logits(ctx, Tree.root_only(ctx[-1]), [0])
    lane.commit(ctx)
    tree = Tree([8, 1, 2, 3, 4, 5], [-1, 0, 0, 2, 3, 1])  # the path 8 -> 2 -> 3 -> 4
    lane.logits(ctx, tree, range(len(tree)))
    committed = ctx + [2, 3, 4]
    lane.commit(committed)
    for layer, (keys, values) in zip(other.kv_cache.layers, beside, strict=True):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    fresh = HFModel(target_hf, name="fresh", feature_layers=[0, 1])
    fresh.logits(committed, Tree.root_only(committed[-1]), [0])
    assert lane.kv_cache.get_seq_length() == len(committed)
    for layer, ref in zip(lane.kv_cache.layers, fresh.kv_cache.layers, strict=True):
        torch.testing.assert_close(layer.keys, ref.keys, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(layer.values, ref.values, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lane._kept.rows, fresh._kept.rows, rtol=1e-10, atol=1e-10)


@torch.inference_mode()
def test_a_commit_moves_the_path_in_every_layer_at_once():
    """On a GPU a commit's compaction is launches the host makes one by one, after the verify
    pass's read: it must not take a copy per layer (a 36-layer 8B's would be 144)."""
    launched = []
    for n_layers in (1, 4):
        lane = static_model(tiny_model("llama", seed=0, n_layers=n_layers)).lanes(2)[1]
        ctx = [5, 17, 42, 8]
        lane.logits(ctx, Tree.root_only(ctx[-1]), [0])
        lane.commit(ctx)
        lane.logits(ctx, Tree([8, 1, 2, 3], [-1, 0, 0, 2]), range(4))
        with counting_launches() as counts:
            lane.commit(ctx + [2, 3])  # nodes 2 and 3, fed after node 1: moved
        launched.append(sum(counts.values()))
    assert launched[0] == launched[1] <= 4, launched


@torch.inference_mode()
def test_the_feature_buffer_of_static_passes_is_allocated_once(llama):
    """Static passes keep the target's features (what an EAGLE-3 head drafts from) in one
    buffer per sequence, made at the capacity: contexts past an eager buffer's first size
    (256 entries) and a new sequence write into the same memory, so a graph's copy never
    meets a buffer that moved (and nothing is copied beside a root pass on its own stream)."""
    target_hf, _ = llama
    lane = static_model(target_hf, capacity=400, feature_layers=[0, 1]).lanes(2)[0]
    buffers = set()
    for ctx in ([5, 17, 42], [i % 50 + 1 for i in range(300)], [9, 8] * 180):
        lane.reset()
        lane.logits(ctx, Tree.root_only(ctx[-1]), [0])
        lane.commit(ctx)
        lane.logits(ctx, Tree([ctx[-1], 3, 4], [-1, 0, 1]), [1, 2])
        buffers.add(lane._kept.buffer.data_ptr())
        assert lane._kept.buffer.shape[0] == 400
    assert len(buffers) == 1


def test_a_context_past_the_capacity_is_an_error_naming_the_setting(llama):
    target_hf, _ = llama
    model = static_model(target_hf, capacity=8)
    model.logits(list(range(1, 8)), Tree.root_only(7), [0])
    with pytest.raises(CapacityError, match="--max-context"):
        model.logits(list(range(1, 8)), Tree([7, 1, 2], [-1, 0, 0]), [0, 1, 2])


def test_graphs_on_where_they_cannot_run_fails_and_auto_stays_eager(llama):
    target_hf, _ = llama
    model = HFModel(target_hf, name="t")
    with pytest.raises(ValueError, match="CUDA"):
        apply_graphs([model], "on")
    assert apply_graphs([model], "auto") == [] and model.engine.lane_group is None
    with pytest.raises(ValueError, match="auto, on, off"):
        apply_graphs([model], "always")


def test_buckets():
    shape = StaticShape(buckets=(1, 2, 4, 8))
    assert [shape.bucket(n) for n in (1, 2, 3, 5, 8, 9, 300)] == [1, 2, 4, 8, 8, 9, 300]
    with pytest.raises(ValueError, match="increasing"):
        StaticShape(buckets=(4, 2))
    assert np.all(np.diff(StaticShape().buckets) > 0)


def test_a_jobs_pass_widths_are_what_its_passes_feed_most(llama, monkeypatch):
    """With the widths `--graphs` adds to the powers of two (the registry's `pass_widths`: a
    pool's levels, 10 wide or 20 under two guesses; a full tree's verify pass, the budget and
    the root or t0), the width each model's passes feed most replays unpadded for every
    decoder; and no pass but a prefill feeds more than the widest of them."""
    target_hf, draft_hf = llama
    pool, budget = PoolShape(top_k=10, depth=3), 12
    fed = {"t": [], "d": []}
    bucket = StaticShape.bucket

    def recorded(shape, width):
        fed["t" if shape.capacity == CAPACITY else "d"].append(width)
        return bucket(shape, width)

    monkeypatch.setattr(StaticShape, "bucket", recorded)
    for name in decoder_names():
        widths = pass_widths([name], pool, [budget])
        shape = StaticShape(capacity=CAPACITY, buckets=tuple(sorted({*BUCKETS, *widths})))
        target, draft = HFModel(target_hf, name="t"), HFModel(draft_hf, name="d")
        use_static(target, shape)
        use_static(draft, StaticShape(capacity=CAPACITY + 1, buckets=shape.buckets))
        config = _configs(name, 1, budgets=(budget,), pool=pool)[0]
        fed["t"].clear(), fed["d"].clear()
        generate(target, draft if config.decoder.needs_draft else None, HF_PROMPTS[1], config)
        for model, passes in fed.items():
            if not passes:
                assert model == "d" and not config.decoder.needs_draft, name
                continue
            commonest = max(set(passes), key=passes.count)
            assert commonest in shape.buckets, (name, model, passes, widths)
            assert max(passes[1:]) <= max(widths), (name, model, passes, widths)
