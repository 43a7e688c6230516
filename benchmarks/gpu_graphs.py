"""The GPU check's graphs stage (`benchmarks/gpu_check.py`): padded passes replayed as CUDA graphs
(`--graphs on`, `targetrows.hf.graphs`) against eager passes (`--graphs off`: the unpadded
passes over the live entries, through the same forward), on random weights at the paper's
shapes. `GraphsStage` sets up the models, then measures in parts (`PARTS`), each of which hands
back its report section, so that a run cut short or a part that fails keeps the others:

- passes: one target pass over 1-128 tree nodes, eager and with graphs (`time_passes`), and
  the 0.6B-shaped draft's pass of 1 and 8 tokens; the weight-streaming bound (the target's
  weight bytes over a measured device copy bandwidth: a pass cannot take less, `ar` cannot
  make more tokens/s than its inverse) comes with the setup;
- kernels: where a padded pass's device time goes, kernel by kernel (`kernel_profile`);
- identity: every decoder's tokens with graphs against eager on tiny float32 models, with a
  standalone draft and with an EAGLE-3 head, judged exactly (a difference fails the check),
  and the host syncs per round on graphs;
- head: the step of an EAGLE-3 head of a Qwen3-8B head's shape feeding 1 and 10 nodes;
- speed: `ar`, `draft_rank` and `fts` tokens/s, eager and with graphs, against that bound, and
  Hugging Face's `generate()`. Their tokens are compared too, on these bfloat16 models, as the
  bench compares a run with HF greedy: padded and unpadded products may round a near-tie of
  the target's two best logits either way, so a parting fails nothing; it is reported with the
  gap of the two logits there against what rounding between pass shapes moves them
  (`targetrows.bench.drift`): a near-tie, or not;
- overlap: `rerank` and `fts` on graphs with the root pass replayed on a stream of its own
  beside the draft's passes, against one after the other (the same tokens, or the check
  fails);
- bench, head_bench: `targetrows bench` on graphs (every decoder, part times and bound on the
  padded passes), with the standalone draft and with the head, which the GPU check writes as
  the bench stages' sections and CSV rows.

Each (model, stream) captures its graphs on a capture stream of its own (`BucketGraphs`), so
that the overlap part's root pass, replayed on its side stream beside the draft's graphs,
shares no cuBLAS workspace with them. `goals_markdown` gives the capture's cost and the
issue's goals against whatever the parts measured: the GPU check rewrites it after every part,
so that it is in the report however the stage ends. Each part's budget (`need_s`) comes from
the work it runs, priced at what the stage has measured by then (`gpu_budgets`).

With --smoke the same code runs tiny on the CPU: padded passes, run eagerly (no graphs).
"""

from __future__ import annotations

import tempfile
import time
import traceback
from dataclasses import replace

import gpu_budgets
import numpy as np
import torch
from gpu_budgets import Decoding
from gpu_exactness import noisy_copy
from gpu_speed import _prompts, pair_models, random_head_folder
from kernel_profile import copy_bandwidth, kernel_breakdown, kernels_markdown, weight_bytes
from rerankers import decode_config

from targetrows.bench.drift import explain_parting, near_tie_steps, row_spread
from targetrows.bench.syncs import counting_syncs
from targetrows.core.pool import PoolShape
from targetrows.cost.parttimes import time_passes
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names, pass_widths
from targetrows.hf.graphs import pass_shape
from targetrows.hf.loading import load_eagle3
from targetrows.hf.model import HFModel
from targetrows.hf.pass_builder import PassShape

SPEED_DECODERS = ("ar", "draft_rank", "fts")
IDENTITY_PROMPTS = ([5, 17, 42], [200, 3, 9, 9, 31], [64])
SETUP_S = 30  # the setup: random weights built on the device, the bandwidth, the probes


