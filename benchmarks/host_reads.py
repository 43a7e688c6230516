"""Host reads per round of every decoder, counted on the CPU: a floor under a GPU's host syncs.

On a GPU the host waits for the device wherever it reads a value back. Our torch backends read
through one function (`TorchRows._fetch`: the draw, a top-k, log-probs, with the checks queued
since the last read, and the reads queued for it), so each call is one wait. This script
counts those calls per round, with the code's GPU branches taken (checks and pools queued for
the next read, top-k from one sort, pools drafted to full depth, part times from timing
events), on tiny float32 models: a standalone draft and a random EAGLE-3 head. It also counts
the other operations that would make a GPU's host wait (under a dispatch mode: an `.item()`, a
`nonzero`, a boolean index, a tensor made from host data other than by `torch_rows.pinned`'s
pinned copy; and a model's `synchronize`); `benchmarks/gpu_check.py` counts a GPU's own syncs
with torch's sync debug mode. The goal is at most 3 a round.

A read drains the GPU's queue, so the card then idles until the host asks for the next pass.
The script also times that host work (`host_gaps`: from each read's return to the next pass or
read, without the counting above, best of `--repeat` decodes): selection, the verify tree's
feed, the walk and the commits. draft_rank and rerank read once a round: their trees are
chosen on the device (`targetrows.hf.device_tree`, as SGLang's EAGLE worker does), and the host
works only after the verify pass's read; for the others, the part after a round's mid-round
reads is what such a round would take off a GPU's round.
On the CPU the device work queued between a read and the next pass runs there and then, so it
counts too (a draft-free decoder's top-k of the verify pass's rows, before its second read):
the figures bound a GPU's host time from above, on this machine's CPU.

Launches: what a GPU would launch one by one on `--graphs` (graph replays, and each device
operation outside a captured pass), counted as `tests/replayed_graphs.py` does; again with a
draft that accepts, at an 8B's depth (`--deep-layers`), for what runs only after an accepted
path.

    python benchmarks/host_reads.py --out benchmarks/results/host_reads.md
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from contextlib import contextmanager, nullcontext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # tiny_models, tiny_heads, rerankers

import numpy as np  # noqa: E402
import torch  # noqa: E402
from replayed_graphs import (  # noqa: E402
    REPLAY,
    counting_launches,
    gpu_branches,
    replayed_in_place,
)
from report_out import emit  # noqa: E402
from rerankers import decode_config  # noqa: E402
from tiny_heads import save_tiny_head  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from targetrows.core.pool import PoolShape  # noqa: E402
from targetrows.decoding import schedule  # noqa: E402
from targetrows.decoding.budget import DEFAULT_BUDGET  # noqa: E402
from targetrows.decoding.loop import generate  # noqa: E402
from targetrows.decoding.registry import decoder_names, pass_widths  # noqa: E402
from targetrows.hf.graphs import pass_shape  # noqa: E402
from targetrows.hf.loading import load_eagle3  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402
from targetrows.hf.pass_builder import PassShape  # noqa: E402
from targetrows.hf.torch_rows import TorchRows  # noqa: E402

PACKAGE = os.path.join("src", "targetrows")


def _ours(skip: str) -> str:
    """The innermost line of our package outside file `skip` on the stack, as file:line name."""
    frame = [f for f in traceback.extract_stack()[:-1]
             if PACKAGE in f.filename and not f.filename.endswith(skip)][-1]
    where = os.path.relpath(frame.filename, os.path.join(HERE, "..", PACKAGE))
    return f"{where}:{frame.lineno} {frame.name}"


@contextmanager
def counting_reads():
    """Count `TorchRows._fetch` calls inside the block, and the other waits a GPU would have,
    each by the innermost line of ours that made it, with the GPU's branches taken."""
    reads: Counter = Counter()
    fetch = TorchRows._fetch

    def counted(self, *tensors, **where):
        reads[_ours("torch_rows.py")] += 1
        return fetch(self, *tensors, **where)

    TorchRows._fetch = counted
    try:
        with gpu_branches() as waits:
            yield reads, waits
    finally:
        TorchRows._fetch = fetch


