"""The GPU check's graphs stage (`benchmarks/gpu_check.py`): static-shape passes replayed as CUDA
graphs (`targetrows.hf.static_pass`, `--graphs`) against the eager passes, on random weights at
the paper's shapes. `GraphsStage` sets up the models, then measures in parts (`PARTS`), each of
which hands back its report section, so that a run cut short or a part that fails keeps the
others:

- passes: one target pass over 1-128 tree nodes, eager and with graphs (`time_passes`), and
  the 0.6B-shaped draft's pass of 1 and 8 tokens; the weight-streaming bound (the target's
  weight bytes over a measured device copy bandwidth: a pass cannot take less, `ar` cannot
  make more tokens/s than its inverse) comes with the setup;
- kernels: where a static pass's device time goes, kernel by kernel (`kernel_profile`);
- identity: every decoder's tokens with graphs against eager on tiny float32 models, with a
  standalone draft and with an EAGLE-3 head (they must be equal), and the host syncs per round
  on graphs;
- head: the step of an EAGLE-3 head of a Qwen3-8B head's shape feeding 1 and 10 nodes;
- speed: `ar`, `draft_rank` and `fts` tokens/s, eager and with graphs, against that bound, and
  Hugging Face's `generate()`;
- overlap: `rerank` and `fts` on graphs with the root pass replayed on a stream of its own
  beside the draft's passes, against one after the other;
- bench, head_bench: `targetrows bench` on graphs (every decoder, part times and bound on the
  static passes), with the standalone draft and with the head, which the GPU check writes as
  the bench stages' sections and CSV rows;
- goals: capture time and the graphs' memory, and the issue's goals against what was measured.

With --smoke the same code runs tiny on the CPU, eagerly (static shapes without graphs).
"""

from __future__ import annotations

import time
import traceback
from dataclasses import replace

import numpy as np
import torch
from gpu_speed import _prompts, pair_models, random_head_folder
from kernel_profile import copy_bandwidth, kernel_breakdown, kernels_markdown, weight_bytes
from rerankers import decode_config

from targetrows.bench.syncs import counting_syncs
from targetrows.core.pool import PoolShape
from targetrows.cost.parttimes import time_passes
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names, pass_widths
from targetrows.hf.eagle3_checkpoint import load_eagle3
from targetrows.hf.model import HFModel
from targetrows.hf.static_head import use_static_head
from targetrows.hf.static_pass import BUCKETS, StaticShape, use_static

SPEED_DECODERS = ("ar", "draft_rank", "fts")


def graphs_on(device: str) -> bool:
    """Whether the stage replays CUDA graphs (on a CUDA device), or runs static shapes eagerly
    (a test stands graphs in on the CPU by replacing this)."""
    return device.startswith("cuda")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def on_graphs(model: HFModel, name: str, shape: StaticShape) -> HFModel:
    """A second `HFModel` over `model`'s weights, running static-shape passes (graphs on a GPU)."""
    twin = HFModel(model.model, vocab_size=model.vocab_size, name=name)
    use_static(twin, shape)
    return twin


def _tokens_per_s(target, draft, prompts, config) -> tuple[float, list[list[int]]]:
    generate(target, draft, prompts[0], config)  # warm-up: allocator, kernels, graphs
    _sync(str(target.device))
    start, tokens = time.perf_counter(), []
    for p in prompts:
        tokens.append(generate(target, draft, p, config).tokens)
    _sync(str(target.device))
    return sum(map(len, tokens)) / (time.perf_counter() - start), tokens


