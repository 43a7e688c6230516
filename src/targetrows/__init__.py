"""targetrows: tree-based speculative decoding that reuses the target model's rows.

The package is layered by dependency; each layer imports only from the layers above it here:

    core/       NumPy only: trees, rows, the candidate pool, the selection rules (core/rules),
                acceptance, verification, prompt lookup, the toy pair
    decoding/   NumPy only: the `Model` protocol, the one round loop, the registry of rules and
                decoders, their planners
    cost/       NumPy only: what a round costs, the zero-overhead bound, the budget that fits
    specbench/  NumPy only: Spec-Bench prompts in, answers out, the decode command's library
    hf/         torch: the Hugging Face backend, EAGLE-3 heads, loading, Hugging Face's own
                generation
    rowlog/     row logs: format, recording, scoring
    pipeline/   what Snakemake jobs call: budget conditions, GPU claims
    analysis/   statistics, the pipeline's tables and figures
    fetch/      the model hub, dataset prompts, the embedded target
    train/      the target's replies, and the drafts trained on them
    bench/      benchmarks against Hugging Face generation
    cli/        the `targetrows` command line (argparse lives only here)

`import targetrows` needs NumPy only; torch loads when a backend is used. The names below are
the core's most used; everything else is imported from its module.
"""

from .core.acceptance import (
    expected_accepted,
    expected_accepted_batch,
    expected_accepted_greedy,
    reach_probability,
)
from .core.rows import RowStore
from .core.tree import Tree
from .core.verify import verify, walk

__version__ = "0.1.0"

__all__ = [
    "Tree",
    "RowStore",
    "expected_accepted",
    "expected_accepted_batch",
    "expected_accepted_greedy",
    "reach_probability",
    "verify",
    "walk",
]