@contextmanager
def host_gaps(stand_in: bool = True):
    """Host seconds from each read's return to whatever comes next, the scheduler's next pass or
    another read, by the read's line (on a GPU, time the card idles while the host plans), with
    no operation counted. `stand_in`: take the GPU's branches on the CPU (on a GPU, False: they
    are taken anyway). Yields a Counter."""
    gaps: Counter = Counter()
    after: list = [None, 0.0]  # the last read's line and when it returned, until a pass or read
    fetch, pick = TorchRows._fetch, schedule._next_group

    def close() -> None:
        if after[0] is not None:
            gaps[after[0]] += time.perf_counter() - after[1]
            after[0] = None

    def timed_fetch(self, *tensors, **where):
        close()
        site = _ours("torch_rows.py")  # outside the gap: a stack walk is the script's, not ours
        out = fetch(self, *tensors, **where)
        after[:] = [site, time.perf_counter()]
        return out

    def timed_pick(live):
        close()
        return pick(live)

    TorchRows._fetch, schedule._next_group = timed_fetch, timed_pick
    try:
        with gpu_branches(count_waits=False) if stand_in else nullcontext():
            yield gaps
    finally:
        TorchRows._fetch, schedule._next_group = fetch, pick


# the reads made after a round's verify pass: its draws, and a draft-free decoder's top-k of
# the pass's rows (`Plan.observe`); every other read comes before the verify pass
AFTER_VERIFY = (" _verify", " _verify_on_device", " observe")


