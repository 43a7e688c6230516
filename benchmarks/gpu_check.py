"""One prepared run for a GPU machine, under 10 minutes: is every decoder exact on CUDA, and how
fast is each one against Hugging Face generation at real size?

    python benchmarks/gpu_check.py                 # on a machine with a CUDA GPU
    python benchmarks/gpu_check.py --smoke         # the same stages, tiny and on CPU (seconds)

Stages (each one's failure is recorded and the next one still runs; the report is rewritten
after every stage, so a run cut short keeps what it measured):
1. identity: tiny random-weight Llama, Qwen2 and Qwen3 models in float64 on CUDA; every decoder
   at budgets 1, 8 and 59 must reproduce the target's `generate(do_sample=False)` token for
   token, with a random draft (trees mostly rejected) and a noisy copy of the target (long
   accepted paths, so the caches get compacted).
2. timing: random-weight models built from the Qwen3-8B (target) and Qwen3-0.6B (draft)
   configs in bfloat16 (no download), random prompts; `targetrows bench`'s table: HF generate,
   HF assisted generation and every registered decoder, part times and the cost-model bound. Acceptance
   means nothing with random weights; the part times do. Temperature 1 runs too when the time
   limit leaves room.
3. eagle3: every decoder with random EAGLE-3 heads (both checkpoint layouts, float64) on tiny
   Llama/Qwen2/Qwen3 targets reproduces `generate`; then the Qwen3-8B-config target with a
   random head of a real Qwen3-8B head's shape (hidden 4096, 32 x 128 heads, 32K draft
   vocabulary) in bfloat16: our decoders' speed and part times (HF assisted generation takes no
   heads, so ar is the baseline).
Results: benchmarks/results/gpu_<date>.md and .csv (written atomically).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # tiny_models, tiny_heads: the test fixtures

from rerankers import decode_config

from targetrows.bench import report as bench_report
from targetrows.bench import run as bench
from targetrows.core.atomic import atomic_write_text
from targetrows.core.pool import PoolShape
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names
from targetrows.hf.model import HFModel

DECODERS = decoder_names()

QWEN3_8B = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
QWEN3_0_6B = dict(
    QWEN3_8B,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    tie_word_embeddings=True,
)
SMOKE_SIZE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=1024,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    p.add_argument("--time-limit", type=float, default=540.0, help="seconds for all stages")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--budget", default="59", help="budget of the timing stage (or auto)")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=None, help="file stem (default gpu_<date>)")
    return p.parse_args(argv)


# -- stage 1: greedy identity ------------------------------------------------------------------


def noisy_copy(model, scale: float, seed: int):
    import copy

    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_((torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale).to(p.device))
    return out


def identity_stage(device: str, smoke: bool) -> dict:
    """{arch: [mismatch descriptions]} plus counts: every decoder against HF greedy generate."""
    from tiny_models import ARCHS, tiny_model

    archs = ARCHS[:1] if smoke else ARCHS
    prompts = [[5, 17, 42], [200, 3], [7] * 9][: 1 if smoke else 3]
    n_new = 12 if smoke else 48
    # (draft kind, prompts, budgets, top_k, depth)
    runs = [
        ("random", prompts, (8,) if smoke else (1, 8, 59), 8, 3),
        ("noisy", prompts[:2], (8,) if smoke else (8, 59), 4, 5),
    ]
    report = {"runs": 0, "mismatches": [], "accepted_noisy": []}
    for arch in archs:
        target_hf = tiny_model(arch, seed=0, n_layers=2, dtype=torch.float64).to(device)
        drafts = {
            "random": tiny_model(arch, seed=1, n_layers=1, dtype=torch.float64).to(device),
            "noisy": noisy_copy(target_hf, 0.01, seed=2),
        }
        target = HFModel(target_hf, name=f"{arch}-target")
        for kind, ps, budgets, top_k, depth in runs:
            draft = HFModel(drafts[kind], name=f"{arch}-{kind}-draft")
            for prompt in ps:
                ids = torch.tensor([prompt], device=device)
                ref = target_hf.generate(
                    ids,
                    max_new_tokens=n_new,
                    min_new_tokens=n_new,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
                reference = ref[0, len(prompt) :].tolist()
                for decoder, budget in itertools.product(DECODERS, budgets):
                    if decoder == "ar" and budget != budgets[0]:
                        continue
                    cfg = decode_config(decoder, budget=budget, max_new_tokens=n_new,
                                        pool=PoolShape(top_k=top_k, depth=depth))
                    result = generate(target, draft if decoder != "ar" else None, prompt, cfg)
                    report["runs"] += 1
                    if result.tokens != reference:
                        ours, ref = np.array(result.tokens + [-1]), np.array(reference + [-2])
                        n = min(len(ours), len(ref))
                        first = int(np.flatnonzero(ours[:n] != ref[:n])[0])
                        report["mismatches"].append(
                            f"{arch} {kind} {decoder} B={budget} prompt {prompt}: "
                            f"first differs at {first}"
                        )
                    if kind == "noisy" and decoder != "ar":
                        report["accepted_noisy"].append(
                            np.mean([r.accepted for r in result.rounds])
                        )
    return report


def identity_markdown(rep: dict) -> str:
    ok = not rep["mismatches"]
    lines = [
        "## Greedy identity on the device (tiny random models, float64)",
        "",
        f"- decoder runs: {rep['runs']}, mismatches with HF greedy generate: "
        f"{len(rep['mismatches'])} -> {'PASS' if ok else 'FAIL'}",
    ]
    if rep["accepted_noisy"]:
        lines.append(
            f"- noisy draft: mean accepted draft tokens per round "
            f"{np.mean(rep['accepted_noisy']):.2f} (trees matter)"
        )
    lines += [f"  - {m}" for m in rep["mismatches"][:20]]
    return "\n".join(lines)


# -- stage 2: timing at real size --------------------------------------------------------------


def random_model(size: dict, device: str, dtype: torch.dtype, seed: int):
    """A Qwen3 causal LM with random weights, built from a config straight on `device`."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**size, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def timing_stage(args, device: str, temperatures, state: dict):
    smoke = args.smoke
    dtype = torch.float32 if smoke else torch.bfloat16
    if "pair" not in state:
        t = time.perf_counter()
        tsize = dict(QWEN3_8B, **SMOKE_SIZE, num_hidden_layers=2) if smoke else QWEN3_8B
        dsize = dict(QWEN3_0_6B, **SMOKE_SIZE, num_hidden_layers=1) if smoke else QWEN3_0_6B
        target = HFModel(random_model(tsize, device, dtype, 0), name="qwen3-8b-config-random")
        draft = HFModel(random_model(dsize, device, dtype, 1), name="qwen3-0.6b-config-random")
        state["pair"] = (target, draft)
        state["build_s"] = time.perf_counter() - t
    target, draft = state["pair"]
    rng = np.random.default_rng(0)
    n_prompts = 1 if smoke else args.prompts
    prompt_len = 16 if smoke else args.prompt_len
    prompts = [
        bench.BenchPrompt(
            f"random-{i}",
            "random",
            tuple(int(t) for t in rng.integers(target.vocab_size, size=prompt_len)),
        )
        for i in range(n_prompts)
    ]
    budget = "auto" if args.budget == "auto" else int(args.budget)
    settings = bench.BenchSettings(
        decode=DecodeConfig(max_new_tokens=8 if smoke else args.max_new_tokens,
                            pool=PoolShape(4, 3) if smoke else PoolShape()),
        temperatures=tuple(temperatures),
        budget=budget,
        repeats=2 if smoke else 3,
    )
    rows, context = bench.run_bench(target, draft, prompts, settings)
    return rows, context, settings, (target, draft)