def graphs_on(device: str) -> bool:
    """Whether the stage replays CUDA graphs (on a CUDA device), or runs padded passes eagerly
    (a test stands graphs in on the CPU by replacing this)."""
    return device.startswith("cuda")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def on_graphs(model: HFModel, name: str, shape: PassShape) -> HFModel:
    """A second `HFModel` over `model`'s weights, its passes at `shape` (padded, replayed as
    graphs on a GPU)."""
    twin = HFModel(model.model, vocab_size=model.vocab_size, name=name)
    twin.set_pass_shape(shape)
    return twin


def graph_stats(model) -> list:
    """The `GraphStats` of every group of passes `model` (an `HFModel` or an EAGLE-3 head) holds
    now: its own sequence's and its lanes' (a head's rankings too)."""
    return model.graph_stats()


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
    that fails costs only its own section. `rep` holds what the parts measured, for the goals
    and the budgets."""

    speed_decoders = SPEED_DECODERS

    def __init__(self, args, device: str, keep: dict):
        self.smoke, self.device, self.args = args.smoke, device, args
        self.use_graphs = graphs_on(device)
        self.rep: dict = {"graphs": self.use_graphs}
        self._settings(args)
        bandwidth = copy_bandwidth(device, self.smoke)
        self.target, self.draft = pair_models(keep, device, self.smoke)
        self.rep["bound_s"] = weight_bytes(self.target) / bandwidth
        self.rep["dtype"] = str(self.target.dtype).removeprefix("torch.")
        self.rep["bandwidth_gbs"] = bandwidth / 1e9
        # the bench's decoders' pass widths as buckets besides the powers of two, as `--graphs
        # on` sets them for a job that runs them all; the default capacity on a GPU (4,096
        # entries, which every padded pass attends over), a small one on the CPU
        widths = pass_widths(decoder_names(learned=False), self.run.pool, [self.run.budget])
        self.shape = replace(pass_shape("on", 256 if self.smoke else None, widths),
                             graphs=self.use_graphs)
        self.start = time.perf_counter()
        self.graph_target = on_graphs(self.target, "qwen3-8b (graphs)", self.shape)
        self.graph_draft = on_graphs(self.draft, "qwen3-0.6b (graphs)", self.shape)
        rng = np.random.default_rng(0)
        self.ctx = rng.integers(self.target.vocab_size,
                                size=64 if self.smoke else args.prompt_len).tolist()
        self._head = None  # (folder, its target, the head): `graph_head`
        self.tiny = tiny_models(device)
        self.prices = gpu_budgets.probe(self, (HFModel(self.tiny[0], name="tiny target"),
                                               HFModel(self.tiny[1], name="tiny draft")))

    def _settings(self, args) -> None:
        """What the parts run: sizes, repeats, and how the decoding parts decode."""
        smoke = self.smoke
        self.run = Decoding(prompts=1 if smoke else args.prompts,
                            prompt_len=16 if smoke else args.prompt_len,
                            new_tokens=8 if smoke else args.max_new_tokens,
                            budget=8 if smoke else int(args.budget),
                            pool=PoolShape(4, 3) if smoke else PoolShape())
        self.tiny_run = Decoding(prompts=len(IDENTITY_PROMPTS), prompt_len=5,
                                 new_tokens=8 if smoke else 24, budget=8, pool=PoolShape(4, 3))
        self.tiny_shape = pass_shape("on", 128, pass_widths(decoder_names(), self.tiny_run.pool,
                                                            [self.tiny_run.budget]))
        self.sizes = (1, 2, 4, 8) if smoke else (1, 2, 4, 8, 16, 32, 64, 128)
        self.draft_sizes, self.head_widths = (1, 8), ((1, 4) if smoke else (1, 10))
        self.kernel_sizes = (1, 8) if smoke else (1, 64)
        self.repeats, self.bench_repeats = (2, 2) if smoke else (5, 3)

    def need_s(self, part: str) -> float:
        """The seconds `part` needs: its work, priced at what the stage measured so far."""
        return gpu_budgets.need_s(self, part)

    def graph_models(self) -> dict:
        """The 8B-shaped models that replay graphs, by the name the budgets price them under."""
        head = {} if self._head is None else {"head": self._head[2], "head target": self._head[1]}
        return {"target": self.graph_target, "draft": self.graph_draft, **head}

    def captured(self) -> tuple[int, float]:
        """(graphs captured, seconds their captures took) on the 8B-shaped models so far."""
        stats = [s for m in self.graph_models().values() for s in graph_stats(m)]
        return sum(s.captured for s in stats), sum(s.capture_s for s in stats)

    def captured_by(self, name: str) -> int:
        model = self.graph_models().get(name)
        return 0 if model is None else sum(s.captured for s in graph_stats(model))

    def setup_markdown(self) -> str:
        bound = self.rep["bound_s"]
        mode = "CUDA graphs" if self.use_graphs else "padded, eager (no CUDA device)"
        return (f"## Graphs: padded passes ({mode}) against eager\n\nDevice copy "
                f"bandwidth {self.rep['bandwidth_gbs']:.0f} GB/s; the Qwen3-8B-shaped target's "
                f"weights stream in {bound * 1e3:.2f} ms (the weight-streaming bound of one pass; "
                f"ar at most {1 / bound:.0f} tokens/s). Buckets "
                f"{', '.join(map(str, self.shape.buckets))} (the powers of two and the bench "
                "decoders' pass widths, as `--graphs on` sets them); a padded pass attends over "
                f"the whole cache, {self.graph_target.max_entries} entries, an eager one over the "
                "live entries.")

    def passes(self) -> str:
        """One target pass over 1-128 nodes and the draft's pass of 1 and 8, eager and padded."""
        runs = [("target_passes", self.target, self.graph_target, self.sizes),
                ("draft_pass", self.draft, self.graph_draft, self.draft_sizes)]
        for key, eager, graphs, widths in runs:
            self.rep[key] = {"eager": time_passes(eager, self.ctx, widths, self.repeats),
                             "graphs": time_passes(graphs, self.ctx, widths, self.repeats)}
        curves, d = self.rep["target_passes"], self.rep["draft_pass"]
        lines = ["### Pass costs", "", "One target pass feeding n tree nodes on a cached "
                 "context, median ms:", "",
                 "| passes | " + " | ".join(f"n={n}" for n in self.sizes) + " |",
                 "|---|" + "---|" * len(self.sizes)]
        lines += [f"| {kind} | " + " | ".join(f"{s * 1e3:.2f}" for s in c.seconds) + " |"
                  for kind, c in curves.items()]
        lines += ["", "Qwen3-0.6B-shaped draft pass, 1 / 8 tokens, ms: eager "
                  f"{_ms(d['eager'])}, graphs {_ms(d['graphs'])}."]
        return "\n".join(lines)

    def kernels(self) -> str:
        """Where a padded pass's device time goes (`kernel_breakdown`), at 1 and 64 nodes: the
        pass its graph replays, run eagerly so that the profiler sees each kernel."""
        padded = on_graphs(self.target, "qwen3-8b (padded, eager)",
                           replace(self.shape, graphs=False))
        self.rep["kernels"] = {n: kernel_breakdown(padded, self.ctx, n)
                               for n in self.kernel_sizes}
        return kernels_markdown(self.rep["kernels"], self.use_graphs or self.device != "cpu")

    def identity(self) -> str:
        """Every decoder's tokens, graphs against eager in float32, and syncs per round."""
        shape = replace(self.tiny_shape, graphs=self.use_graphs)
        self.rep["identity"] = identity_rows(self.tiny, shape, self.tiny_run)
        return identity_markdown(self.rep["identity"])

    def graph_head(self):
        """(folder, its target, the head): a random EAGLE-3 head of a Qwen3-8B head's shape on
        graphs, reading a twin of the target on graphs, so that no other part's target keeps
        features (made on first use)."""
        if self._head is None:
            folder = random_head_folder(self.target, self.smoke)
            twin = on_graphs(self.target, "qwen3-8b (head, graphs)", self.shape)
            head = load_eagle3(folder, twin)
            head.set_pass_shape(self.shape)
            self._head = folder, twin, head
        return self._head

    def head(self) -> str:
        """The head's step feeding 1 and 10 nodes (a level of the default pool) on the cached
        context, eager and on graphs."""
        folder, _, graphs = self.graph_head()
        eager = load_eagle3(folder, HFModel(self.target.model, vocab_size=self.target.vocab_size,
                                            name="qwen3-8b (head, eager)"))
        self.rep["head_step"] = h = {
            "eager": time_passes(eager, self.ctx, self.head_widths, self.repeats),
            "graphs": time_passes(graphs, self.ctx, self.head_widths, self.repeats)}
        return (f"### EAGLE-3 head step\n\nA Qwen3-8B head's shape, {_widths(h)} nodes, ms: "
                f"eager {_ms(h['eager'])}, graphs {_ms(h['graphs'])}.")

    def speed(self) -> str:
        """ar, draft_rank and fts tokens/s, eager and on graphs, their partings explained, and
        HF `generate()`'s tokens/s."""
        run = self.run
        prompts = [p.ids for p in _prompts(self.target.vocab_size, run.prompts, run.prompt_len)]
        self.rep["speed"] = speed = {}  # filled decoder by decoder: the goals read what ran
        for name in SPEED_DECODERS:
            speed[name] = self._speed_of(name, prompts)
        self.rep["hf_tps"] = _hf_tokens_per_s(self.target, prompts, run.new_tokens)
        return speed_markdown(self.rep)

    def _speed_of(self, name: str, prompts) -> dict:
        config = decode_config(name, budget=self.run.budget, max_new_tokens=self.run.new_tokens,
                               pool=self.run.pool)
        drafts = config.decoder.needs_draft
        eager_tps, eager_tokens = _tokens_per_s(self.target, self.draft if drafts else None,
                                                prompts, config)
        graph_tps, graph_tokens = _tokens_per_s(
            self.graph_target, self.graph_draft if drafts else None, prompts, config)
        partings = [(i, graphs_parting(self.target, self.graph_target, prompt, want, got))
                    for i, (prompt, want, got) in enumerate(zip(prompts, eager_tokens,
                                                                graph_tokens, strict=True))
                    if want != got]
        return {"eager": eager_tps, "graphs": graph_tps, "partings": partings}

    def overlap(self) -> str:
        """rerank and fts on graphs, the root pass replayed on a stream of its own beside the
        draft's passes against one after the other, on one GPU (`measure_overlap`): whether
        it now pays on one card, where two Python threads taking turns made it cost."""
        from targetrows.bench.overlap import measure_overlap, overlap_markdown

        run = self.run
        prompts = [p.ids for p in _prompts(self.target.vocab_size, 1, run.prompt_len)]
        config = DecodeConfig(budget=run.budget, pool=run.pool, max_new_tokens=run.new_tokens)
        self.rep["overlap"] = rows = measure_overlap(self.graph_target, self.graph_draft,
                                                     prompts, config, ("rerank", "fts"))
        return overlap_markdown(rows, "Root pass beside drafting with graphs, one GPU").replace(
            "## ", "### ", 1)

    def bench(self) -> tuple:
        """`targetrows bench` on graphs, as the bench stage runs it eagerly: every decoder on
        the pair, with the part times and the bound taken on the padded passes (the cost
        model's inputs from the path that runs). Returns what the GPU check's bench section
        takes."""
        return self._bench(self.graph_target, self.graph_draft)

    def head_bench(self) -> tuple:
        """The bench on graphs with the head (`graph_head`) drafting: the paper's setting."""
        _, target, head = self.graph_head()
        return self._bench(target, head)

    def _bench(self, target, draft) -> tuple:
        from targetrows.bench import run as bench
        from targetrows.bench.plan import BenchSettings

        run = self.run
        settings = BenchSettings(
            decode=DecodeConfig(max_new_tokens=run.new_tokens, pool=run.pool),
            temperatures=(0.0,), budget=run.budget, repeats=self.bench_repeats, hf=False)
        prompts = _prompts(self.target.vocab_size, run.prompts, run.prompt_len)
        rows, context = bench.run_bench(target, draft, prompts, settings)
        return rows, context, settings, (target, draft), 0.0

    def same_tokens(self) -> bool:
        """Whether every decoder run so far gave eager's tokens on graphs in float32 (the
        identity part), and the same tokens with the root pass beside drafting as after it.
        The bfloat16 partings of the speed part are reported, not judged here."""
        return (all(r["same"] for r in self.rep.get("identity", []))
                and all(r["same_tokens"] for r in self.rep.get("overlap", [])))


