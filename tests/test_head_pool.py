"""An EAGLE-3 head's pool grown on the device (`targetrows.hf.head_pool`) is the pool `grow`
chooses level by level on the host: the same nodes, numbered the same, at batch 1, over
batched lanes and with static steps; budget-pruned, under several roots; read once."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_heads import save_tiny_head  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from targetrows.core.passes import run_now  # noqa: E402
from targetrows.core.pool import (  # noqa: E402
    grow_on_host,
    grows_on_device,
    guessed_pools_passes,
    pool_passes,
)
from targetrows.core.tree import Tree  # noqa: E402
from targetrows.decoding.schedule import run_batched  # noqa: E402
from targetrows.hf.eagle3_checkpoint import load_eagle3  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402
from targetrows.hf.static_pass import StaticShape, use_static  # noqa: E402
from targetrows.hf.torch_rows import TorchRows  # noqa: E402

CONTEXTS = [[2, 8, 1, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], [11], [40, 41]]
# (top_k, depth, budget): unpruned, pruned where `grow` stops early, pruned to one deep level
SHAPES = [(4, 3, None), (3, 4, 3), (4, 4, 6), (2, 5, 9)]


@pytest.fixture(scope="module")
def head_folder(tmp_path_factory):
    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float64)
    folder = save_tiny_head(tmp_path_factory.mktemp("h") / "head", target_hf.config,
                            draft_vocab_size=150)
    return target_hf, str(folder)


def _pair(head_folder, static: bool):
    target_hf, folder = head_folder
    target = HFModel(target_hf, name="t")
    head = load_eagle3(folder, target)
    if static:
        from targetrows.hf.static_head import use_static_head

        use_static(target, StaticShape(capacity=128))
        use_static_head(head, StaticShape(capacity=128))
    return target, head


def _on_host(head, context, top_k, depth, budget):
    tokens, parents, logq = [context[-1]], [-1], [0.0]
    run_now(grow_on_host(head, context, tokens, parents, logq, [0], top_k, depth, budget))
    return Tree(tokens, parents), np.array(logq)


def _same_pool(got, want) -> None:
    (tree, logq), (ref, ref_logq) = got, want
    np.testing.assert_array_equal(tree.tokens, ref.tokens)
    np.testing.assert_array_equal(tree.parents, ref.parents)
    np.testing.assert_allclose(logq, ref_logq, rtol=0, atol=1e-10)


@pytest.mark.parametrize("steps", ["alone", "lanes", "static lanes"])
def test_a_pool_grown_on_the_device_is_the_hosts_node_for_node(head_folder, steps):
    target, head = _pair(head_folder, static=steps == "static lanes")
    ref_target, ref_head = _pair(head_folder, static=False)
    assert grows_on_device(head)
    for shape in SHAPES:
        jobs = [lambda t, d, c=c, s=shape: pool_passes(d, c, *s) for c in CONTEXTS]
        got = run_batched(target, head, jobs, 1 if steps == "alone" else 3)
        for context, pool in zip(CONTEXTS, got, strict=True):
            _same_pool(pool, _on_host(ref_head, context, *shape))


def test_pools_under_guesses_grown_on_the_device_are_the_hosts(head_folder):
    """Several roots (first-token redrafting's guesses), at batch 1 and 3."""
    target, head = _pair(head_folder, static=False)
    ref_target, ref_head = _pair(head_folder, static=False)
    ref_head.grow_passes = None  # the host's level-by-level growth (`grows_on_device` False)
    for batch in (1, 3):
        jobs = [lambda t, d, c=c: guessed_pools_passes(d, c, 3, 3, 3) for c in CONTEXTS]
        for context, pool in zip(CONTEXTS, run_batched(target, head, jobs, batch), strict=True):
            _same_pool(pool, run_now(guessed_pools_passes(ref_head, context, 3, 3, 3)))


@torch.inference_mode()
def test_the_head_keeps_what_a_pool_grown_on_the_device_fed(head_folder):
    """After a pool grown on the device, the head's rows at every pool node equal a fresh
    head's (the fed nodes' entries and g are adopted where they were fed), and those fed are
    not fed again."""
    target, head = _pair(head_folder, static=False)
    context = CONTEXTS[1]
    tree, _ = run_now(pool_passes(head, context, 3, 4, None))
    entries = head._k.shape[1]
    fed = np.flatnonzero(head._slot >= 0)
    rows = head.logits(context, tree, fed)
    assert head._k.shape[1] == entries  # nothing fed again
    rows_all = head.logits(context, tree, range(len(tree)))
    fresh_target, fresh = _pair(head_folder, static=False)
    torch.testing.assert_close(rows, fresh.logits(context, tree, fed), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(rows_all, fresh.logits(context, tree, range(len(tree))),
                               rtol=1e-10, atol=1e-10)


def test_a_pool_grown_on_the_device_is_read_once(head_folder, monkeypatch):
    """One read for the whole pool (besides the root's features, which the head's first
    level reads as ever): a GPU waits once, not once per level."""
    target, head = _pair(head_folder, static=False)
    context = CONTEXTS[1]
    run_now(pool_passes(head, context, 3, 1, None))  # the committed entries, fed and read
    reads = []
    fetch = TorchRows._fetch

    def counted(self, *tensors):
        reads.append(len(tensors))
        return fetch(self, *tensors)

    monkeypatch.setattr(TorchRows, "_defer_checks", True)
    monkeypatch.setattr(TorchRows, "_fetch", counted)
    run_now(pool_passes(head, context, 3, 5, None))
    assert reads == [4 * 5]  # select, kept, tokens, log-probs of each of 5 levels