# -- stage 3: EAGLE-3 heads -----------------------------------------------------------------------


def eagle3_identity(device: str, smoke: bool, folder: str) -> dict:
    """Tiny float64 targets with random heads, every decoder against HF greedy generation."""
    from tiny_heads import save_tiny_head
    from tiny_models import tiny_model

    from targetrows.hf.eagle3_checkpoint import load_eagle3

    mismatches, checked = [], 0
    cases = [("llama", "eagle", 100)] if smoke else [
        ("llama", "eagle", 100), ("qwen2", "speculators", 272), ("qwen3", "eagle", 60)]
    for arch, layout, vocab in cases:
        target_hf = tiny_model(arch, seed=0, n_layers=6, dtype=torch.float64).to(device)
        head = save_tiny_head(os.path.join(folder, f"{arch}-{layout}"), target_hf.config,
                              layout=layout, draft_vocab_size=vocab)
        target = HFModel(target_hf, name=arch)
        draft = load_eagle3(head, target)
        for prompt in [[5, 17, 42], [200, 3, 9]][: 1 if smoke else 2]:
            ref = target_hf.generate(torch.tensor([prompt], device=device), max_new_tokens=24,
                                     min_new_tokens=24, do_sample=False, eos_token_id=None,
                                     pad_token_id=0)[0, len(prompt):].tolist()
            for decoder, budget in itertools.product(DECODERS, (1, 8) if smoke else (1, 8, 59)):
                cfg = decode_config(decoder, budget=budget, max_new_tokens=24,
                                   pool=PoolShape(top_k=4, depth=4))
                out = generate(target, draft if decoder != "ar" else None, prompt, cfg).tokens
                checked += 1
                if out != ref:
                    mismatches.append(f"{arch}/{layout} {decoder} B={budget} {prompt}")
    return {"checked": checked, "mismatches": mismatches}