# the stage's parts after its setup, in the order they run (each one's budget: `need_s`)
PARTS = ("passes", "kernels", "identity", "head", "speed", "overlap", "bench", "head_bench")


def _hf_tokens_per_s(target: HFModel, prompts, max_new_tokens: int) -> float:
    """Hugging Face's greedy `generate()` on the target alone, the prompts one at a time (the
    baseline of the issue's `ar` goal)."""
    from targetrows.bench.baselines import hf_generate

    def run(ids):
        return hf_generate(target.model, ids, 0.0, max_new_tokens, (), 0, target.vocab_size)

    run(prompts[0])  # warm-up
    _sync(str(target.device))
    start = time.perf_counter()
    made = sum(len(run(p)) for p in prompts)
    _sync(str(target.device))
    return made / (time.perf_counter() - start)


# -- tokens: float32 identity, bfloat16 partings ------------------------------------------------


def tiny_models(device: str) -> tuple:
    """The identity part's float32 models: a tiny 6-layer Llama target (a head reads 3 of its
    layers), a noisy copy of it as the standalone draft (it accepts: caches get compacted),
    and a random head's folder."""
    from tiny_heads import save_tiny_head
    from tiny_models import tiny_model

    target_hf = tiny_model("llama", seed=0, n_layers=6, dtype=torch.float32).to(device)
    draft_hf = noisy_copy(target_hf, 0.01, seed=2)
    folder = save_tiny_head(tempfile.mkdtemp() + "/head", target_hf.config,
                            draft_vocab_size=150)
    return target_hf, draft_hf, folder


