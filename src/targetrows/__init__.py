"""targetrows: tree-based speculative decoding that reuses the target model's rows.

The package is layered by dependency; each layer imports only from the layers above it here:

    core/      NumPy only: trees, rows, the candidate pool, selection rules, acceptance,
               verification, the toy pair
    decoding/  NumPy only: the `Model` protocol, the one round loop, the decoder registry,
               the cost model
    hf/        torch: the Hugging Face backend, loading, Hugging Face's own generation
    rowlog/    row logs: format, recording, scoring
    analysis/  statistics, the pipeline's tables and figures
    build/     the embedded target and distilled drafts
    bench/     benchmarks against Hugging Face generation
    cli/       the `targetrows` command line (argparse lives only here)

`import targetrows` needs NumPy only; torch loads when a backend is used.
"""

import sys as _sys

from .core import acceptance, pool, rows, select, toy, tree, verify
from .core.acceptance import (
    expected_accepted,
    expected_accepted_batch,
    expected_accepted_greedy,
    reach_probability,
)
from .core.rows import RowStore
from .core.tree import Tree
from .core.verify import verify as verify_tree
from .core.verify import walk
from .decoding import loop as decode

__version__ = "0.1.0"

# Module paths of earlier releases (`targetrows.toy`, `targetrows.decode`, ...) keep working.
for _name, _module in {"acceptance": acceptance, "pool": pool, "rows": rows, "select": select,
                       "toy": toy, "tree": tree, "verify": verify, "decode": decode}.items():
    _sys.modules[f"{__name__}.{_name}"] = _module

verify = verify_tree  # the function, as before (`targetrows.verify(tree, rows, rng)`)

__all__ = [
    "Tree",
    "RowStore",
    "expected_accepted",
    "expected_accepted_batch",
    "expected_accepted_greedy",
    "reach_probability",
    "verify",
    "walk",
    "pool",
    "select",
    "toy",
    "decode",
]