class GraphsStage:
    """The stage's models and measurements, taken part by part (`PARTS`): each part returns
    its report section, so the GPU check writes it before the next part starts, and a part
    that fails costs only its own section. `rep` holds what the parts measured, for `goals`."""

    def __init__(self, args, device: str, keep: dict):
        self.smoke, self.device, self.args = args.smoke, device, args
        self.use_graphs = graphs_on(device)
        self.rep: dict = {"graphs": self.use_graphs}
        bandwidth = copy_bandwidth(device, self.smoke)
        self.target, self.draft = pair_models(keep, device, self.smoke)
        self.rep["bound_s"] = weight_bytes(self.target) / bandwidth
        self.rep["bandwidth_gbs"] = bandwidth / 1e9
        self.pool, self.budget = ((PoolShape(4, 3), 8) if self.smoke
                                  else (PoolShape(), int(args.budget)))
        # the bench's decoders' pass widths as buckets besides the powers of two, as `--graphs`
        # sets them for a job that runs them all
        widths = pass_widths(decoder_names(learned=False), self.pool, [self.budget])
        capacity = 256 if self.smoke else args.prompt_len + args.max_new_tokens + 2 * 128
        self.shape = StaticShape(capacity, tuple(sorted({*BUCKETS, *widths})),
                                 graphs=self.use_graphs)
        self.start = time.perf_counter()
        self.static_target = on_graphs(self.target, "qwen3-8b (graphs)", self.shape)
        self.static_draft = on_graphs(self.draft, "qwen3-0.6b (graphs)", self.shape)
        rng = np.random.default_rng(0)
        self.ctx = rng.integers(self.target.vocab_size,
                                size=64 if self.smoke else args.prompt_len).tolist()
        self.repeats = 2 if self.smoke else 5
        self._head = None  # (folder, its target, the head): `static_head`

    def setup_markdown(self) -> str:
        bound = self.rep["bound_s"]
        mode = "CUDA graphs" if self.use_graphs else "static shapes, eager (no CUDA device)"
        return (f"## Graphs: static-shape passes ({mode}) against eager\n\nDevice copy "
                f"bandwidth {self.rep['bandwidth_gbs']:.0f} GB/s; the Qwen3-8B-shaped target's "
                f"weights stream in {bound * 1e3:.2f} ms (the weight-streaming bound of one pass; "
                f"ar at most {1 / bound:.0f} tokens/s). Buckets "
                f"{', '.join(map(str, self.shape.buckets))} (the powers of two and the bench "
                "decoders' pass widths, as `--graphs` sets them).")

    def passes(self) -> str:
        """One target pass over 1-128 nodes and the draft's pass of 1 and 8, eager and static."""
        sizes = (1, 2, 4, 8) if self.smoke else (1, 2, 4, 8, 16, 32, 64, 128)
        runs = [(self.target, self.static_target, sizes), (self.draft, self.static_draft, (1, 8))]
        (self.rep["target_passes"], self.rep["draft_pass"]) = (
            {"eager": time_passes(eager, self.ctx, widths, self.repeats),
             "graphs": time_passes(static, self.ctx, widths, self.repeats)}
            for eager, static, widths in runs)
        curves, d = self.rep["target_passes"], self.rep["draft_pass"]
        lines = ["### Pass costs", "", "One target pass feeding n tree nodes on a cached "
                 "context, median ms:", "",
                 "| passes | " + " | ".join(f"n={n}" for n in sizes) + " |",
                 "|---|" + "---|" * len(sizes)]
        lines += [f"| {kind} | " + " | ".join(f"{s * 1e3:.2f}" for s in c.seconds) + " |"
                  for kind, c in curves.items()]
        lines += ["", "Qwen3-0.6B-shaped draft pass, 1 / 8 tokens, ms: eager "
                  f"{_ms(d['eager'])}, graphs {_ms(d['graphs'])}."]
        return "\n".join(lines)

    def kernels(self) -> str:
        """Where a static pass's device time goes (`kernel_breakdown`), at 1 and 64 nodes."""
        eager_static = on_graphs(self.target, "qwen3-8b (static, eager)",
                                 replace(self.shape, graphs=False))
        sizes = (1, 8) if self.smoke else (1, 64)
        self.rep["kernels"] = {n: kernel_breakdown(eager_static, self.ctx, n) for n in sizes}
        return kernels_markdown(self.rep["kernels"], self.use_graphs or self.device != "cpu")

    def identity(self) -> str:
        """Every decoder's tokens, static against eager, and syncs per round on graphs."""
        self.rep.update(_identity_and_syncs(self.device, self.smoke, self.use_graphs))
        lines = ["### Tokens with graphs", "",
                 "Every decoder on tiny float32 models, static passes against eager:", "",
                 "| draft | decoder | same tokens | rounds | syncs per round |",
                 "|---|---|---|---|---|"]
        for r in self.rep["identity"]:
            syncs = "-" if r["syncs"] is None else f"{r['syncs']:.1f}"
            same = f"failed: {r['error']}".replace("|", "/") if "error" in r else r["same"]
            lines.append(f"| {r['draft']} | {r['decoder']} | {same} | {r['rounds']} | "
                         f"{syncs} |")
        failed = [r for r in self.rep["identity"] if "error" in r]
        if failed:
            lines += ["", f"The first failure ({failed[0]['draft']}, {failed[0]['decoder']}):",
                      "", "```", failed[0]["trace"].rstrip(), "```"]
        return "\n".join(lines)

    def static_head(self):
        """(folder, its target, the head): a random EAGLE-3 head of a Qwen3-8B head's shape on
        static steps, reading a twin of the target on static passes, so that no other part's
        target keeps features (made on first use)."""
        if self._head is None:
            folder = random_head_folder(self.target, self.smoke)
            twin = on_graphs(self.target, "qwen3-8b (head, graphs)", self.shape)
            head = load_eagle3(folder, twin)
            use_static_head(head, self.shape)
            self._head = folder, twin, head
        return self._head

    def head(self) -> str:
        """The head's step feeding 1 and 10 nodes (a level of the default pool) on the cached
        context, eager and static."""
        folder, _, static = self.static_head()
        eager = load_eagle3(folder, HFModel(self.target.model, vocab_size=self.target.vocab_size,
                                            name="qwen3-8b (head, eager)"))
        widths = (1, 4) if self.smoke else (1, 10)
        self.rep["head_step"] = h = {
            "eager": time_passes(eager, self.ctx, widths, self.repeats),
            "graphs": time_passes(static, self.ctx, widths, self.repeats)}
        return (f"### EAGLE-3 head step\n\nA Qwen3-8B head's shape, {_widths(h)} nodes, ms: "
                f"eager {_ms(h['eager'])}, graphs {_ms(h['graphs'])}.")

    def speed(self) -> str:
        """ar, draft_rank and fts tokens/s, eager and static, and HF `generate()`'s."""
        args, speed = self.args, {}
        prompts = [p.ids for p in _prompts(self.target.vocab_size,
                                           1 if self.smoke else args.prompts,
                                           16 if self.smoke else args.prompt_len)]
        new = 8 if self.smoke else args.max_new_tokens
        for name in SPEED_DECODERS:
            config = decode_config(name, budget=self.budget, max_new_tokens=new, pool=self.pool)
            drafts = config.decoder.needs_draft
            eager_tps, eager_tokens = _tokens_per_s(self.target, self.draft if drafts else None,
                                                    prompts, config)
            graph_tps, graph_tokens = _tokens_per_s(
                self.static_target, self.static_draft if drafts else None, prompts, config)
            speed[name] = {"eager": eager_tps, "graphs": graph_tps,
                           "same": graph_tokens == eager_tokens}
        self.rep["speed"] = speed
        self.rep["hf_tps"] = _hf_tokens_per_s(self.target, prompts, new)
        bound = self.rep["bound_s"]
        lines = ["### Tokens/s", "",
                 "| decoder | eager tokens/s | graphs tokens/s | graphs / bound | same tokens |",
                 "|---|---|---|---|---|"]
        lines += [f"| {name} | {s['eager']:.1f} | {s['graphs']:.1f} | {s['graphs'] * bound:.2f} "
                  f"| {s['same']} |" for name, s in speed.items()]
        lines += ["", f"HF `generate()` on the target alone: {self.rep['hf_tps']:.1f} tokens/s."]
        return "\n".join(lines)

    def overlap(self) -> str:
        """rerank and fts on graphs, the root pass replayed on a stream of its own beside the
        draft's passes against one after the other, on one GPU (`measure_overlap`): whether
        it now pays on one card, where two Python threads taking turns made it cost."""
        from targetrows.bench.overlap import measure_overlap, overlap_markdown

        prompts = [p.ids for p in _prompts(self.target.vocab_size, 1,
                                           16 if self.smoke else self.args.prompt_len)]
        config = DecodeConfig(budget=self.budget, pool=self.pool,
                              max_new_tokens=8 if self.smoke else self.args.max_new_tokens)
        self.rep["overlap"] = rows = measure_overlap(self.static_target, self.static_draft,
                                                     prompts, config, ("rerank", "fts"))
        return overlap_markdown(rows, "Root pass beside drafting with graphs, one GPU").replace(
            "## ", "### ", 1)

    def bench(self) -> tuple:
        """`targetrows bench` on graphs, as the bench stage runs it eagerly: every decoder on
        the pair, with the part times and the bound taken on the static passes (the cost
        model's inputs from the path that runs). Returns what the GPU check's bench section
        takes."""
        return self._bench(self.static_target, self.static_draft)

    def head_bench(self) -> tuple:
        """The bench on graphs with the head (`static_head`) drafting: the paper's setting."""
        _, target, head = self.static_head()
        return self._bench(target, head)

    def _bench(self, target, draft) -> tuple:
        from targetrows.bench import run as bench
        from targetrows.bench.plan import BenchSettings

        settings = BenchSettings(
            decode=DecodeConfig(max_new_tokens=8 if self.smoke else self.args.max_new_tokens,
                                pool=self.pool),
            temperatures=(0.0,), budget=self.budget, repeats=2 if self.smoke else 3, hf=False)
        prompts = _prompts(self.target.vocab_size, 1 if self.smoke else self.args.prompts,
                           16 if self.smoke else self.args.prompt_len)
        rows, context = bench.run_bench(target, draft, prompts, settings)
        return rows, context, settings, (target, draft), 0.0

    def same_tokens(self) -> bool:
        """Whether every decoder run so far gave eager's tokens on graphs (and the same
        tokens with the root pass beside drafting as after it)."""
        return (all(r["same"] for r in self.rep.get("identity", []))
                and all(s["same"] for s in self.rep.get("speed", {}).values())
                and all(r["same_tokens"] for r in self.rep.get("overlap", [])))

    def goals(self) -> str:
        """The capture's cost, and the issue's goals against what the parts measured."""
        passes = (self.static_target._passes.stats, self.static_draft._passes.stats)
        self.rep["capture"] = c = {
            "captured": sum(s.captured for s in passes),
            "capture_s": sum(s.capture_s for s in passes),
            "graph_gb": sum(s.graph_bytes for s in passes) / 2**30,
            "stage_s": time.perf_counter() - self.start}
        lines = ["### Goals", "", f"Graphs captured (target and draft): {c['captured']} in "
                 f"{c['capture_s']:.1f} s, {c['graph_gb']:.2f} GiB; parts {c['stage_s']:.0f} s.",
                 "", "| goal (graphs on a GPU) | measured | met |", "|---|---|---|"]
        lines += [f"| {goal} | {got} | {'-' if met is None else ('yes' if met else 'no')} |"
                  for goal, got, met in goals(self.rep)]
        return "\n".join(lines)


