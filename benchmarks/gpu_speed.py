"""The GPU check's speed stages (`benchmarks/gpu_check.py`), on random weights at the paper's
model shapes (no download): acceptance means nothing with random weights, part times do.

- `pass_costs`: one target pass over 1-128 tree nodes on a cached context, for the Llama-3.1-8B,
  Qwen3-8B and Qwen2.5-32B shapes in bfloat16 (`targetrows.cost.parttimes.time_passes`), and
  how far one row moves between pass shapes there (`targetrows.bench.drift.row_spread`).
- `syncs`: host syncs per round of every decoder, and the lines that cause them
  (`targetrows.bench.syncs`), with a standalone draft and with an EAGLE-3 head; and at the
  paper's budget, the host's work after each read, which the GPU idles through
  (`host_reads.gap_ms`).
- `bench`: `targetrows bench`'s table for the Qwen3-8B shape with a Qwen3-0.6B-shaped draft.
- `overlap`: the root pass alongside drafting (on a stream of its own) on one GPU, against one after the
  other: the round's drafting time against root pass + draft work.
- `eagle3_bench`: the Qwen3-8B shape with a random head of a real Qwen3-8B head's shape.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import torch
from rerankers import decode_config

from targetrows.bench import run as bench
from targetrows.bench.drift import row_spread
from targetrows.bench.plan import BenchPrompt, BenchSettings
from targetrows.bench.syncs import counting_syncs
from targetrows.core.pool import PoolShape
from targetrows.cost.parttimes import time_passes
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names
from targetrows.hf.model import HFModel

DECODERS = decoder_names()

QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False)
QWEN3_0_6B = dict(QWEN3_8B, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, tie_word_embeddings=True)
LLAMA31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                  vocab_size=128256, max_position_embeddings=131072, rope_theta=500_000.0,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
QWEN25_32B = dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                  num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                  max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=False)
SHAPES = {"qwen3-8b": ("qwen3", QWEN3_8B), "llama-3.1-8b": ("llama", LLAMA31_8B),
          "qwen2.5-32b": ("qwen2", QWEN25_32B)}
SMOKE_SIZE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512,
                  max_position_embeddings=1024)
QWEN3_8B_HEAD = dict(hidden=4096, n_heads=32, n_kv=8, head_dim=128, intermediate=12288,
                     draft_vocab_size=32000)


def random_model(arch: str, size: dict, device: str, dtype: torch.dtype, seed: int):
    """A causal LM of `arch` with random weights, built from a config straight on `device`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    config_cls = {"qwen3": Qwen3Config, "llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = config_cls(**size, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def shape(name: str, smoke: bool, layers: int = 2) -> tuple[str, dict]:
    arch, size = SHAPES[name]
    return arch, (dict(size, **SMOKE_SIZE, num_hidden_layers=layers) if smoke else size)


def _free() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- pass costs --------------------------------------------------------------------------------


def pass_costs(device: str, smoke: bool, keep: dict, names=tuple(SHAPES),
               contexts=(512, 2048)) -> dict:
    """{model: {context: PassCurve}, spreads: [...], build_s: {...}}; the Qwen3-8B target is
    kept in `keep['target']` for the later stages."""
    dtype = torch.float32 if smoke else torch.bfloat16
    sizes = (1, 2, 4, 8) if smoke else (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
    rng = np.random.default_rng(0)
    out = {"curves": {}, "spreads": {}, "build_s": {}, "memory_gb": {}}
    for name in names:
        t = time.perf_counter()
        arch, size = shape(name, smoke, layers=6)  # 6: a head reads layers 2, L//2, L-3
        model = HFModel(random_model(arch, size, device, dtype, 0), name=name)
        out["build_s"][name] = time.perf_counter() - t
        if device.startswith("cuda"):
            out["memory_gb"][name] = torch.cuda.memory_allocated() / 2**30
        ctx_lens = contexts[:1] if smoke or name != "qwen3-8b" else contexts
        for n_ctx in ctx_lens:
            ctx = rng.integers(model.vocab_size, size=64 if smoke else n_ctx).tolist()
            out["curves"][name, n_ctx] = time_passes(model, ctx, sizes, repeats=2 if smoke else 5)
        ctx = rng.integers(model.vocab_size, size=48).tolist()
        out["spreads"][name] = [row_spread(model, ctx[: 16 + 16 * i], (2, 8, 32, 64), seed=i)
                                for i in range(2)]
        if name == "qwen3-8b":
            keep["target"] = model
        del model
        _free()
    return out


def pass_costs_markdown(rep: dict) -> str:
    lines = ["## One target pass against tree size (bfloat16, random weights)", "",
             "Median ms of one verify pass feeding n tree nodes on a cached context "
             "(`time_passes`: each size once per repeat, interleaved; 5 repeats), and the "
             "ratio to a 1-token pass.", ""]
    curves = rep["curves"]
    sizes = next(iter(curves.values())).sizes
    lines.append("| model | context | " + " | ".join(f"n={n}" for n in sizes) + " |")
    lines.append("|---|---|" + "---|" * len(sizes))
    for (name, n_ctx), c in curves.items():
        one = c.seconds[0]
        cells = [f"{s * 1e3:.1f} ({s / one:.2f}x)" for s in c.seconds]
        lines.append(f"| {name} | {n_ctx} | " + " | ".join(cells) + " |")
    lines += ["", "Built in (s): " + ", ".join(f"{k} {v:.0f}" for k, v in rep["build_s"].items())
              + ("; GPU memory allocated (GiB): " + ", ".join(
                  f"{k} {v:.1f}" for k, v in rep["memory_gb"].items()) if rep["memory_gb"]
                 else ""), "",
              "Row spread between pass shapes: the largest logit difference from ar's one-token "
              "step, in rounding steps of the dtype at the best logit's size:", "",
              "| model | context | prefill | tree 2 | tree 8 | tree 32 | tree 64 | same argmax |",
              "|---|---|---|---|---|---|---|---|"]
    for name, spreads in rep["spreads"].items():
        for i, s in enumerate(spreads):
            cells = " | ".join(f"{s.steps[k]:.1f}" for k in
                               ("prefill", "tree 2", "tree 8", "tree 32", "tree 64"))
            lines.append(f"| {name} | {16 + 16 * i} | {cells} | {s.same_argmax} |")
    return "\n".join(lines)


# -- host syncs --------------------------------------------------------------------------------


def syncs(device: str, smoke: bool) -> dict:
    """Host syncs per round of every decoder on tiny float32 models: a standalone draft and a
    random EAGLE-3 head (sync counts do not depend on model size); and the host ms a round
    after reads, before and after the verify pass, at budget 59 and a 10 x 6 pool."""
    from host_reads import gap_ms
    from tiny_heads import save_tiny_head
    from tiny_models import tiny_model

    from targetrows.hf.loading import load_eagle3

    n_new = 8 if smoke else 24
    target_hf = tiny_model("llama", seed=0, n_layers=6).to(device)
    target = HFModel(target_hf, name="tiny")
    drafts = {"standalone": HFModel(tiny_model("llama", seed=1, n_layers=1).to(device), name="d")}
    folder = tempfile.mkdtemp()
    drafts["eagle3"] = load_eagle3(save_tiny_head(os.path.join(folder, "head"), target_hf.config,
                                                  draft_vocab_size=100), target)
    rows, sites = [], {}
    for kind, draft in drafts.items():
        for decoder in DECODERS:
            if kind == "eagle3" and decoder == "ar":
                continue
            cfg = decode_config(decoder, budget=8, max_new_tokens=n_new, pool=PoolShape(4, 4))
            used = draft if decoder != "ar" else None
            generate(target, used, [5, 17, 42], cfg)  # warm-up
            with counting_syncs() as count:
                result = generate(target, used, [5, 17, 42], cfg)
            paper = decode_config(decoder, budget=59, max_new_tokens=n_new, pool=PoolShape())
            before, after = gap_ms(target, used, [5, 17, 42], paper, repeat=1 if smoke else 3,
                                   stand_in=False)
            rows.append({"draft": kind, "decoder": decoder, "rounds": len(result.rounds),
                         "syncs": count.total, "per_round": count.per(len(result.rounds)),
                         "counted": count.counted, "host_ms_before": before,
                         "host_ms_after": after})
            for site, n in count.sites.items():
                sites[site] = sites.get(site, 0) + n
    return {"rows": rows, "sites": sorted(sites.items(), key=lambda kv: -kv[1])}


def syncs_markdown(rep: dict) -> str:
    if not all(r["counted"] for r in rep["rows"]):
        return "## Host syncs per round\n\nnot counted: no CUDA device"
    lines = ["## Host syncs per round (tiny float32 models, B=8, pool 4 x 4)", "",
             "Host ms: at B=59, pool 10 x 6, best of 3 decodes, the host's work after each read "
             "(the GPU idles), before the verify pass and after it (`benchmarks/host_reads.py`).",
             "", "| draft | decoder | rounds | syncs | per round | host ms before verify | "
             "host ms after verify |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['draft']} | {r['decoder']} | {r['rounds']} | {r['syncs']} | "
              f"{r['per_round']:.1f} | {r['host_ms_before']:.2f} | {r['host_ms_after']:.2f} |"
              for r in rep["rows"]]
    lines += ["", "Where they come from (all runs above; innermost line of targetrows):", "",
              "| syncs | line |", "|---|---|"]
    lines += [f"| {n} | `{site}` |" for site, n in rep["sites"][:25]]
    return "\n".join(lines)


# -- decoding speed ----------------------------------------------------------------------------


def _prompts(vocab: int, n: int, length: int):
    rng = np.random.default_rng(0)
    return [BenchPrompt(f"random-{i}", "random",
                        tuple(int(t) for t in rng.integers(vocab, size=length)))
            for i in range(n)]


def pair_models(keep: dict, device: str, smoke: bool, draft: bool = True):
    """(target, draft): the Qwen3-8B-shaped target and the Qwen3-0.6B-shaped draft kept in
    `keep` by an earlier stage, or built now (random weights; the draft only if `draft`)."""
    dtype = torch.float32 if smoke else torch.bfloat16
    if "target" not in keep:
        arch, size = shape("qwen3-8b", smoke, layers=6)
        keep["target"] = HFModel(random_model(arch, size, device, dtype, 0), name="qwen3-8b")
    if draft and "draft" not in keep:
        arch, size = shape("qwen3-8b", smoke, layers=1)
        size = dict(size, **({} if smoke else {k: QWEN3_0_6B[k] for k in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "tie_word_embeddings")}))
        keep["draft"] = HFModel(random_model(arch, size, device, dtype, 1), name="qwen3-0.6b")
    return keep["target"], keep.get("draft")


def random_head_folder(target: HFModel, smoke: bool) -> str:
    """A checkpoint folder of a random EAGLE-3 head of a Qwen3-8B head's shape (tiny with
    `smoke`) for `target`, made without touching the random state of anything else."""
    from tiny_heads import save_tiny_head

    sizes = dict(hidden=None, n_heads=4, n_kv=2, head_dim=16, intermediate=128,
                 draft_vocab_size=256) if smoke else QWEN3_8B_HEAD
    with torch.random.fork_rng(devices=[]):
        return save_tiny_head(os.path.join(tempfile.mkdtemp(), "qwen3-8b-head"),
                              target.model.config, scale=0.02, **sizes)


def bench_pair(args, device: str, keep: dict, head: bool = False):
    """`run_bench` on the Qwen3-8B-shaped target (from `keep`, or built) with a Qwen3-0.6B-shaped
    draft, or with a random head of a Qwen3-8B head's shape (`head`)."""
    from targetrows.hf.loading import load_eagle3

    smoke = args.smoke
    t = time.perf_counter()
    target = pair_models(keep, device, smoke, draft=not head)[0]
    if head:
        draft = keep["head"] = load_eagle3(random_head_folder(target, smoke), target)
    else:
        draft = keep["draft"]
    build_s = time.perf_counter() - t
    settings = BenchSettings(
        decode=DecodeConfig(max_new_tokens=8 if smoke else args.max_new_tokens,
                            pool=PoolShape(4, 3) if smoke else PoolShape()),
        temperatures=(0.0,), budget=int(args.budget), repeats=2 if smoke else 3, hf=not head)
    prompts = _prompts(target.vocab_size, 1 if smoke else args.prompts,
                       16 if smoke else args.prompt_len)
    rows, context = bench.run_bench(target, draft, prompts, settings)
    return rows, context, settings, (target, draft), build_s


def overlap(args, device: str, keep: dict, draft: str = "draft") -> tuple[list[dict], str]:
    """rerank and fts on the Qwen3-8B-shaped target with `keep[draft]` (the 0.6B-shaped draft,
    or the head), the root pass alongside drafting or after it, on one GPU
    (`targetrows.bench.overlap`): its rows and their title."""
    from targetrows.bench.overlap import measure_overlap

    target, drafter = keep["target"], keep[draft]
    prompts = [p.ids for p in _prompts(target.vocab_size, 1, 16 if args.smoke else args.prompt_len)]
    config = DecodeConfig(budget=int(args.budget), max_new_tokens=8 if args.smoke else 32,
                          pool=PoolShape(4, 3) if args.smoke else PoolShape())
    rows = measure_overlap(target, drafter, prompts, config, ("rerank", "fts"))
    label = "a random EAGLE-3 head" if draft == "head" else "a Qwen3-0.6B-shaped draft"
    return rows, f"Root pass alongside drafting on one GPU, {label}"


def batched(args, device: str, keep: dict) -> dict[int, list[dict]]:
    """`targetrows bench --batch-size N` on the Qwen3-8B / 0.6B pair at several N: throughput
    of ar, draft_rank and fts against Hugging Face's batched generate, and whether each prompt's
    tokens are ar's (`targetrows.bench.batched`)."""
    from targetrows.bench.batched import run_batched_bench

    target, draft = keep["target"], keep["draft"]
    smoke = args.smoke
    settings = BenchSettings(
        decode=DecodeConfig(max_new_tokens=8 if smoke else 32,
                            pool=PoolShape(4, 3) if smoke else PoolShape()),
        decoders=("ar", "draft_rank", "fts"), temperatures=(0.0,), budget=int(args.budget))
    sizes = (1, 3) if smoke else (1, 4, 16)
    prompts = _prompts(target.vocab_size, max(sizes), 16 if smoke else args.prompt_len)
    return {n: run_batched_bench(target, draft, prompts, settings.at_batch_size(n))
            for n in sizes}


def batched_markdown(rows: dict[int, list[dict]]) -> str:
    lines = ["## Batched decoding (Qwen3-8B shape, 0.6B-shaped draft, T=0)", "",
             "Total tokens/s over the prompts decoded N at a time; x HF: over Hugging Face's "
             "batched generate at N; same as ar: share of prompts whose tokens equal ar's at N; "
             "per pass: sequences per batched pass.", "",
             "| N | method | budget | tokens/s | x HF | latency median (s) | same as ar | "
             "per pass |", "|---|---|---|---|---|---|---|---|"]
    for n, group in rows.items():
        for r in group:
            same = r.get("same_as_ar")
            per = r.get("sequences_per_pass")
            lines.append(f"| {n} | {r['method']} | {r['budget']} | {r['tokens_per_s']:.1f} | "
                         f"{r['x_hf_generate']:.2f} | {r['latency_median_s']:.2f} | "
                         f"{'' if same is None else f'{same:.2f}'} | "
                         f"{'' if per is None else f'{per:.1f}'} |")
    return "\n".join(lines)