def identity_pairs(tiny, shape: PassShape) -> dict:
    """{draft kind: ((target, draft) eager, (target, draft) at `shape`)} over the tiny models,
    with the standalone draft and with the head (its steps at `shape` too)."""
    target_hf, draft_hf, folder = tiny
    pairs = {}
    for kind in ("standalone", "eagle3"):
        models = []
        for padded in (False, True):
            target = HFModel(target_hf, name="t")
            if padded:
                target.set_pass_shape(shape)
            draft = (load_eagle3(folder, target) if kind == "eagle3"
                     else HFModel(draft_hf, name="d"))
            if padded:
                draft.set_pass_shape(shape)
            models.append((target, draft))
        pairs[kind] = models
    return pairs


def identity_rows(tiny, shape: PassShape, run: Decoding) -> list[dict]:
    """Every decoder on the tiny float32 models, eager and at `shape` (graphs on a GPU), with
    the standalone draft and with the head (drafted decoders): a row each, saying whether the
    tokens were equal (and where not, where they parted and how close the target's two
    logits were there), the rounds and the host syncs per round on graphs."""
    rows = []
    for kind, (eager, graphs) in identity_pairs(tiny, shape).items():
        for name in decoder_names():
            config = decode_config(name, budget=run.budget, max_new_tokens=run.new_tokens,
                                   pool=run.pool)
            if kind == "eagle3" and not config.decoder.needs_draft:
                continue
            rows.append(identity_row(kind, eager, graphs, config))
    return rows