QWEN3_8B_HEAD = dict(hidden=4096, n_heads=32, n_kv=8, head_dim=128, intermediate=12288,
                     draft_vocab_size=32000)


def eagle3_timing(args, device: str, state: dict, folder: str):
    """The Qwen3-8B-config target (built by the timing stage, or here) with a random head."""
    from tiny_heads import save_tiny_head

    from targetrows.hf.eagle3_checkpoint import load_eagle3

    smoke = args.smoke
    dtype = torch.float32 if smoke else torch.bfloat16
    if "pair" in state and not smoke:
        target = state["pair"][0]
    else:  # smoke: the tiny timing target has 2 layers; a head reads layers 2, L//2, L-3
        size = dict(QWEN3_8B, **SMOKE_SIZE, num_hidden_layers=6) if smoke else QWEN3_8B
        target = HFModel(random_model(size, device, dtype, 0), name="qwen3-8b-config-random")
    sizes = dict(hidden=None, n_heads=4, n_kv=2, head_dim=16, intermediate=128,
                 draft_vocab_size=256) if smoke else QWEN3_8B_HEAD
    t = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        head = save_tiny_head(os.path.join(folder, "qwen3-8b-head"), target.model.config,
                              scale=0.02, **sizes)
    draft = load_eagle3(head, target)
    build_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    prompts = [bench.BenchPrompt(f"random-{i}", "random", tuple(
        int(x) for x in rng.integers(target.vocab_size, size=16 if smoke else args.prompt_len)))
        for i in range(1 if smoke else args.prompts)]
    settings = bench.BenchSettings(
        decode=DecodeConfig(max_new_tokens=8 if smoke else args.max_new_tokens,
                            pool=PoolShape(4, 3) if smoke else PoolShape()),
        temperatures=(0.0,), budget="auto" if args.budget == "auto" else int(args.budget),
        repeats=2 if smoke else 3, hf=False)
    rows, context = bench.run_bench(target, draft, prompts, settings)
    return rows, context, settings, (target, draft), build_s


# -- the run -----------------------------------------------------------------------------------