# the stage's parts after its setup, in the order they run, each with the seconds it needs
PARTS = (("passes", 30), ("kernels", 10), ("identity", 40), ("head", 15), ("speed", 60),
         ("overlap", 40), ("bench", 60), ("head_bench", 45), ("goals", 0))


def _hf_tokens_per_s(target: HFModel, prompts, max_new_tokens: int) -> float:
    """Hugging Face's greedy `generate()` on the target alone, the prompts one at a time (the
    baseline of the issue's `ar` goal)."""
    from targetrows.hf.baselines import hf_generate

    def run(ids):
        return hf_generate(target.model, ids, 0.0, max_new_tokens, (), 0, target.vocab_size)

    run(prompts[0])  # warm-up
    _sync(str(target.device))
    start = time.perf_counter()
    made = sum(len(run(p)) for p in prompts)
    _sync(str(target.device))
    return made / (time.perf_counter() - start)


def goals(rep: dict) -> list[tuple[str, str, bool | None]]:
    """The issue's goals for graphs on a GPU, each (goal, what was measured, met): None where
    this run cannot say (syncs are counted on CUDA only; a part that did not run)."""

    def curve(kind: str) -> tuple[list[int], tuple[float, ...]]:
        return list(rep[kind]["graphs"].sizes), rep[kind]["graphs"].seconds

    def one_token():
        one = curve("target_passes")[1][0]
        return f"{one * 1e3:.2f} ms, {one / rep['bound_s']:.1f}x", one <= 2 * rep["bound_s"]

    def wide():
        sizes, seconds = curve("target_passes")
        n = max(x for x in sizes if x <= 64)
        ratio = seconds[sizes.index(n)] / seconds[0]
        return f"{ratio:.2f}x ({n} nodes)", ratio <= 1.3

    def under(kind: str, limit_s: float):
        sizes, seconds = curve(kind)
        return f"{seconds[-1] * 1e3:.2f} ms ({sizes[-1]} nodes)", seconds[-1] < limit_s

    def ar():
        ratio = rep["speed"]["ar"]["graphs"] / rep["hf_tps"]
        return f"{ratio:.2f}x", ratio >= 4

    def syncs():
        counted = [r["syncs"] for r in rep["identity"] if r["syncs"] is not None]
        if not counted:
            return "not counted (no CUDA)", None
        return f"at most {max(counted):.1f}", max(counted) <= 3

    def same():  # a part that did not run cannot say yes, but one that ran can say no
        ok = (all(r["same"] for r in rep.get("identity", []))
              and all(s["same"] for s in rep.get("speed", {}).values()))
        whole = "identity" in rep and "speed" in rep
        return str(ok) + ("" if whole else " (of the parts that ran)"), (
            ok if whole or not ok else None)

    table = [  # goal, the parts it needs (any one of them for the last), its measure
        ("target's 1-token pass <= 2x its weight-streaming time", ["target_passes"], one_token),
        ("a 64-node pass <= 1.3x the 1-token pass", ["target_passes"], wide),
        ("head step < 1 ms", ["head_step"], lambda: under("head_step", 1e-3)),
        ("0.6B draft pass < 2 ms", ["draft_pass"], lambda: under("draft_pass", 2e-3)),
        ("ar >= 4x HF generate", ["speed"], ar),
        ("<= 3 host syncs a round, every decoder", ["identity"], syncs),
        ("tokens with graphs = eager, every decoder", ["identity", "speed"], same)]
    return [(goal, *measure()) if any(k in rep for k in needs)
            else (goal, "not measured (the part did not finish)", None)
            for goal, needs, measure in table]