def identity_row(kind: str, eager, graphs, config) -> dict:
    """One decoder's row (`identity_rows`); a decoder that fails is a row saying how, and the
    others still run."""
    row = {"draft": kind, "decoder": config.decoder.name, "same": False, "rounds": 0,
           "syncs": None}
    drafts = config.decoder.needs_draft
    try:
        want = [generate(eager[0], eager[1] if drafts else None, p, config).tokens
                for p in IDENTITY_PROMPTS]
        got = [generate(graphs[0], graphs[1] if drafts else None, p, config).tokens
               for p in IDENTITY_PROMPTS]
        with counting_syncs() as count:
            result = generate(graphs[0], graphs[1] if drafts else None, IDENTITY_PROMPTS[0],
                              config)
        row.update(same=got == want, rounds=len(result.rounds),
                   syncs=count.per(len(result.rounds)) if count.counted else None)
        row["partings"] = [(i, explain_parting(eager[0], p, w, g)) for i, (p, w, g) in
                           enumerate(zip(IDENTITY_PROMPTS, want, got, strict=True)) if w != g]
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {err}"[:300]
        row["trace"] = traceback.format_exc()[-3000:]
    return row


def identity_markdown(rows: list[dict]) -> str:
    lines = ["### Tokens with graphs", "",
             "Every decoder on tiny float32 models, padded passes on graphs against eager "
             "passes: equal, or the check fails (where not, the first parting: the gap "
             "between the target's logits of the two tokens there against what rounding "
             "between pass shapes moves them, in rounding steps):", "",
             "| draft | decoder | same tokens | rounds | syncs per round |",
             "|---|---|---|---|---|"]
    for r in rows:
        syncs = "-" if r["syncs"] is None else f"{r['syncs']:.1f}"
        same = (f"failed: {r['error']}" if "error" in r
                else "True" if r["same"] else f"False: {partings_text(r['partings'])}")
        lines.append(f"| {r['draft']} | {r['decoder']} | {same.replace('|', '/')} | "
                     f"{r['rounds']} | {syncs} |")
    failed = [r for r in rows if "error" in r]
    if failed:
        lines += ["", f"The first failure ({failed[0]['draft']}, {failed[0]['decoder']}):",
                  "", "```", failed[0]["trace"].rstrip(), "```"]
    return "\n".join(lines)


