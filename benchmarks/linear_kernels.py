"""How long a target pass over n tokens takes with plain `nn.Linear` and with `PackedLinear`, in
float32 and in bfloat16.

A pass over a token tree must cost little more than a one-token pass for speculative decoding
to pay on a CPU. This times, for n = 1..33 new tokens after a cached context, one pass of a
causal LM with its plain linear layers and with `targetrows.hf.packed.pack_linears`, and the
largest difference between the two passes' logits; then the packed model in bfloat16 (what
`--dtype auto` loads where the CPU has fast bfloat16 units); with `--hints`, the packed layers'
time for several oneDNN batch-size hints.

    python benchmarks/linear_kernels.py --model resources/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time

import torch

from targetrows.hf import packed
from targetrows.hf.hf_forward import cache_kwargs
from targetrows.train.growing_cache import growing_cache


@torch.inference_mode()
def pass_ms(model, context: int, n: int, repeats: int) -> tuple[float, torch.Tensor]:
    """Median ms of one pass over n new tokens after `context` cached ones, and its logits."""
    gen = torch.Generator().manual_seed(n)
    vocab = model.config.vocab_size
    cache = growing_cache(model.config)
    model(input_ids=torch.randint(0, vocab, (1, context), generator=gen),
          **cache_kwargs(model, cache))
    ids = torch.randint(0, vocab, (1, n), generator=gen)
    positions = torch.arange(context, context + n)[None]
    mask = torch.zeros(1, 1, n, context + n, dtype=model.dtype)  # a chain; tree masks cost the same
    times = []
    for _ in range(repeats):
        cache.crop(context - cache.get_seq_length()) if cache.get_seq_length() > context else None
        start = time.perf_counter()
        out = model(input_ids=ids, position_ids=positions, attention_mask=mask,
                    **cache_kwargs(model, cache))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), out.logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a causal LM folder")
    parser.add_argument("--context", type=int, default=121, help="cached tokens before the pass")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 5, 9, 17, 33])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hints", type=int, nargs="*", default=[],
                        help="also time the packed layers under these batch-size hints")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    plain = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    fast = copy.deepcopy(plain)
    count = packed.pack_linears(fast)
    half = copy.deepcopy(plain).to(torch.bfloat16)
    packed.pack_linears(half)
    print(f"# Linear layers: plain against packed\n\n- command: `python {' '.join(sys.argv)}`\n"
          f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{args.threads} thread(s)\n- one pass over n new tokens after {args.context} cached "
          f"ones, median of {args.repeats}; {count} linear layers packed\n")
    hints = [h for h in args.hints if h != packed.BATCH_HINT]
    head = ["new tokens", "plain ms", f"packed ms (hint {packed.BATCH_HINT})",
            *[f"hint {h} ms" for h in hints], "plain / packed", "max abs logit difference",
            "bfloat16 packed ms", "float32 / bfloat16 (packed)"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    default_hint = packed.BATCH_HINT
    for n in args.tokens:
        plain_ms, plain_logits = pass_ms(plain, args.context, n, args.repeats)
        fast_ms, fast_logits = pass_ms(fast, args.context, n, args.repeats)
        by_hint = []
        for hint in hints:
            packed.BATCH_HINT = hint
            for module in fast.modules():
                module.__dict__.pop("_packed", None)
            by_hint.append(f"{pass_ms(fast, args.context, n, args.repeats)[0]:.1f}")
            packed.BATCH_HINT = default_hint
            for module in fast.modules():
                module.__dict__.pop("_packed", None)
        diff = (plain_logits - fast_logits).abs().max().item()
        half_ms, _ = pass_ms(half, args.context, n, args.repeats)
        print(f"| {n} | {plain_ms:.1f} | {fast_ms:.1f} | " + "".join(f"{h} | " for h in by_hint)
              + f"{plain_ms / fast_ms:.2f} | {diff:.1e} | {half_ms:.1f} | "
              f"{fast_ms / half_ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