def _identity_and_syncs(device: str, smoke: bool, use_graphs: bool) -> dict:
    """Every decoder on tiny float32 models, eager and on graphs, with a standalone draft and
    with a random EAGLE-3 head (its steps on graphs too): the same tokens, and the host syncs
    per round on graphs."""
    import tempfile

    from test_decoders_hf import noisy_copy
    from tiny_heads import save_tiny_head
    from tiny_models import tiny_model

    from targetrows.hf.eagle3_checkpoint import load_eagle3
    from targetrows.hf.static_head import use_static_head

    target_hf = tiny_model("llama", seed=0, n_layers=6).to(device)  # 6: a head reads 3 layers
    draft_hf = noisy_copy(target_hf, 0.01, seed=2)
    folder = save_tiny_head(tempfile.mkdtemp() + "/head", target_hf.config,
                            draft_vocab_size=150)
    pairs = {}
    for kind in ("standalone", "eagle3"):
        models = []
        for static in (False, True):
            target = HFModel(target_hf, name="t")
            draft = (load_eagle3(folder, target) if kind == "eagle3"
                     else HFModel(draft_hf, name="d"))
            if static:
                shape = StaticShape(capacity=128, graphs=use_graphs)
                use_static(target, shape)
                (use_static_head if kind == "eagle3" else use_static)(draft, shape)
            models.append((target, draft))
        pairs[kind] = models
    prompts = [[5, 17, 42], [200, 3, 9, 9, 31], [64]]
    rows = []
    for kind, (eager, static) in pairs.items():
        for name in decoder_names():
            config = decode_config(name, budget=8, max_new_tokens=8 if smoke else 24,
                                   pool=PoolShape(4, 3))
            drafts = config.decoder.needs_draft
            if kind == "eagle3" and not drafts:
                continue
            row = {"draft": kind, "decoder": name, "same": False, "rounds": 0, "syncs": None}
            rows.append(row)
            try:  # a decoder that fails is a row saying how, and the others still run
                want = [generate(eager[0], eager[1] if drafts else None, p, config).tokens
                        for p in prompts]
                got = [generate(static[0], static[1] if drafts else None, p, config).tokens
                       for p in prompts]
                with counting_syncs() as count:
                    result = generate(static[0], static[1] if drafts else None, prompts[0],
                                      config)
            except Exception as err:
                row["error"] = f"{type(err).__name__}: {err}"[:300]
                row["trace"] = traceback.format_exc()[-3000:]
                continue
            row.update(same=got == want, rounds=len(result.rounds),
                       syncs=count.per(len(result.rounds)) if count.counted else None)
    return {"identity": rows}


def _widths(curves: dict) -> str:
    return " / ".join(str(n) for n in curves["eager"].sizes)


def _ms(curve) -> str:
    return " / ".join(f"{t * 1e3:.2f}" for t in curve.seconds)