def graphs_parting(eager: HFModel, graphs: HFModel, prompt, reference, tokens):
    """Where the graphs run's `tokens` part from the eager run's `reference`, explained as the
    bench explains a parting from HF greedy (`drift.explain_parting`, on the eager target),
    with the row's spread between the padded passes' shapes counted too (`row_spread` on the
    graphs twin): a near-tie, or not."""
    p = explain_parting(eager, prompt, reference, tokens)
    if p.gap is None:  # a run that stopped early
        return p
    context = list(prompt) + list(reference[: p.position])
    return replace(p, threshold_steps=max(p.threshold_steps,
                                          near_tie_steps([row_spread(graphs, context)])))


def partings_text(partings) -> str:
    """(prompt index, `Parting`)s as the bench's report words them."""
    def one(i, p) -> str:
        if p.gap_steps is None:
            return f"prompt {i}, new token {p.position}: a run that stopped early"
        verdict = "a near-tie" if p.near_tie else "NOT a near-tie"
        return (f"prompt {i}, new token {p.position}: gap {p.gap_steps:.1f} steps, near-tie "
                f"up to {p.threshold_steps:.1f}: {verdict}")

    return "; ".join(one(i, p) for i, p in partings)


def speed_markdown(rep: dict) -> str:
    bound, speed = rep["bound_s"], rep["speed"]
    lines = ["### Tokens/s", "",
             f"Tokens with graphs against eager on these {rep['dtype']} models: where they part, "
             "the gap between the target's logits of the two tokens there against what rounding "
             "between pass shapes (padded ones too) moves them, in rounding steps (a parting "
             "at a near-tie is rounding, not a fault; the identity part judges in float32).",
             "", "| decoder | eager tokens/s | graphs tokens/s | graphs / bound | tokens with "
             "graphs |", "|---|---|---|---|---|"]
    for name, s in speed.items():
        same = partings_text(s["partings"]) if s["partings"] else "same as eager"
        lines.append(f"| {name} | {s['eager']:.1f} | {s['graphs']:.1f} | "
                     f"{s['graphs'] * bound:.2f} | {same} |")
    lines += ["", f"HF `generate()` on the target alone: {rep['hf_tps']:.1f} tokens/s."]
    return "\n".join(lines)


