"""One prepared run for a GPU machine, under 10 minutes: is every decoder exact on CUDA, in
which dtype, what does a pass cost at the paper's model shapes, where does the host wait for
the GPU, and does the pipeline run there?

    python benchmarks/gpu_check.py                 # on a machine with a CUDA GPU
    python benchmarks/gpu_check.py --smoke         # the same stages, tiny and on CPU (seconds)

Stages, in order (each one's failure is recorded and the next one still runs; the report is
rewritten after every stage, so a run cut short keeps what it measured; a stage that the time
left cannot hold is skipped and says so):

1. graphs: padded passes replayed as CUDA graphs (`--graphs on`) against eager ones (the
   unpadded passes through the same forward) on the Qwen3-8B shape with a Qwen3-0.6B-shaped
   draft, in parts that each write their section (`gpu_graphs`): pass costs 1-128 nodes and
   the draft's pass; the kernels a pass spends its time in; every decoder's tokens with graphs
   against eager in float32 (equal, or the check fails), with the syncs per round; an EAGLE-3
   head's step; ar / draft_rank / fts tokens/s against the weight-streaming bound, their
   bfloat16 partings reported as the bench reports partings (near-tie or not; they fail
   nothing); rerank and fts with the root pass replayed beside drafting against after it; the
   bench on graphs with the draft and with the head (rows named graphs:...). Each part runs
   only if the budget its work is priced at (`gpu_budgets`) fits in the time left; the goals
   section (capture time and memory, the issue's goals against whatever ran) is rewritten
   after every part, and is in the report however the stage ends.
2. identity: every decoder against HF greedy generate, float64, standalone drafts
   (`gpu_exactness.identity`), root pass alongside.
3. syncs: host syncs per round and the lines that cause them, and the host's ms after reads at
   B=59 (what the GPU idles through; `gpu_speed.syncs`).
4. pass costs: a verify pass over 1-128 nodes at the Llama-3.1-8B, Qwen3-8B and Qwen2.5-32B
   shapes in bfloat16, and the row spread between pass shapes (`gpu_speed.pass_costs`).
5. bench: `targetrows bench` on the Qwen3-8B shape with a Qwen3-0.6B-shaped draft.
   Then overlap: root pass alongside drafting on one GPU (on a stream of its own), against
   one after the other.
   Then batched: ar, draft_rank and fts decoding 1, 4 and 16 prompts at once on that pair,
   against Hugging Face's batched generate (`gpu_speed.batched`).
6. EAGLE-3: identity with random heads of both layouts, then the Qwen3-8B shape's bench with a
   random head of a real head's shape, and that head's overlap as in 5.
7. drift: every decoder against HF greedy in float32 and bfloat16, the gap at each parting.
8. pipeline: the tests' tiny configuration through Snakemake with --resources gpu=1.

Results: benchmarks/results/gpu_<date>-<time>.md and .csv (the bench rows; --name sets the
stem), written atomically.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # tiny_models, tiny_heads: test fixtures
sys.path.insert(0, HERE)  # the stages' modules beside this script

import gpu_exactness as exact
import gpu_graphs as graphs
import gpu_pipeline
import gpu_speed as speed

from targetrows.bench import report as bench_report
from targetrows.bench.overlap import overlap_markdown
from targetrows.core.atomic import atomic_write_text


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    p.add_argument("--time-limit", type=float, default=480.0, help="seconds for all stages")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--budget", type=int, default=59, help="budget of the bench stages")
    p.add_argument("--skip", nargs="*", default=[], help="stage names to leave out")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=None, help="file stem (default gpu_<date>)")
    return p.parse_args(argv)


def environment(device: str) -> str:
    import transformers

    lines = [f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
             f"- command: `python {' '.join(['benchmarks/gpu_check.py'] + sys.argv[1:])}`"]
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(device)
        lines.append(f"- device: {device}: {p.name}, {p.total_memory / 2**30:.0f} GiB, compute "
                     f"capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, bf16 "
                     f"supported: {torch.cuda.is_bf16_supported()}; {os.cpu_count()} CPUs")
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,"
                                  "memory.total", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20).stdout.strip()
            lines.append(f"- nvidia-smi: {smi}")
        except (OSError, subprocess.SubprocessError) as err:
            lines.append(f"- nvidia-smi: {err}")
    else:
        lines.append(f"- device: {device}, {os.cpu_count()} CPUs")
    lines.append(f"- versions: python {sys.version.split()[0]}, torch {torch.__version__}, "
                 f"transformers {transformers.__version__}, CUDA {torch.version.cuda}")
    return "\n".join(lines)


class Report:
    """The report's sections and bench rows, rewritten atomically after every stage."""

    def __init__(self, md_path: str, csv_path: str, title: str):
        self.md_path, self.csv_path = md_path, csv_path
        self.sections, self.rows = [title], []
        self.keyed: dict[str, int] = {}  # key -> index of a section `put` rewrites

    def add(self, text: str) -> None:
        self.sections.append(text)
        self.save()

    def put(self, key: str, text: str) -> None:
        """Write section `key` anew: in place of its last version, at the end (what it sums up
        comes before it)."""
        if key in self.keyed:
            index = self.keyed.pop(key)
            del self.sections[index]
            self.keyed = {k: i - (i > index) for k, i in self.keyed.items()}
        self.keyed[key] = len(self.sections)
        self.add(text)

    def save(self) -> None:
        atomic_write_text(self.md_path, "\n\n".join(self.sections) + "\n")
        if self.rows:
            atomic_write_text(self.csv_path, bench_report.csv_text(self.rows))