def gap_ms(target, draft, prompt, config, repeat: int,
           stand_in: bool = True) -> tuple[float, float]:
    """(after the reads before the verify pass, after those after it): host ms a round, of
    the decode (of `repeat`) with the least in all."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        with host_gaps(stand_in) as gaps:
            rounds = len(generate(target, draft, prompt, config).rounds)
        after = sum(s for site, s in gaps.items() if site.endswith(AFTER_VERIFY))
        best = min(best, (1e3 * (sum(gaps.values()) - after) / rounds, 1e3 * after / rounds),
                   key=sum)
    return best


def launches(target, draft, prompt, config) -> Counter:
    """What a GPU would launch one by one in a decode on graphs (`counting_launches`), after a
    decode that captures every pass it runs."""
    with replayed_in_place(), gpu_branches(count_waits=False):
        generate(target, draft, prompt, config)
        with counting_launches() as counts:
            result = generate(target, draft, prompt, config)
    counts["rounds"], counts["tokens"] = len(result.rounds), len(result.tokens)
    return counts


def accepting_launches(args, pool: PoolShape, shape: PassShape, prompt) -> list[str]:
    """The launches table's rows with a draft that accepts, at an 8B's depth: a
    `--deep-layers` target drafted by a twin of itself (at T=0 its tree holds the target's
    greedy path as deep as the rule's tree reaches it, and all of that is accepted). Random
    weights accept almost nothing, so the main table misses what runs only after an accepted
    path (a commit's compaction of the cache, per model)."""
    deep = tiny_model("llama", seed=0, n_layers=args.deep_layers)
    target, draft = (HFModel(deep, name=name) for name in ("deep target", "its twin"))
    for model in (target, draft):
        model.set_pass_shape(shape)
    rows = []
    for name in decoder_names():
        config = decode_config(name, budget=args.budget, max_new_tokens=args.max_new_tokens,
                               pool=pool)
        if not config.decoder.needs_draft:
            continue
        ops = launches(target, draft, prompt, config)
        rounds, tokens = ops.pop("rounds"), ops.pop("tokens")
        replays = ops.pop(REPLAY, 0)
        rows.append(f"| {name} | {rounds} | {tokens / rounds:.1f} | {replays / rounds:.1f} | "
                    f"{sum(ops.values()) / rounds:.0f} |")
    return rows


def on_graphs(models: dict, head_folder: str, shape: PassShape) -> dict:
    """Twins of the script's target and drafts over the same weights, their passes padded and
    replayed as graphs (`--graphs on`), keyed as `models` is."""
    twins = {}
    for key, model in models.items():
        if key == "eagle3":
            continue
        twins[key] = HFModel(model.model, vocab_size=model.vocab_size, name=f"{model.name} (graphs)")
        twins[key].set_pass_shape(shape)
    twins["eagle3"] = load_eagle3(head_folder, twins["target"])
    twins["eagle3"].set_pass_shape(shape)
    return twins


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    p.add_argument("--top-k", type=int, default=PoolShape.top_k)
    p.add_argument("--depth", type=int, default=PoolShape.depth)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--repeat", type=int, default=3, help="decodes timed per decoder (best)")
    p.add_argument("--prompt-tokens", type=int, default=3,
                   help="prompt length (random tokens past the first 3): host work that grows "
                   "with the context shows")
    p.add_argument("--deep-layers", type=int, default=36,
                   help="layers of the target drafted by its twin (a Qwen3-8B has 36)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def header(args, pool: PoolShape, prompt) -> list[str]:
    """The report's title, settings, and the main table's head."""
    return ["# Host reads per round (CPU count: a floor under a GPU's syncs)", "",
            f"- command: `python benchmarks/host_reads.py {' '.join(sys.argv[1:])}`",
            f"- tiny float32 Llama target (6 layers), budget {args.budget}, pool {pool.top_k} x "
            f"{pool.depth}, {len(prompt)} prompt tokens, {args.max_new_tokens} new tokens, T=0; "
            f"torch {torch.__version__}",
            f"- host ms: best of {args.repeat} decodes, on this machine's CPU ({os.cpu_count()}"
            " cores); what a GPU would idle while the host works after a read, before the "
            "verify pass (selection, the tree's feed) and after it (walk, commits, the next "
            "round's first pass); device work in between counts too (it runs on the CPU)",
            "- launches per round: on `--graphs`, what a GPU would launch one by one: graph "
            "replays, and other device operations (a CPU count of the operations that run a "
            "kernel outside captured passes, and of the copies in from the host); random "
            "weights accept almost nothing, so the second table's draft is the target's twin",
            "", "| draft | decoder | rounds | reads per round | other waits per round | "
            "host ms before verify | host ms after verify | graph replays per round | "
            "other launches per round |", "|---|---|---|---|---|---|---|---|---|"]


def decoder_rows(args, target, drafts: dict, graphs: dict, pool: PoolShape, prompt,
                 sites: Counter, other: Counter, launched: Counter) -> list[str]:
    """The main table's rows: every decoder, with each draft it drafts with (draft-free ones
    once); the reads, waits and launches' lines added to `sites`, `other` and `launched`."""
    lines = []
    for kind, draft in drafts.items():
        for name in decoder_names():
            config = decode_config(name, budget=args.budget, max_new_tokens=args.max_new_tokens,
                                   pool=pool)
            drafted = config.decoder.needs_draft
            if kind == "eagle3" and not drafted:
                continue  # draft-free: counted once, under standalone
            used = draft if drafted else None
            with counting_reads() as (reads, waits):
                result = generate(target, used, prompt, config)
            rounds = len(result.rounds)
            before, after = gap_ms(target, used, prompt, config, args.repeat)
            ops = launches(graphs["target"], graphs[kind] if drafted else None, prompt, config)
            per_round = ops.pop("rounds")
            ops.pop("tokens")
            replays = ops.pop(REPLAY, 0)
            lines.append(f"| {kind if drafted else '-'} | {name} | {rounds} | "
                         f"{sum(reads.values()) / rounds:.1f} | "
                         f"{sum(waits.values()) / rounds:.1f} | {before:.2f} | {after:.2f} | "
                         f"{replays / per_round:.1f} | {sum(ops.values()) / per_round:.0f} |")
            sites.update(reads)
            other.update(waits)
            launched.update(ops)
    return lines


def where_lines(title: str, what: str, counts: Counter) -> list[str]:
    """A table of the 12 lines that made the most of `counts`."""
    return (["", f"{title} (all runs above):", "", f"| {what} | line |", "|---|---|"]
            + [f"| {n} | `{site}` |" for site, n in counts.most_common(12)])


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    target_hf = tiny_model("llama", seed=0, n_layers=6)
    target = HFModel(target_hf, name="target")
    folder = tempfile.mkdtemp()
    head = save_tiny_head(os.path.join(folder, "head"), target_hf.config, draft_vocab_size=100)
    drafts = {"standalone": HFModel(tiny_model("llama", seed=1, n_layers=1), name="draft"),
              "eagle3": load_eagle3(head, target)}
    pool = PoolShape(args.top_k, args.depth)
    widths = pass_widths(decoder_names(), pool, [args.budget])
    graphs_shape = pass_shape("on", capacity=512, widths=widths)  # as `--graphs on` sets it
    graphs = on_graphs({"target": target, **drafts}, head, graphs_shape)
    rng = np.random.default_rng(0)
    prompt = [5, 17, 42] + rng.integers(target.vocab_size, size=args.prompt_tokens - 3).tolist()
    sites, other, launched = Counter(), Counter(), Counter()
    lines = header(args, pool, prompt)
    lines += decoder_rows(args, target, drafts, graphs, pool, prompt, sites, other, launched)
    lines += ["", f"Launches per round with a draft that accepts: a {args.deep_layers}-layer "
              "target drafted by a twin of itself (standalone, on graphs):", "",
              "| decoder | rounds | tokens per round | graph replays per round | "
              "other launches per round |", "|---|---|---|---|---|"]
    lines += accepting_launches(args, pool, graphs_shape, prompt)
    lines += where_lines("Where the reads come from", "reads", sites)
    if other:
        lines += where_lines("Other waits", "waits", other)
    lines += where_lines("Where the other launches come from", "launches", launched)
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
