"""How many aten operations one decoder layer of the target costs in a pass, counted by
`torch.profiler` on the CPU: what a GPU launches per layer where a pass is not a graph (and
what a graph replays as kernels where it is).

A layer's count is read as the difference between the same pass through a model of `--layers`
and of twice as many layers, divided by the layers added: what the embedding, the final norm,
the LM head and the pass's own inputs cost cancels out. Three counts per pass:

- **ops**: every aten operation the forward calls, views included (a view launches nothing);
- **top-level**: those called by the forward itself, not from inside another aten operation
  (on the CPU a fused operation such as `rms_norm` runs several others inside it);
- **kernels**: top-level operations that compute or copy (views, allocations and conversions
  that convert nothing left out): what an eager GPU pass launches, one each (a fused
  operation that the CPU runs as several is one kernel on a GPU).

Two passes: a one-token step after a 40-token prefix (`ar`'s), and a 17-node tree pass (a
verify pass). The script uses the library's public API only, so that it runs on an earlier
commit too (`PYTHONPATH=<other checkout>/src python benchmarks/layer_ops.py`):

    python benchmarks/layer_ops.py --arch llama --out benchmarks/results/layer_ops.md
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_models import tiny_model  # noqa: E402

from targetrows.core.tree import Tree  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402

# operations that launch nothing themselves: views of their input, metadata, allocations, and
# wrappers (`to`, `reshape`, `contiguous`) that launch only through an operation inside them
FREE = {"aten::view", "aten::_unsafe_view", "aten::slice", "aten::select", "aten::transpose",
         "aten::permute", "aten::expand", "aten::as_strided", "aten::unsqueeze",
         "aten::squeeze", "aten::split", "aten::split_with_sizes", "aten::chunk",
         "aten::unbind", "aten::t", "aten::alias", "aten::detach", "aten::narrow",
         "aten::reshape", "aten::flatten", "aten::view_as", "aten::expand_as",
         "aten::lift_fresh", "aten::result_type", "aten::size", "aten::stride",
         "aten::is_nonzero", "aten::empty", "aten::empty_strided", "aten::to",
         "aten::type_as", "aten::contiguous", "aten::resolve_conj", "aten::resolve_neg"}

PREFIX = [(7 * i) % 250 + 3 for i in range(40)]
TREE = Tree([PREFIX[-1], 5, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24],
            [-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7])


def counts(arch: str, layers: int, tree: Tree) -> tuple[int, int, int]:
    """(ops, top-level ops, kernels) of one pass at `tree`, rooted at the last token of PREFIX,
    after the rest of PREFIX is committed: the pass feeds the tree, its root included."""
    model = HFModel(tiny_model(arch, seed=0, n_layers=layers), name="t")
    for _ in range(2):  # the first time, warm: anything made on a first pass
        model.reset(0)
        model.logits(PREFIX[:-1], Tree.root_only(PREFIX[-2]), [0])
        model.commit(PREFIX[:-1])
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            model.logits(PREFIX, tree, range(len(tree)))
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if not _inside_aten(e)]
    return len(events), len(top), sum(_launches(e) for e in top)


def _launches(event) -> bool:
    """Whether `event` computes or copies: it is not free, or something inside it is not."""
    return event.name not in FREE or any(_launches(c) for c in event.cpu_children)


def _inside_aten(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def per_layer(arch: str, layers: int, tree: Tree) -> tuple[float, ...]:
    few, many = counts(arch, layers, tree), counts(arch, 2 * layers, tree)
    return tuple((b - a) / layers for a, b in zip(few, many, strict=True))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="llama", choices=("llama", "qwen2", "qwen3"))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--out", help="append the table to this Markdown file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import targetrows

    # the commit of the checkout whose code runs (PYTHONPATH), not of this script's
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(targetrows.__file__).parent).stdout.strip()
    lines = [f"aten operations per decoder layer, {args.arch}, code at "
             f"`{Path(targetrows.__file__).parents[2].name}` (commit {commit}), "
             f"torch {torch.__version__}", "",
             "| pass | ops | top-level | kernels |", "|---|---|---|---|"]
    for name, tree in (("one-token step", Tree.root_only(PREFIX[-1])),
                       ("17-node tree pass", TREE)):
        ops, top, kernels = per_layer(args.arch, args.layers, tree)
        lines.append(f"| {name} | {ops:g} | {top:g} | {kernels:g} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