def bench_section(title: str, out, report: Report, prefix: str = "") -> None:
    rows, context, settings, (target, draft), build_s = out
    report.rows.extend(dict(r, method=prefix + r["method"]) for r in rows)
    head = bench_report.header(settings, target, draft, len({r["question_id"] for r in rows}))
    head["models"] = f"random weights (built in {build_s:.0f} s)"
    report.add(bench_report.markdown(head, bench_report.summarize(rows, settings), context,
                                     settings).replace("# targetrows bench", f"## {title}", 1))


class Check:
    """One run of the check: its settings, its report, what one stage keeps for the next
    (`keep`: the models), and whether anything failed."""

    def __init__(self, args, device: str):
        self.args, self.device, self.start = args, device, time.perf_counter()
        name = args.name or time.strftime("gpu_%Y%m%d-%H%M%S") + ("_smoke" if args.smoke else "")
        self.report = Report(*(os.path.join(args.out_dir, f"{name}.{e}") for e in ("md", "csv")),
                             "# targetrows GPU check" + (" (smoke: tiny, CPU)" if args.smoke
                                                         else ""))
        self.report.add(environment(device))
        self.keep, self.failed = {}, False

    def left_s(self) -> float:
        return self.args.time_limit - (time.perf_counter() - self.start)

    def stage(self, key: str, need_s, fn, render):
        """Run `fn` if `need_s` seconds fit in what is left: a number (a stage's length as an
        earlier GPU run measured it), or a function giving a graphs part's budget
        (`GraphsStage.need_s`: its work, priced at what the stage measured before it)."""
        args, report = self.args, self.report
        skipped = key.split(":")[0] in args.skip or key in args.skip  # graphs: all its parts
        try:
            need = 0.0 if skipped else (need_s() if callable(need_s) else need_s)
        except Exception:  # a budget that cannot be priced is a failure of its own
            self.failed = True
            report.add(f"## Stage {key}: FAILED pricing its budget\n\n```\n"
                       f"{traceback.format_exc()[-3000:]}```")
            return None
        if skipped or (self.left_s() < need and not args.smoke):
            why = ("skipped (--skip)" if skipped
                   else f"skipped: {self.left_s():.0f} s left, its budget {need:.0f} s")
            report.add(f"## Stage {key}: {why}")
            return None
        t = time.perf_counter()
        try:
            out = fn()
            text = render(out)
        except Exception:  # a failed stage is reported; the next stage still runs
            self.failed = True
            report.add(f"## Stage {key}: FAILED after {time.perf_counter() - t:.0f} s\n\n```\n"
                       f"{traceback.format_exc()[-6000:]}```")
            return None
        if text:
            report.add(f"{text}\n\n(stage {key}: {time.perf_counter() - t:.0f} s of a "
                       f"{need:.0f} s budget)")
        print(f"gpu_check: {key} done in {time.perf_counter() - t:.0f} s", file=sys.stderr,
              flush=True)
        return out

    def graphs(self) -> None:
        """The graphs stage: its setup, then its parts, each a stage of its own (a part that
        fails or does not fit loses only its section), the goals rewritten after each."""
        stage = self.stage("graphs", graphs.SETUP_S,
                           lambda: graphs.GraphsStage(self.args, self.device, self.keep),
                           lambda g: g.setup_markdown())

        def part_render(text):  # graphs must give eager's tokens in float32
            self.failed |= not stage.same_tokens()
            return text

        benches = {"bench": ("Qwen3-0.6B-shaped draft", "graphs:"),
                   "head_bench": ("a random Qwen3-8B-shaped EAGLE-3 head", "graphs:eagle3:")}

        def bench_render(part):
            draft, prefix = benches[part]
            return lambda out: bench_section(f"Bench with graphs: Qwen3-8B shape, {draft}, T=0",
                                             out, self.report, prefix) or ""

        for part in graphs.PARTS if stage is not None else ():
            self.stage(f"graphs:{part}", lambda part=part: stage.need_s(part),
                       getattr(stage, part), bench_render(part) if part in benches else part_render)
            self.goals(stage)
        self.goals(stage)  # also where the setup did not run, or failed: nothing measured
        # the stage's twins, their caches and graphs go as it returns, before the next stages
        # build theirs

    def goals(self, stage) -> None:
        """The graphs stage's goals section, written anew from whatever ran."""
        try:
            text = graphs.goals_markdown(stage)
        except Exception:  # the section is there all the same, saying why it is empty
            self.failed = True
            text = f"### Goals\n\nFAILED:\n\n```\n{traceback.format_exc()[-3000:]}```"
        self.report.put("graphs:goals", text)

    def identity_render(self, title):
        def render(rep):
            self.failed |= bool(rep["mismatches"])
            return exact.identity_markdown(title, rep)
        return render

    def overlap_render(self, out):  # both schedules must give the same tokens
        rows, title = out
        self.failed |= not all(r["same_tokens"] for r in rows)
        return overlap_markdown(rows, title)

    def bench_render(self, title: str, prefix: str = ""):
        return lambda out: bench_section(title, out, self.report, prefix) or ""

    def eager_stages(self) -> None:
        """The stages after graphs, on the eager passes (measured once already:
        gpu_20261204.md)."""
        args, device, keep, stage = self.args, self.device, self.keep, self.stage
        stage("identity", 60, lambda: exact.identity(device, args.smoke), self.identity_render(
            "Greedy identity (tiny random models, float64, root pass alongside)"))
        stage("syncs", 40, lambda: speed.syncs(device, args.smoke), speed.syncs_markdown)
        stage("pass_costs", 90, lambda: speed.pass_costs(device, args.smoke, keep),
              speed.pass_costs_markdown)
        stage("bench", 60, lambda: speed.bench_pair(args, device, keep), self.bench_render(
            "Bench: Qwen3-8B shape, Qwen3-0.6B-shaped draft, T=0"))
        stage("overlap", 60, lambda: speed.overlap(args, device, keep), self.overlap_render)
        stage("batched", 45, lambda: speed.batched(args, device, keep), speed.batched_markdown)
        keep.pop("draft", None)
        stage("eagle3_identity", 30, lambda: exact.eagle3_identity(device, args.smoke),
              self.identity_render("Greedy identity with EAGLE-3 heads (float64, both layouts)"))
        stage("eagle3_bench", 45, lambda: speed.bench_pair(args, device, keep, head=True),
              self.bench_render("Bench: Qwen3-8B shape with a random Qwen3-8B-shaped EAGLE-3 "
                                "head, T=0", "eagle3:"))
        if "head" in keep:
            stage("eagle3_overlap", 30, lambda: speed.overlap(args, device, keep, "head"),
                  self.overlap_render)
        keep.clear()
        speed._free()
        stage("drift", 45, lambda: exact.drift(device, args.smoke), exact.drift_section)
        with tempfile.TemporaryDirectory() as work:
            stage("pipeline", 60, lambda: gpu_pipeline.run(
                Path(work), 0 if args.smoke else 1, os.cpu_count() or 2,
                max(self.left_s() - 10, 50)), gpu_pipeline.markdown)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = args.device or ("cpu" if args.smoke else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine, or pass --smoke",
              file=sys.stderr)
        return 2
    check = Check(args, device)
    # graphs first: what the next GPU run most needs to show (issue: passes at the hardware's
    # speed); the stages after it were measured once already (gpu_20261204.md)
    check.graphs()
    check.eager_stages()
    check.report.add(f"Total {time.perf_counter() - check.start:.0f} s.")
    print(f"gpu_check: wrote {check.report.md_path}", file=sys.stderr)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
