"""The GPU check's exactness stages (`benchmarks/gpu_check.py`): does every decoder write the
target's own greedy tokens on the device, in which dtype, and where not, why?

- `identity`: tiny random Llama, Qwen2 and Qwen3 targets in float64, every decoder at budgets
  1, 8 and 59 against Hugging Face's `generate(do_sample=False)`, with a random draft (trees
  mostly rejected) and a noisy copy of the target (long accepted paths: the caches get
  compacted), the root pass forced to run on a thread alongside drafting (the two-device
  schedule, on one device).
- `eagle3_identity`: the same with random EAGLE-3 heads of both checkpoint layouts.
- `drift`: a small random Qwen3 target in float32 and bfloat16, every decoder against HF greedy;
  at each parting, the gap of the two best logits in rounding steps (`targetrows.bench.drift`).
"""

from __future__ import annotations

import copy
import itertools
import os
import tempfile

import numpy as np
import torch
from rerankers import decode_config
from tiny_models import ARCHS, tiny_model

from targetrows.bench.drift import drift_markdown, drift_summary, explain_parting, parting
from targetrows.core.pool import PoolShape
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names
from targetrows.hf.model import HFModel

DECODERS = decoder_names()


def noisy_copy(model, scale: float, seed: int):
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_((torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale).to(p.device))
    return out


