"""Where a draft's guesses go wrong, task by task: the target's greedy reply to each prompt, and at
every reply position whether the draft's top-1 at that exact context is the target's token.

Positions are split three ways:
- **outside the draft's vocabulary**: an EAGLE-3 head drafts from a reduced vocabulary, so these
  tokens can never be accepted, whatever the tree;
- **copy**: the token and the one before it occur together in the prompt (what prompt lookup
  proposes; summaries and code completions are full of them);
- **new**: every other position.

Top-1 agreement at a position is what a one-node chain accepts there, so the table says which
kind of position a better draft (or a larger draft vocabulary) would have to win. The rows are
teacher-forced: the draft sees the target's own reply, as in a round after an accepted path.
For scale, the last column gives prompt lookup's guess at the copies (Hugging Face's rule: the
token after the earliest earlier occurrence of the last two tokens, else of the last one;
`targetrows.core.lookup`). A second table gives that guess at every position, by the length of
the match it came from, and how often the draft's top-1 or the guess is right: what
`--draft-lookup` (the guess mixed into the draft) has to work with.

    python benchmarks/draft_guesses.py --target RUN/resources/models/smollm2-135m-instruct \
        --draft RUN/resources/models/smollm2-135m-eagle3 --prompts config/prompts/*.jsonl \
        --skip 3 --num-prompts 2 --out benchmarks/results/draft_guesses.md
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np
import torch

from targetrows.core.atomic import atomic_write_text
from targetrows.core.lookup import NgramIndex
from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.hf.loading import load_pair
from targetrows.specbench.chat import encode_prompt, stop_ids
from targetrows.specbench.questions import read_questions

KINDS = ("outside", "copy", "new")
# prompt lookup: its guess at copies; at every position, by match length; draft or guess right
LOOKUP = ("lookup", "match2", "match1", "either")


def _rate(hits_and_count: list[int]) -> str:
    hits, count = hits_and_count
    return f"{hits / count:.2f}" if count else "n/a"


def draft_vocabulary(draft) -> np.ndarray | None:
    """The target ids a draft can propose: an EAGLE-3 head's reduced vocabulary (draft id d is
    target id d + d2t[d]), else None (all)."""
    head = getattr(draft, "head", None)
    if head is None:
        return None
    ids = (torch.arange(len(head.d2t)) + head.d2t.cpu()).numpy()
    return ids[ids < draft.vocab_size]


def position_kinds(prompt: list[int], reply: list[int], vocab: np.ndarray | None) -> list[str]:
    """Each reply position's kind: outside the draft vocabulary, a copy from the prompt (its
    bigram with the token before it occurs in the prompt), or new."""
    bigrams = set(zip(prompt[:-1], prompt[1:], strict=True))
    seq = prompt + reply
    kinds = []
    for j in range(len(prompt), len(seq)):
        if vocab is not None and not np.isin(seq[j], vocab):
            kinds.append("outside")
        elif (seq[j - 1], seq[j]) in bigrams:
            kinds.append("copy")
        else:
            kinds.append("new")
    return kinds


@torch.inference_mode()
def draft_hits(target, draft, prompt: list[int], reply: list[int]) -> list[bool]:
    """At each reply position, whether the draft's top-1 at the context before it is the
    reply's token (one draft row per position; the caches carry over from one to the next, and
    a head has the target feed the features it reads)."""
    hits = []
    target.reset(0)
    draft.reset(0)
    seq = prompt + reply
    for j in range(len(prompt), len(seq)):
        ctx = seq[:j]
        ids, _ = draft.topk_at(ctx, Tree.root_only(ctx[-1]), [0], 1)
        draft.commit(ctx)
        hits.append(int(ids[0, 0]) == seq[j])
    return hits


def table(counts: dict[str, dict[str, list[int]]]) -> str:
    """Markdown: per task, the share of positions of each kind and the draft's top-1 agreement on
    each (n/a where a kind has no position); then prompt lookup's guess at every position, by the
    length of the match it came from, and how often the draft's top-1 or that guess is right."""
    lines = ["| task | positions | outside vocabulary | copy share | top-1 at copy | "
             "top-1 at new | top-1 overall | prompt lookup at copy |", "|---|---|---|---|---|---|---|---|"]
    rows = dict(counts)
    rows["all"] = {k: [sum(c[k][0] for c in counts.values()), sum(c[k][1] for c in counts.values())]
                   for k in (*KINDS, *LOOKUP)}
    for task, c in rows.items():
        n = sum(c[k][1] for k in KINDS)
        hit = sum(c[k][0] for k in KINDS)
        lines.append(f"| {task} | {n} | {c['outside'][1] / n:.2f} | {c['copy'][1] / n:.2f} | "
                     f"{_rate(c['copy'])} | {_rate(c['new'])} | {hit / n:.2f} | "
                     f"{_rate(c['lookup'])} |")
    lines += ["", "| task | 2-token match share | right | 1-token match share | right | "
              "top-1 or guess right |", "|---|---|---|---|---|---|"]
    for task, c in rows.items():
        n = sum(c[k][1] for k in KINDS)
        lines.append(f"| {task} | {c['match2'][1] / n:.2f} | {_rate(c['match2'])} | "
                     f"{c['match1'][1] / n:.2f} | {_rate(c['match1'])} | "
                     f"{c['either'][0] / n:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True, help="an EAGLE-3 head or a standalone draft")
    p.add_argument("--prompts", nargs="+", required=True, help="Spec-Bench question files")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N prompts of each file")
    p.add_argument("--num-prompts", type=int, default=2, help="prompts per file after --skip")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="write the Markdown table here too")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, draft, tokenizer = load_pair(args.target, args.draft)
    vocab = draft_vocabulary(draft)
    stop = frozenset(stop_ids(tokenizer, target))
    config = DecodeConfig("ar", max_new_tokens=args.max_new_tokens, stop_ids=stop)
    counts: dict[str, dict[str, list[int]]] = defaultdict(
        lambda: {k: [0, 0] for k in (*KINDS, *LOOKUP)})
    for path in args.prompts:
        for q in read_questions(path)[args.skip : args.skip + args.num_prompts]:
            prompt = encode_prompt(tokenizer, q.turns[0])
            reply = generate(target, None, prompt, config).tokens
            seq = prompt + reply
            index = NgramIndex(2)
            c = counts[q.category]
            for j, kind, hit in zip(range(len(prompt), len(seq)),
                                    position_kinds(prompt, reply, vocab),
                                    draft_hits(target, draft, prompt, reply), strict=True):
                c[kind][0] += int(hit)
                c[kind][1] += 1
                index.extend(seq[:j])
                found = index.guess(seq[:j])
                guessed = found is not None and found[0] == seq[j]
                if kind == "copy":  # the same positions, guessed by prompt lookup
                    c["lookup"][0] += int(guessed)
                    c["lookup"][1] += 1
                if found is not None:
                    c[f"match{found[1]}"][0] += int(guessed)
                    c[f"match{found[1]}"][1] += 1
                c["either"][0] += int(hit or guessed)
                c["either"][1] += 1
    names = [os.path.basename(os.path.normpath(m)) for m in (args.draft, args.target)]
    text = (f"Draft top-1 by position kind: {names[0]} drafting for {names[1]}, prompts "
            f"{args.skip + 1}..{args.skip + args.num_prompts} of each file, "
            f"{args.max_new_tokens} new tokens (T=0).\n\n"
            f"- command: `python benchmarks/draft_guesses.py {' '.join(argv or sys.argv[1:])}`\n\n"
            + table(counts))
    print(text)
    if args.out:
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
