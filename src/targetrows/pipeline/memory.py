"""What a decode job holds per sequence beyond the models' weights, so that its memory request
grows with `decode.batch_size`: each sequence of a batch has its row of every model's cache
(`targetrows.hf.kv_cache.KVCache`: one row per sequence) and, with an EAGLE-3 head, the
target's features at each of its positions (the head's input).

Sizes come from the models' config.json (layers, key/value heads, head size, hidden size). A
sequence reaches at most `sequence_positions` positions; on the CPU a cache doubles when it
needs more room, so it may hold up to twice what it uses, and is counted so. On a GPU, and
under `decode.graphs`, a cache is allocated once at `decode.max_context` positions (the pipeline
sizes by them), and beside a batch's N rows each model keeps its own one-row cache, so N + 1
rows of that size, within the 2N the count allows.
"""

from __future__ import annotations

import json
from pathlib import Path

from .placement import DTYPE_BYTES

EAGLE3_FEATURES = 3  # target layers whose inputs an EAGLE-3 head reads (`Eagle3Shape.n_features`)
GROWTH = 2  # a growing cache doubles when full: up to twice the positions it holds


def read_spec(folder: str | Path) -> dict | None:
    """A model folder's config.json (its text model's, for a multimodal one); None while the
    folder or the file does not exist (a model downloaded after the plan is made)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    spec = json.loads(path.read_text())
    # a head (speculators layout) or a multimodal model keeps its decoder's shape one level down
    return spec.get("transformer_layer_config") or spec.get("text_config") or spec


def kv_bytes_per_position(spec: dict, dtype: str) -> int:
    """Bytes of keys and values one position takes in every layer of the model `spec` describes
    (an EAGLE-3 head's config names no layer count: it has one)."""
    try:
        heads = int(spec["num_attention_heads"])
        kv_heads = int(spec.get("num_key_value_heads") or heads)
        head_dim = int(spec.get("head_dim") or int(spec["hidden_size"]) // heads)
    except KeyError as err:
        raise ValueError(f"a model config without {err.args[0]}: cannot size its KV cache; set "
                         "config key resources.mem_mb.decode instead") from None
    layers = int(spec.get("num_hidden_layers") or 1)
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def feature_bytes_per_position(target_spec: dict, dtype: str) -> int:
    """Bytes of the target features an EAGLE-3 head reads at one position."""
    return EAGLE3_FEATURES * int(target_spec["hidden_size"]) * DTYPE_BYTES[dtype]


def sequence_positions(longest_turn: int, max_new_tokens: int, largest_tree: int) -> int:
    """Positions one sequence's cache may hold: its longest prompt turn, the new tokens, and the
    last round's tree (its nodes, the root and t0) fed before the answer is cut."""
    return int(longest_turn) + int(max_new_tokens) + int(largest_tree) + 2


def sequence_mb(target: dict, drafts: list[dict], positions: int, dtype: str,
                eagle3: bool = False) -> float:
    """MB one sequence's caches may take in `dtype`: the target's and each draft's KV cache over
    `positions`, plus the target's features where the draft is an EAGLE-3 head, with room for
    the buffers' growth (`GROWTH`)."""
    per_position = kv_bytes_per_position(target, dtype)
    per_position += sum(kv_bytes_per_position(d, dtype) for d in drafts)
    if eagle3:
        per_position += feature_bytes_per_position(target, dtype)
    return GROWTH * positions * per_position / 2**20


def batch_mb(target: dict | None, drafts: list[dict | None], positions: int, dtype: str,
             batch_size: int, eagle3: bool = False) -> float:
    """MB the caches of a batch of `batch_size` sequences may take (`sequence_mb` each); 0 while
    a model's config.json is not there to size them (a plan made before the download)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size} (config key "
                         "decode.batch_size)")
    if target is None or any(d is None for d in drafts):
        return 0.0
    return batch_size * sequence_mb(target, drafts, positions, dtype, eagle3)