def hf_greedy(model, prompt: list[int], n_new: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _check(report: dict, label: str, tokens: list[int], reference: list[int]) -> None:
    report["runs"] += 1
    at = parting(reference, tokens)
    if at is not None:
        report["mismatches"].append(f"{label}: first differs at new token {at}")


def identity(device: str, smoke: bool) -> dict:
    """Every decoder against HF greedy generate, float64, root pass on a thread."""
    archs = ARCHS[:1] if smoke else ARCHS
    prompts = [[5, 17, 42], [200, 3], [7] * 9][: 1 if smoke else 3]
    n_new = 12 if smoke else 32
    report = {"runs": 0, "mismatches": [], "accepted_noisy": []}
    for arch in archs:
        target_hf = tiny_model(arch, seed=0, n_layers=2, dtype=torch.float64).to(device)
        drafts = {"random": tiny_model(arch, seed=1, n_layers=1, dtype=torch.float64).to(device),
                  "noisy": noisy_copy(target_hf, 0.01, seed=2)}
        target = HFModel(target_hf, name=f"{arch}-target")
        # (draft, prompts, budgets, top_k, depth): every budget on the first architecture
        full = arch == archs[0] and not smoke
        runs = [("random", prompts, (1, 8, 59) if full else (8,), 8, 3),
                ("noisy", prompts[:2], (8, 59) if full else (8,), 4, 5)]
        for kind, ps, budgets, top_k, depth in runs:
            draft = HFModel(drafts[kind], name=f"{arch}-{kind}-draft")
            for prompt in ps:
                reference = hf_greedy(target_hf, prompt, n_new)
                for decoder, budget in itertools.product(DECODERS, budgets):
                    if decoder == "ar" and budget != budgets[0]:
                        continue
                    cfg = decode_config(decoder, budget=budget, max_new_tokens=n_new,
                                        pool=PoolShape(top_k=top_k, depth=depth), overlap=True)
                    result = generate(target, draft if decoder != "ar" else None, prompt, cfg)
                    _check(report, f"{arch} {kind} {decoder} B={budget} prompt {prompt}",
                           result.tokens, reference)
                    if kind == "noisy" and decoder != "ar":
                        report["accepted_noisy"].append(np.mean([r.accepted for r in result.rounds]))
    return report


def identity_markdown(title: str, rep: dict) -> str:
    ok = not rep["mismatches"]
    lines = [f"## {title}", "",
             f"- decoder runs: {rep['runs']}, mismatches with HF greedy generate: "
             f"{len(rep['mismatches'])} -> {'PASS' if ok else 'FAIL'}"]
    if rep.get("accepted_noisy"):
        lines.append(f"- noisy draft: mean accepted draft tokens per round "
                     f"{np.mean(rep['accepted_noisy']):.2f} (long paths: the caches compact)")
    lines += [f"  - {m}" for m in rep["mismatches"][:20]]
    return "\n".join(lines)


def eagle3_identity(device: str, smoke: bool) -> dict:
    """Tiny float64 targets with random heads, every decoder against HF greedy generation."""
    from tiny_heads import save_tiny_head

    from targetrows.hf.loading import load_eagle3

    report = {"runs": 0, "mismatches": []}
    cases = [("llama", "eagle", 100)] if smoke else [
        ("llama", "eagle", 100), ("qwen2", "speculators", 272), ("qwen3", "eagle", 60)]
    with tempfile.TemporaryDirectory() as folder:
        for arch, layout, vocab in cases:
            target_hf = tiny_model(arch, seed=0, n_layers=6, dtype=torch.float64).to(device)
            head = save_tiny_head(os.path.join(folder, f"{arch}-{layout}"), target_hf.config,
                                  layout=layout, draft_vocab_size=vocab)
            target = HFModel(target_hf, name=arch)
            draft = load_eagle3(head, target)
            budgets = (1, 8) if smoke else ((1, 8, 59) if arch == "llama" else (8,))
            for prompt in [[5, 17, 42], [200, 3, 9]][: 1 if smoke else 2]:
                reference = hf_greedy(target_hf, prompt, 24)
                for decoder, budget in itertools.product(DECODERS, budgets):
                    cfg = decode_config(decoder, budget=budget, max_new_tokens=24,
                                        pool=PoolShape(top_k=4, depth=4), overlap=True)
                    out = generate(target, draft if decoder != "ar" else None, prompt, cfg)
                    _check(report, f"{arch}/{layout} {decoder} B={budget} {prompt}", out.tokens,
                           reference)
    return report


def drift(device: str, smoke: bool, dtypes=(torch.float32, torch.bfloat16)) -> dict:
    """Every decoder against HF greedy in each dtype, on a small random Qwen3 target whose
    logits are spread like a trained model's (initializer range 0.3: most top-2 gaps are many
    rounding steps wide, a few are not) with a noisy copy as the draft."""
    n_prompts, n_new = (2, 12) if smoke else (6, 32)  # 8 x 48: 154 s on an H200
    size = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(4, 2000, size=int(rng.integers(4, 40))).tolist()
               for _ in range(n_prompts)]
    records = []
    for dtype in dtypes:
        target_hf = tiny_model("qwen3", seed=3, n_layers=4, vocab_size=2048, dtype=dtype,
                               **size).to(device)
        draft_hf = noisy_copy(target_hf, 0.02, seed=4)
        target, draft = HFModel(target_hf, name="drift-target"), HFModel(draft_hf, name="d")
        name = str(dtype).replace("torch.", "")
        for prompt in prompts:
            reference = hf_greedy(target_hf, prompt, n_new)
            for decoder in DECODERS:
                cfg = decode_config(decoder, budget=8, max_new_tokens=n_new,
                                    pool=PoolShape(top_k=4, depth=4))
                tokens = generate(target, draft if decoder != "ar" else None, prompt, cfg).tokens
                records.append(dict(dtype=name, decoder=decoder, parting=explain_parting(
                    target, prompt, reference, tokens)))
        del target, draft, target_hf, draft_hf
    return {"records": records}


def drift_section(rep: dict) -> str:
    return "\n".join([
        "## Temperature-0 drift against HF greedy (random small Qwen3, B=8)", "",
        "Runs whose tokens equal HF `generate(do_sample=False)` in the same dtype; at a parting, "
        "the gap between the target's logits of the two tokens there (one fresh pass over the "
        "context) in "
        "rounding steps of the dtype, and a near-tie where that gap is at most twice what "
        "rounding between pass shapes moves the row there (`targetrows.bench.drift`).", "",
        drift_markdown(drift_summary(rep["records"]))])
