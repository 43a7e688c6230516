"""The root pass beside drafting against one after the other, part by part.

A decoder with a root pass (`Decoder.root_pass`: rerank, fts, pearl, ...) can run it beside
its drafting (`DecodeConfig.overlap`; on by default when target and draft sit on different
devices). That pays only where the two really run at once: where the drafting's wall time is
below the root pass plus the draft work run alone. Here each such decoder decodes the same
prompts both ways, the two runs interleaved prompt by prompt (warm-up first), and the table
gives each part's mean per round:

- root: the root pass (beside: as it ran while the draft worked);
- draft: the draft's work;
- drafting: wall time until the tree is drafted (root pass included);
- verify and round, and tokens/s over the prompts.

The same tokens either way is a check of its own: the two schedules run the same passes on the
same inputs, so any difference means the root pass and the drafting were not kept apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names, get_decoder

PARTS = ("t_root", "t_draft", "t_drafting", "t_verify", "t_round")


def root_pass_decoders() -> list[str]:
    """The registered decoders whose round has a root pass, learned ones left out (they need a
    trained rule)."""
    return [n for n in decoder_names(learned=False) if get_decoder(n).root_pass]


def measure_overlap(target, draft, prompts: Sequence[Sequence[int]], config: DecodeConfig,
                    decoders: Sequence[str] | None = None) -> list[dict]:
    """For each decoder (default: `root_pass_decoders`) and each schedule (alongside or not):
    the parts' mean milliseconds per round, tokens/s, and whether the tokens of every prompt
    were the same both ways. `config` gives everything but the decoder and the schedule."""
    rows = []
    for name in decoders or root_pass_decoders():
        runs = {False: [], True: []}
        for i, prompt in enumerate(prompts):
            for alongside in (False, True):
                cfg = replace(config, decoder=get_decoder(name), overlap=alongside)
                if i == 0:  # warm-up: first passes, allocations
                    generate(target, draft, list(prompt), cfg)
                runs[alongside].append(generate(target, draft, list(prompt), cfg))
        same = all(a.tokens == b.tokens for a, b in zip(runs[False], runs[True], strict=True))
        for alongside, results in runs.items():
            rounds = [r for res in results for r in res.rounds]
            rows.append({
                "decoder": name, "alongside": alongside,
                **{k: 1e3 * float(np.mean([getattr(r, k) for r in rounds])) for k in PARTS},
                "tokens_per_s": (sum(len(res.tokens) for res in results)
                                 / sum(res.wall_time for res in results)),
                "same_tokens": same,
            })
    return rows


def overlap_markdown(rows: Sequence[dict], title: str) -> str:
    """The table of `measure_overlap`'s rows under a `## title`."""
    lines = [f"## {title}", "",
             "Mean ms per round. Alongside: the root pass queued on a stream of its own (a "
             "GPU runs it beside the draft's passes; a CPU runs the two in turn). Overlap pays "
             "only where "
             "drafting < root + draft, and the round with it. Same tokens: every prompt's "
             "tokens equal both ways.", "",
             "| decoder | alongside | root | draft | drafting | root + draft | verify | round | "
             "tokens/s | same tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['decoder']} | {r['alongside']} | {r['t_root']:.1f} | "
                     f"{r['t_draft']:.1f} | {r['t_drafting']:.1f} | "
                     f"{r['t_root'] + r['t_draft']:.1f} | {r['t_verify']:.1f} | "
                     f"{r['t_round']:.1f} | {r['tokens_per_s']:.1f} | {r['same_tokens']} |")
    return "\n".join(lines)
