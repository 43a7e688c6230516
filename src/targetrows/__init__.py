"""targetrows: tree-based speculative decoding that reuses the target model's rows.

The base package needs NumPy only; model backends (torch, transformers) load on demand.
"""

from . import pool, select, toy
from .acceptance import (
    expected_accepted,
    expected_accepted_batch,
    expected_accepted_greedy,
    reach_probability,
)
from .rows import RowStore
from .tree import Tree
from .verify import verify, walk

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
    "pool",
    "select",
    "toy",
]
