"""The drift table: how often each greedy decoder wrote exactly ar's tokens, from the per-answer
rows `targetrows drift` writes (results/drift/<target>.csv), and where not, whether the
target's own rounding explains the parting (`targetrows.bench.drift`).

Every decoder is lossless with respect to the target as it computes its rows. In float32 on
this project's CPU kernels they reproduce ar's tokens; in bfloat16 (and on GPUs) a tree pass can
round a row a few steps away from ar's one-token step, and where the two best logits are that
close a decoder takes the other one. A parting beyond what rounding explains would be a bug.
"""

from __future__ import annotations

import pandas as pd

from targetrows.decoding.registry import DECODERS

from .frames import ordered

CAPTION = ("Temperature 0: answers token-identical to ar's, and partings from them where the "
           "target's two best logits lie within what rounding between pass shapes moves them "
           "(near-tie) or beyond it (largest gap at a parting in rounding steps of the dtype).")
COLUMNS = ["pair", "decoder", "budget", "depth", "budget_auto", "dtype", "answers", "identical",
           "near_tie", "beyond", "max_gap_steps"]


def read_drift(paths: list[str]) -> pd.DataFrame:
    frames = [pd.read_csv(p, dtype={"question_id": str}) for p in paths]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def drift_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per pair, decoder and condition: answers, identical to ar's, parted at a
    near-tie, parted beyond one, the largest gap at a parting (rounding steps), the dtype."""
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = rows.assign(
        identical=rows["identical"].astype(str) == "True",
        near_tie=rows["near_tie"].astype(str) == "True",
        dtype=rows["dtype"].fillna(""),
    )
    rows = rows.assign(beyond=~rows["identical"] & ~rows["near_tie"])
    keys = ["pair", "decoder", "budget", "depth", "budget_auto"]
    table = rows.groupby(keys, sort=False).agg(
        dtype=("dtype", lambda d: ", ".join(sorted({x for x in d if x})) or "-"),
        answers=("identical", "size"), identical=("identical", "sum"),
        near_tie=("near_tie", "sum"), beyond=("beyond", "sum"),
        max_gap_steps=("gap_steps", "max")).reset_index()
    return ordered(table, "decoder", DECODERS).sort_values(keys)[COLUMNS]