def environment(device: str) -> str:
    import transformers

    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else "none"
    return (
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n- command: `python "
        f"{' '.join(['benchmarks/gpu_check.py'] + sys.argv[1:])}`\n- device: {device} ({gpu}), "
        f"{os.cpu_count()} CPUs\n- versions: torch {torch.__version__}, transformers "
        f"{transformers.__version__}, CUDA {torch.version.cuda}"
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    device = args.device or ("cpu" if args.smoke else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here; run it on a GPU machine, or pass --smoke",
            file=sys.stderr,
        )
        return 2
    start = time.perf_counter()
    name = args.name or time.strftime("gpu_%Y%m%d-%H%M%S") + ("_smoke" if args.smoke else "")
    md_path, csv_path = (os.path.join(args.out_dir, f"{name}.{e}") for e in ("md", "csv"))
    sections = [
        "# targetrows GPU check" + (" (smoke: tiny, CPU)" if args.smoke else ""),
        "",
        environment(device),
    ]
    all_rows, failed = [], False

    def save():
        atomic_write_text(md_path, "\n\n".join(sections) + "\n")
        if all_rows:
            atomic_write_text(csv_path, bench_report.csv_text(all_rows))

    def stage(title, fn):
        nonlocal failed
        t = time.perf_counter()
        try:
            out = fn()
        except Exception:  # a failed stage is reported; the next stage still runs
            failed = True
            sections.append(
                f"## {title}: FAILED after {time.perf_counter() - t:.0f} s\n\n```\n"
                f"{traceback.format_exc()}```"
            )
            out = None
        print(f"gpu_check: {title} done in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        save()
        return out

    save()
    rep = stage("identity", lambda: identity_stage(device, args.smoke))
    if rep is not None:
        sections.append(identity_markdown(rep))
        failed |= bool(rep["mismatches"])
    state = {}
    for temps in ((0.0,), (1.0,)):
        left = args.time_limit - (time.perf_counter() - start)
        spent = state.get("stage_s", 0.0)
        if left < 1.2 * spent or left < 30:
            sections.append(
                f"## Timing at T={temps[0]:g}: skipped ({left:.0f} s left of the limit)"
            )
            save()
            continue
        t = time.perf_counter()
        out = stage(f"timing T={temps[0]:g}", lambda t=temps: timing_stage(args, device, t, state))
        state["stage_s"] = (
            time.perf_counter() - t - (state.get("build_s", 0) if temps[0] == 0 else 0)
        )
        if out is not None:
            rows, context, settings, (target, draft) = out
            all_rows.extend(rows)
            head = bench_report.header(
                settings, target, draft, len({r["question_id"] for r in rows})
            )
            head["models"] = f"random weights, built in {state.get('build_s', 0):.0f} s"
            sections.append(
                bench_report.markdown(
                    head, bench_report.summarize(rows, settings), context, settings
                ).replace("# targetrows bench", f"## Timing, T={temps[0]:g}", 1)
            )
    import tempfile

    with tempfile.TemporaryDirectory() as heads:
        rep = stage("eagle3 identity", lambda: eagle3_identity(device, args.smoke, heads))
        if rep is not None:
            failed |= bool(rep["mismatches"])
            sections.append(f"## EAGLE-3 heads: identity\n\n{rep['checked']} runs against HF "
                            f"generate, mismatches: {rep['mismatches'] or 'none'}")
        left = args.time_limit - (time.perf_counter() - start)
        if left < 60 and not args.smoke:
            sections.append(f"## EAGLE-3 heads: timing skipped ({left:.0f} s left of the limit)")
        else:
            out = stage("eagle3 timing", lambda: eagle3_timing(args, device, state, heads))
            if out is not None:
                rows, context, settings, (target, draft), build_s = out
                all_rows.extend(dict(r, method=f"eagle3:{r['method']}") for r in rows)
                head = bench_report.header(settings, target, draft,
                                           len({r["question_id"] for r in rows}))
                head["models"] = f"random weights (head built in {build_s:.0f} s)"
                sections.append(bench_report.markdown(
                    head, bench_report.summarize(rows, settings), context, settings
                ).replace("# targetrows bench", "## EAGLE-3 head timing, T=0", 1))
    sections.append(f"Total {time.perf_counter() - start:.0f} s.")
    save()
    print(f"gpu_check: wrote {md_path}" + (f" and {csv_path}" if all_rows else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
