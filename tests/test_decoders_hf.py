"""Every registered decoder on tiny random-weight Hugging Face models (CPU): lossless, exact caches, CLI."""

import copy
import dataclasses
import itertools
import json
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cli_in_process import run_cli
from rerankers import decode_config
from sampling_check import assert_first_tokens_follow_the_target
from tiny_models import ARCHS, save_tiny_pair, tiny_model, tiny_tokenizer

from targetrows.core.pool import PoolShape
from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names

DECODERS = decoder_names()
from targetrows.hf.lanes import Lanes
from targetrows.hf.model import HFModel

PROMPTS = [[5, 17, 42], [200, 3], [7] * 9, [100, 101, 102, 103, 104, 105], [64]]


def noisy_copy(model, scale, seed):
    """A draft that agrees with the target often but not always: its weights plus noise."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
    return draft


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    target = tiny_model(request.param, seed=0, n_layers=2, dtype=torch.float64)
    drafts = {
        "random": tiny_model(request.param, seed=1, n_layers=1, dtype=torch.float64),
        "noisy": noisy_copy(target, 0.01, seed=2),
    }
    return request.param, target, drafts


def hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# (draft, prompts, budgets, top_k, depth): a random draft (other seed, fewer layers) on every
# prompt, where most trees are rejected, and a noisy copy of the target on two prompts, where
# deep paths are accepted and the caches are compacted after long accepted paths.
IDENTITY_RUNS = [("random", PROMPTS, (1, 8, 59), 8, 2), ("noisy", PROMPTS[:2], (8, 59), 4, 5)]


@pytest.mark.slow
def test_greedy_identity_with_generate(pair):
    """Every decoder reproduces `generate(do_sample=False)` token for token (5 prompts x 48)."""
    arch, target_hf, drafts = pair
    target = HFModel(target_hf, name="target")
    accepted = []
    for kind, prompts, budgets, top_k, depth in IDENTITY_RUNS:
        draft = HFModel(drafts[kind], name="draft")
        for prompt in prompts:
            reference = hf_greedy(target_hf, prompt, 48)
            ar = generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=48))
            assert ar.tokens == reference, (arch, "ar", prompt)
            for decoder, budget in itertools.product(DECODERS[1:], budgets):
                cfg = decode_config(decoder, budget=budget, max_new_tokens=48,
                                   pool=PoolShape(top_k=top_k, depth=depth))
                result = generate(target, draft, prompt, cfg)
                assert result.tokens == reference, (arch, kind, decoder, budget, prompt)
                if kind == "noisy":
                    accepted.append(np.mean([r.accepted for r in result.rounds]))
    # the noisy draft makes the trees matter: many draft tokens get accepted and committed
    assert np.mean(accepted) > 0.5


def test_caches_equal_a_fresh_prefill(pair):
    arch, target_hf, drafts = pair
    target, draft = HFModel(target_hf, name="target"), HFModel(drafts["noisy"], name="draft")
    for decoder in ("draft_rank", "fts", "pearl", "rerank", "sequoia", "racer", "recycle"):
        cfg = decode_config(decoder, budget=12, max_new_tokens=30, pool=PoolShape(top_k=3, depth=4))
        prompt = PROMPTS[3]
        uses_draft = cfg.decoder.needs_draft
        result = generate(target, draft if uses_draft else None, prompt, cfg)
        committed = prompt + result.tokens
        for model in (target, draft) if uses_draft else (target,):
            cached = model.cached_tokens
            assert cached.tolist() == committed[: len(cached)]
            assert len(cached) >= len(committed) - 2  # compacted in place, not re-prefilled
            fresh = model.model(torch.tensor([cached.tolist()]), use_cache=True)
            layers, _ = model.kv_entries()
            assert layers[0][0].shape[1] == len(cached)
            for (keys, values), ref in zip(layers, fresh.past_key_values.layers, strict=True):
                torch.testing.assert_close(keys, ref.keys[0], rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(values, ref.values[0], rtol=1e-9, atol=1e-9)


def test_racers_prompt_rows_are_the_prefills_and_become_its_cache(pair, monkeypatch):
    """RACER's first round asks the target for its rows along the prompt (chain trees, in parts
    here): their top-k ids are a prefill's, the cache then holds the prompt as a prefill's, and
    the verify pass feeds the tree alone (the root's row came from the prompt pass)."""
    from targetrows.decoding import planners
    from targetrows.decoding.loop import new_state

    monkeypatch.setattr(planners, "PROMPT_ROWS_AT_ONCE", 4)
    arch, target_hf, _ = pair
    target = HFModel(target_hf, name="target")
    prompt = PROMPTS[3] + PROMPTS[0]  # 9 tokens: parts of 4, 4 and 1
    config = DecodeConfig("racer", budget=6, max_new_tokens=1, recycle_k=5)
    state = new_state(target, config)
    fed = []
    run_batch = Lanes.run_batch
    monkeypatch.setattr(Lanes, "run_batch", lambda passes, feeds: fed.extend(
        len(feed.ids) for feed in feeds) or run_batch(passes, feeds))
    result = generate(target, None, prompt, config, state)
    with torch.no_grad():
        rows = target_hf(torch.tensor([prompt])).logits[0]
    want = torch.topk(torch.log_softmax(rows, -1), 5).indices.numpy()
    seen = {t: i for i, t in enumerate(prompt)}  # a token's last position writes its row
    for token, i in seen.items():
        assert state.table.ids[token].tolist() == want[i].tolist(), (arch, token)
    # then the verify pass: the tree's nodes, without the root
    assert fed[:3] == [4, 4, 1] and fed[3] == result.rounds[0].nodes > 0
    cached = target.cached_tokens.tolist()
    assert cached[: len(prompt)] == prompt


@pytest.mark.slow
def test_sampling_is_lossless_small_vocab():
    """Temperature 1: each decoder's first 3 tokens follow the target's own distribution."""
    vocab, samples = 5, 1000
    target_hf = tiny_model("qwen3", seed=3, n_layers=1, vocab_size=vocab, init_range=0.5,
                           dtype=torch.float64, eos_token_id=None, pad_token_id=None)
    draft_hf = noisy_copy(target_hf, 0.3, seed=4)
    target, draft = HFModel(target_hf, name="target"), HFModel(draft_hf, name="draft")
    assert_first_tokens_follow_the_target(target_hf, target, draft, DECODERS, [1, 2], vocab,
                                          samples)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "targetrows.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), "llama")


def test_compare_end_to_end(saved_pair, tmp_path, capsys):
    """Every registered decoder, the learned ones with the rerankers given (--reranker)."""
    from rerankers import RERANKERS

    target, draft = saved_pair
    out = tmp_path / "compare.json"
    files = []
    for rule, model in RERANKERS.items():
        files.append(str(tmp_path / f"{rule}.json"))
        model.save(files[-1])
    proc = run_cli(
        capsys, "compare", "--target", target, "--draft", draft, "--prompt", "Tell me a story",
        "--budget", "8", "--max-new-tokens", "24", "--reranker", *files, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "every decoder reproduced ar's tokens exactly" in proc.stdout
    for name in DECODERS:
        assert name in proc.stdout
    doc = json.loads(out.read_text())
    rows = {r["decoder"]: r for r in doc["decoders"]}
    assert set(rows) == set(DECODERS)
    assert all(r["token_ids"] == rows["ar"]["token_ids"] for r in rows.values())
    assert rows["ar"]["text"] == tiny_tokenizer().decode(rows["ar"]["token_ids"],
                                                         skip_special_tokens=True)
    assert doc["budget"] == 8 and doc["depth"] == 6  # --depth's default


def test_compare_at_batch_size_3(saved_pair, tmp_path, capsys):
    """--batch-size 3: three copies of the prompt at once per decoder, each the same as the
    first (compare checks), and every decoder's tokens ar's."""
    target, draft = saved_pair
    out = tmp_path / "compare.json"
    proc = run_cli(
        capsys, "compare", "--target", target, "--draft", draft, "--prompt", "Tell me a story",
        "--decoders", "ar", "fts", "pearl", "racer", "--budget", "6", "--max-new-tokens", "12",
        "--batch-size", "3", "--dtype", "float32", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "every decoder reproduced ar's tokens exactly" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["batch_size"] == 3
    assert len({tuple(r["token_ids"]) for r in doc["decoders"]}) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_batched_copy_that_parts_beyond_rounding_is_an_error(monkeypatch, dtype):
    """compare's batched copies: a copy whose token is far from the target's best at the
    parting (planted here) is an error in any dtype, the batched passes' spread measured
    there; greedy, rounding cannot explain it."""
    from targetrows.bench import compare

    target = HFModel(tiny_model("llama", n_layers=2, dtype=dtype), name="t")
    prompt, cfg = [5, 17, 42], DecodeConfig("ar", max_new_tokens=6)
    copies = compare.generate_batch(target, None, [prompt] * 3, cfg, 3)
    planted = list(copies[0].tokens)
    planted[2] = int(target.logits(prompt + planted[:2], Tree.root_only(planted[1]), [0])
                     .float().argmin())
    copies[2] = dataclasses.replace(copies[2], tokens=planted)
    monkeypatch.setattr(compare, "generate_batch", lambda *a: copies)
    with pytest.raises(RuntimeError, match="copy 2 of the prompt in a batch of 3 parted"):
        compare.batched_copies(target, None, prompt, cfg, 3)


def test_compare_budget_auto_runs_at_the_depth_it_picks(saved_pair, tmp_path, capsys):
    target, draft = saved_pair
    out = tmp_path / "compare.json"
    proc = run_cli(
        capsys, "compare", "--target", target, "--draft", draft, "--prompt", "Tell me a story",
        "--budget", "auto", "--decoders", "ar", "draft_rank", "--top-k", "4", "--depth", "3",
        "--max-new-tokens", "12", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["budget_auto"]
    picked = re.search(r"draft_rank: budget auto -> (no tree, ar \(best tree: )?(\d+) at depth "
                       r"(\d+)", proc.stderr)
    assert 1 <= int(picked[3]) <= 3  # --depth is the deepest pool tried
    rows = {r["decoder"]: r for r in doc["decoders"]}
    assert rows["ar"]["budget"] is None
    if picked[1]:  # no tree beat ar on this machine: draft_rank ran as ar
        assert doc["budget"] == doc["depth"] == rows["draft_rank"]["budget"] == 0
        assert rows["draft_rank"]["mean_nodes"] == 0
    else:
        assert (doc["budget"], doc["depth"]) == (int(picked[2]), int(picked[3]))
        assert rows["draft_rank"]["budget"] == doc["budget"]


@pytest.mark.parametrize("batch", ["1", "2"])
def test_compare_runs_an_auto_pick_of_no_tree_as_ar(saved_pair, tmp_path, monkeypatch, capsys,
                                                    batch):
    """Where no tree beats ar (tree passes timed dear), `auto` picks no tree: compare runs every
    tree decoder with ar's config (ar's tokens, no tree, no draft pass), its rows and the JSON
    say budget 0, and the best tree it passed over is named; the pick is per sequence at
    --batch-size."""
    import functools

    from targetrows.cli import main
    from targetrows.cost import calibration
    from targetrows.cost.parttimes import PartTimes, PassCurve

    # a verify pass of n nodes: 10 ms + 40 ms per node beyond the first
    dear = PartTimes(PassCurve((1, 2, 200), (0.01, 0.05, 7.97)), PassCurve((1,), (0.002,)), 3)
    monkeypatch.setattr(calibration, "auto_budget",
                        functools.partial(calibration.auto_budget, parts=dear))
    target, draft = saved_pair
    out = tmp_path / "compare.json"
    code = main(["compare", "--target", target, "--draft", draft, "--prompt", "Tell me a story",
                 "--budget", "auto", "--decoders", "ar", "draft_rank", "fts", "--top-k", "3",
                 "--depth", "2", "--max-new-tokens", "8", "--batch-size", batch, "--dtype",
                 "float32", "--json", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "draft_rank: budget auto -> no tree, ar (best tree: " in printed.err
    assert ("per sequence at batch size 2 " in printed.err) == (batch == "2")
    doc = json.loads(out.read_text())
    rows = {r["decoder"]: r for r in doc["decoders"]}
    for name in ("draft_rank", "fts"):
        assert rows[name]["token_ids"] == rows["ar"]["token_ids"]
        assert all(r["nodes"] == r["draft_passes"] == 0 for r in rows[name]["rounds"])
        assert (rows[name]["budget"], rows[name]["depth"]) == (0, 0)
        assert any(line.split()[:4] == [name, "no", "tree,", "ar"]
                   for line in printed.out.splitlines())
    assert (doc["budget"], doc["depth"], doc["budget_auto"]) == (0, 0, True)


class _RowTarget:
    """A target whose row is `row` wherever it is asked (what `divergence` reads)."""

    def __init__(self, row):
        self.row, self.contexts = row, []

    def reset(self, seed=None):
        pass

    def logits(self, context, tree, nodes):
        self.contexts.append(list(context))
        return self.row[None]


def test_compare_explains_near_ties_and_fails_on_real_differences():
    from types import SimpleNamespace as Result

    from targetrows.bench.compare import lossless_report

    results = {"ar": Result(tokens=[1, 0, 2]), "same": Result(tokens=[1, 0, 2]),
               "tie": Result(tokens=[1, 1, 2])}
    close = torch.tensor([22.875, 22.625, 3.0], dtype=torch.bfloat16)  # 2 bf16 steps at 22.9
    target = _RowTarget(close)
    status, lines = lossless_report(target, [7], results)
    assert status == 0 and len(lines) == 1, lines
    assert lines[0].startswith("near-tie: tie parts from ar at new token 1 ([1] vs [0])")
    assert "2.0 rounding steps of torch.bfloat16" in lines[0]
    assert target.contexts == [[7, 1]]  # the prompt and ar's tokens before the parting
    far = torch.tensor([30.0, 20.0, 3.0], dtype=torch.bfloat16)
    status, lines = lossless_report(_RowTarget(far), [7], results)
    assert status == 1 and lines[0].startswith("LOSSLESS CHECK FAILED: tie parts from ar")
    # the same gap is thousands of float32 steps: a real difference
    assert lossless_report(_RowTarget(close.float()), [7], results)[0] == 1
    # the best two are a near-tie, but the token taken is the third, far below both
    third = {"ar": Result(tokens=[1, 0, 2]), "far": Result(tokens=[1, 2, 2])}
    assert lossless_report(_RowTarget(close), [7], third)[0] == 1
    # stopping early is never a near-tie
    short = {"ar": Result(tokens=[1, 0, 2]), "short": Result(tokens=[1, 0])}
    assert lossless_report(_RowTarget(close), [7], short)[0] == 1
    status, lines = lossless_report(_RowTarget(far), [7], {"ar": Result(tokens=[1]),
                                                          "b": Result(tokens=[1])})
    assert status == 0 and lines == ["temperature 0: every decoder reproduced ar's tokens exactly"]


def test_help_lists_the_commands():
    proc = _cli("--help")
    assert proc.returncode == 0
    for command in ("compare", "decode", "record", "score", "build-target", "distill"):
        assert command in proc.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--budget", "0"], "--budget must be a positive integer"),
        (["--temperature", "-1"], "--temperature must be a number >= 0"),
        (["--prompt", "  "], "--prompt is empty"),
    ],
)
def test_compare_bad_input(saved_pair, extra, message, capsys):
    target, draft = saved_pair
    args = ["compare", "--target", target, "--draft", draft, "--prompt", "hi", *extra]
    proc = run_cli(capsys, *args)
    assert proc.returncode != 0 and message in proc.stderr


def test_compare_unknown_model_and_vocab_mismatch(saved_pair, tmp_path, capsys):
    from tiny_models import save_tiny

    target, _ = saved_pair
    proc = run_cli(capsys, "compare", "--target", str(tmp_path / "nope"), "--draft", target,
                   "--prompt", "hi")
    assert proc.returncode != 0 and "nope" in proc.stderr
    other = save_tiny(tmp_path / "other", "llama", tokenizer=tiny_tokenizer(("<extra>",)))
    proc = run_cli(capsys, "compare", "--target", target, "--draft", other, "--prompt", "hi")
    assert proc.returncode != 0 and "tokenizer" in proc.stderr.lower()