# -- goals ---------------------------------------------------------------------------------------


def goals_markdown(stage: GraphsStage | None) -> str:
    """The capture's cost, and the issue's goals against what the parts measured (nothing,
    where the stage did not set up): written from whatever ran, however the stage ended."""
    lines = ["### Goals", ""]
    if stage is None:
        rep = {}
        lines.append("No graphs captured: the stage's setup did not run.")
    else:
        rep = stage.rep
        count, seconds = stage.captured()
        stats = [s for m in stage.graph_models().values() for s in graph_stats(m)]
        rep["capture"] = c = {"captured": count, "capture_s": seconds,
                              "graph_gb": sum(s.graph_bytes for s in stats) / 2**30,
                              "stage_s": time.perf_counter() - stage.start}
        lines.append(f"Graphs captured on the 8B-shaped models (target, draft, head): "
                     f"{c['captured']} in {c['capture_s']:.1f} s, {c['graph_gb']:.2f} GiB; "
                     f"parts {c['stage_s']:.0f} s.")
    lines += ["", "| goal (graphs on a GPU) | measured | met |", "|---|---|---|"]
    lines += [f"| {goal} | {got} | {'-' if met is None else ('yes' if met else 'no')} |"
              for goal, got, met in goals(rep)]
    return "\n".join(lines)


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

    def same():
        ok = all(r["same"] for r in rep["identity"])
        return f"{ok}{_speed_partings(rep)}", ok

    table = [  # goal, what it needs measured, its measure
        ("target's 1-token pass <= 2x its weight-streaming time", ["target_passes"], one_token),
        ("a 64-node pass <= 1.3x the 1-token pass", ["target_passes"], wide),
        ("head step < 1 ms", ["head_step"], lambda: under("head_step", 1e-3)),
        ("0.6B draft pass < 2 ms", ["draft_pass"], lambda: under("draft_pass", 2e-3)),
        ("ar >= 4x HF generate", ["hf_tps"], ar),
        ("<= 3 host syncs a round, every decoder", ["identity"], syncs),
        ("tokens with graphs = eager in float32, every decoder", ["identity"], same)]
    return [_goal(goal, measure) if all(k in rep for k in needs)
            else (goal, "not measured (the part did not finish)", None)
            for goal, needs, measure in table]


def _goal(goal: str, measure) -> tuple[str, str, bool | None]:
    """A goal's row; one whose measure fails says so (the goals are written however the stage
    ended, from whatever it left)."""
    try:
        return (goal, *measure())
    except Exception as err:
        return goal, f"not measured ({type(err).__name__}: {err})".replace("|", "/"), None


def _speed_partings(rep: dict) -> str:
    """What the speed part's runs (bfloat16 on a GPU) add to the identity goal: their
    partings, and how many rounding explains."""
    if "speed" not in rep:
        return ""
    partings = [p for s in rep["speed"].values() for _, p in s["partings"]]
    where = f"; {rep['dtype']} (speed part)"
    if not partings:
        return f"{where}: the same tokens"
    ties = sum(p.near_tie for p in partings)
    return f"{where}: {len(partings)} parting(s), {ties} at a near-tie, {len(partings) - ties} beyond"


def _widths(curves: dict) -> str:
    return " / ".join(str(n) for n in curves["eager"].sizes)


def _ms(curve) -> str:
    return " / ".join(f"{t * 1e3:.2f}" for t in curve.seconds)
