"""Where one decoding step of the target goes: `HFModel`'s one-token step through the lean
forward (`targetrows.hf.forward.LeanForward`) and, on a twin over the same weights, through the
model's own Hugging Face forward over the same kind of cache (`targetrows.hf.hf_forward.HFForward`),
the Hugging Face forward alone on its own cache, and the share of the lean step spent in the
linear layers' products (the rest is the forward's other operations and Python), from cProfile.

    python benchmarks/step_profile.py --model resources/models/smollm2-135m-instruct \
        --dtype bfloat16 --threads 2 --out benchmarks/results/step_profile.md
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import sys
import time

import torch

from targetrows.core.tree import Tree
from targetrows.hf.hf_forward import HFForward, cache_kwargs
from targetrows.hf.loading import load_model
from targetrows.hf.model import HFModel
from targetrows.train.growing_cache import growing_cache

PROMPT = "Explain how a hash map works, with an example in Python, and when to use one."


def step_ms(model, ctx: list[int], n: int) -> float:
    """ms per `ar` step of `model` after a prefill of `ctx` and 5 warm-up steps."""
    model.reset(0)
    model.logits(ctx, Tree.root_only(ctx[-1]), [0])
    model.commit(ctx)
    ctx = steps(model, ctx, 5)
    start = time.perf_counter()
    steps(model, ctx, n)
    return 1e3 * (time.perf_counter() - start) / n


def steps(model, ctx: list[int], n: int) -> list[int]:
    """`n` greedy one-token steps of the round loop's `ar` (logits, draw, commit)."""
    for _ in range(n):
        row = model.logits(ctx, Tree.root_only(ctx[-1]), [0])
        ctx = ctx + [int(model.draw(row, 0.0)[0])]
        model.commit(ctx)
    return ctx


@torch.inference_mode()
def raw_ms(hf, ctx: list[int], n: int) -> float:
    """ms per one-token step of the Hugging Face forward alone, on a cache of `ctx`."""
    cache = growing_cache(hf.config)
    hf(input_ids=torch.tensor([ctx]), use_cache=True, **cache_kwargs(hf, cache))
    x = torch.tensor([[ctx[-1]]])
    for _ in range(3):
        hf(input_ids=x, use_cache=True, **cache_kwargs(hf, cache))
    start = time.perf_counter()
    for _ in range(n):
        hf(input_ids=x, use_cache=True, **cache_kwargs(hf, cache))
    return 1e3 * (time.perf_counter() - start) / n


def hf_twin(model: HFModel) -> HFModel:
    """A twin of `model` over the same weights whose passes run Hugging Face's own forward."""
    twin = HFModel(model.model, vocab_size=model.vocab_size, name=f"{model.name} (HF forward)")
    twin.engine.forward = HFForward(model.model)
    return twin


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, "cpu", args.dtype)
    ctx = tokenizer(PROMPT, add_special_tokens=False)["input_ids"] * 4
    # before the twin's forward hooks its layers (each call of theirs then runs a hook)
    hf_ms = raw_ms(model.model, steps(model, ctx, 5), args.steps)
    hf_model = hf_twin(model)
    lean, hf = [], []
    for _ in range(3):  # interleaved: a busy moment of the machine hits both
        lean.append(step_ms(model, ctx, args.steps))
        hf.append(step_ms(hf_model, ctx, args.steps))
    lean_ms, hf_step_ms = sorted(lean)[1], sorted(hf)[1]
    ctx = steps(model, ctx, 5)
    profile = cProfile.Profile()
    profile.enable()
    steps(model, ctx, args.steps)
    profile.disable()
    stats = pstats.Stats(profile).stats
    total = sum(s[2] for s in stats.values())  # tottime over every function
    linear = sum(s[2] for (_, _, name), s in stats.items()
                 if "linear" in name or "addmm" in name or name.endswith("mm>"))
    text = "\n".join([
        f"- command: `python {' '.join(sys.argv)}`",
        f"- machine: {platform.platform()}, {args.threads} torch threads, torch "
        f"{torch.__version__}; target {args.model} in {model.model.dtype}",
        f"- context: {len(ctx)} tokens; {args.steps} steps each, the median of 3 interleaved "
        "runs", "",
        "| measure | ms per step |", "|---|---|",
        f"| `HFModel` one-token step (`ar`'s: logits, draw, commit), lean forward | {lean_ms:.1f} |",
        f"| the same through Hugging Face's forward (`HFForward`) | {hf_step_ms:.1f} |",
        f"| the Hugging Face forward alone, on its own cache of the same context | {hf_ms:.1f} |",
        f"| of the lean step under cProfile: linear layers' products | "
        f"{1e3 * linear / args.steps:.1f} of {1e3 * total / args.steps:.1f} |", ""])
    print(text)
    if args.out:
        from targetrows.core.atomic import atomic_write_text

        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
