"""Learned reranking: the first-level branches scored by a small model trained on row logs
(`targetrows train-reranker`), then the draft's own log-probs below them, like the rules of
`root_pool`.

    learned_rerank        the branch score from everything known when the root pass has run:
                          the exact root row, the previous context's row (the stale row), the
                          draft's log-probs and ranks, and the draft's pool below the branch.
    learned_stale_rerank  the same without the root row: no root pass, one device.

The model is linear in a few features of each first-level node (`FEATURES`), so a round's
scores are one small matrix product; it is read from JSON (`Reranker.load`, no pickle). A
branch's score only needs to order the branches and set how far each reaches into the budget
against the draft's log-probs below it: it is fitted to expected accepted draft tokens directly
(`targetrows.train.reranker`). Scores never rise from a node to its child (the draft's
conditional log-probs below a branch are <= 0), so every selection is ancestor-closed and every
decoder stays lossless.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..atomic import atomic_write_text
from ..checks import check_format
from .batch import PoolBatch
from .rule import Rule

FORMAT = "targetrows-reranker"
VERSION = 1
FLOOR = -30.0  # a log-prob that stands for "none" (no children, no row, a token ruled out)

# feature -> (what it is, whether it needs the exact root row)
FEATURES = {
    "root_logp": ("log-prob of the branch's token under the exact root row", True),
    "root_rank": ("rank of the branch among the first level by the root row, 0 = best, / (k-1)",
                  True),
    "stale_logp": ("log-prob of the branch's token under the previous context's row (the draft's "
                   "own log-prob where there is no such row)", False),
    "stale_rank": ("rank of the branch by the stale row, / (k-1)", False),
    "stale_missing": ("1 where the position has no previous row", False),
    "draft_logp": ("the draft's log-prob of the branch's token", False),
    "draft_rank": ("rank of the branch by the draft, / (k-1)", False),
    "child_best": ("the draft's best conditional log-prob of a child of the branch", False),
    "child_mass": ("log of the draft's mass on the branch's children in the pool", False),
    "chain_best": ("the draft's log-prob of the best path from the branch to the pool's deepest "
                   "level, per level", False),
}
STALE_FEATURES = tuple(k for k, (_, root) in FEATURES.items() if not root)
ALL_FEATURES = tuple(FEATURES)


class FittedFile:
    """A fitted rule's file, from the JSON text its class writes (`to_json`, which each kind
    defines): saved whole or not at all, and named in answer files by a digest of that text."""

    def save(self, path: str) -> None:
        atomic_write_text(path, self.to_json())

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Reranker(FittedFile):
    """A trained branch scorer: weights over named features (`FEATURES`). `folds` and `fold_of`
    hold cross-fitted models: ``folds[k]`` was trained without the prompts whose key ``fold_of``
    maps to k, so every training prompt can be scored by a model that never saw it."""

    rule: str
    features: tuple[str, ...]
    weights: tuple[float, ...]
    folds: tuple[tuple[float, ...], ...] = ()
    fold_of: Mapping[str, int] = field(default_factory=dict)
    meta: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if self.rule not in LEARNED_RULES:
            raise ValueError(f"a reranker is for a learned rule ({', '.join(LEARNED_RULES)}), "
                             f"not {self.rule!r}")
        if not isinstance(self.fold_of, Mapping):
            raise ValueError(f"reranker for {self.rule!r}: fold_of must map prompt keys to "
                             f"fold numbers, got a {type(self.fold_of).__name__}")
        odd = [k for k, v in self.fold_of.items() if isinstance(v, bool) or not isinstance(v, int)]
        if odd:
            raise ValueError(f"reranker for {self.rule!r}: fold_of gives {odd[0]!r} the fold "
                             f"{self.fold_of[odd[0]]!r}, not a whole number")
        unknown = [f for f in self.features if f not in FEATURES]
        if unknown:
            raise ValueError(f"reranker for {self.rule!r}: unknown features {unknown} "
                             f"(known: {', '.join(FEATURES)})")
        if self.rule == "learned_stale_rerank" and any(FEATURES[f][1] for f in self.features):
            raise ValueError("reranker for 'learned_stale_rerank' reads the root row "
                             f"({[f for f in self.features if FEATURES[f][1]]}): that rule has "
                             "no root pass")
        for w in (self.weights, *self.folds):
            if len(w) != len(self.features) or not np.all(np.isfinite(w)):
                raise ValueError(f"reranker for {self.rule!r}: {len(w)} weights for "
                                 f"{len(self.features)} features, or not all finite")
        if any(not 0 <= k < len(self.folds) for k in self.fold_of.values()):
            raise ValueError(f"reranker for {self.rule!r}: fold_of names a fold it does not hold")

    def for_prompt(self, key: str) -> Reranker:
        """The model to score prompt `key` ("task/question_id") with: the fold model that was
        trained without it, or the model trained on every prompt."""
        k = self.fold_of.get(key)
        weights = self.weights if k is None else self.folds[k]
        return Reranker(self.rule, self.features, weights, meta=self.meta)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "rule": self.rule,
                           "features": list(self.features), "weights": list(self.weights),
                           "folds": [list(w) for w in self.folds],
                           "fold_of": dict(self.fold_of), "meta": dict(self.meta)},
                          indent=1, sort_keys=False) + "\n"

    @classmethod
    def load(cls, path: str) -> Reranker:
        """A reranker file (JSON, no pickle); a malformed or foreign file is refused naming the
        file and what is wrong."""
        doc = read_json(path, "reranker")
        check_format(doc, FORMAT, VERSION, f"reranker file {path}",
                     "train it again with targetrows train-reranker")
        try:
            return cls(str(doc["rule"]), tuple(doc["features"]),
                       tuple(float(w) for w in doc["weights"]),
                       tuple(tuple(float(w) for w in f) for f in doc.get("folds", [])),
                       fold_of_from(doc.get("fold_of", {})), dict(doc.get("meta", {})))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"reranker file {path}: {err}") from None


def read_json(path: str, what: str) -> dict:
    """A model file's JSON document; a missing file or one that is not JSON is refused by
    name."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file {path} does not exist (targetrows train-reranker "
                                "writes one)")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"{what} file {path}: not JSON ({err})") from None


def prompt_folds(keys: Sequence[str], folds: int, seed: int) -> dict[str, int]:
    """Each prompt key's fold: a seeded shuffle dealt round-robin (folds as even as can be)."""
    order = sorted(set(keys))
    rng = np.random.default_rng(seed)
    return {key: i % folds for i, key in enumerate(rng.permutation(order).tolist())}


def fold_of_from(raw) -> dict:
    """A file's fold_of as {prompt key: fold}, refused by name when it is no mapping or a fold
    is not a whole number (truncating 1.5 would score a prompt with a model that saw it)."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"fold_of must map prompt keys to fold numbers, got {raw!r}")
    out = {}
    for key, fold in raw.items():
        if isinstance(fold, bool) or not isinstance(fold, int | float) or fold != int(fold):
            raise ValueError(f"fold_of gives {key!r} the fold {fold!r}, not a whole number")
        out[str(key)] = int(fold)
    return out


def branch_features(batch: PoolBatch, names: tuple[str, ...]) -> np.ndarray:
    """[P, N, len(names)] features at the first-level nodes (0 elsewhere)."""
    p, n = batch.shape
    first = batch.is_first
    logq = np.where(np.isfinite(batch.logq), batch.logq, FLOOR)
    out = np.zeros((p, n, len(names)))
    k = np.maximum(first.sum(axis=1, keepdims=True) - 1, 1)

    def rank(values):  # 0 = best among each pool's first level, / (k - 1)
        v = np.where(first, values, -np.inf)
        order = np.argsort(-v, axis=1, kind="stable")
        ranks = np.empty_like(order)
        np.put_along_axis(ranks, order, np.arange(n)[None].repeat(p, 0), axis=1)
        return ranks / k

    stale = batch.stale_logp
    if stale is None:  # no previous rows: the draft stands in
        missing, stale_logp = np.ones((p, n), bool), logq
    else:
        row_missing = np.isnan(np.where(first, stale, 0.0)).any(axis=1, keepdims=True)
        missing = np.broadcast_to(row_missing, (p, n))
        stale_logp = np.where(missing, logq, np.nan_to_num(stale, nan=FLOOR, neginf=FLOOR))
    child = batch.parents > 0
    child = child & np.take_along_axis(first, np.maximum(batch.parents, 0), 1)
    cond = np.where(child, batch.below_first, -np.inf)
    flat = (np.arange(p)[:, None] * n + np.maximum(batch.parents, 0))[child]
    best = np.full(p * n, -np.inf)
    np.maximum.at(best, flat, cond[child])
    mass = np.zeros(p * n)
    np.add.at(mass, flat, np.exp(cond[child]))
    depth = batch.depth  # 0 at padding
    deepest = depth.max(axis=1, keepdims=True)
    leaf = (depth == deepest) & (depth >= 2)
    chain = np.full(p * n, -np.inf)
    flat_first = (np.arange(p)[:, None] * n + batch.first)[leaf]
    np.maximum.at(chain, flat_first, (batch.below_first / np.maximum(depth - 1, 1))[leaf])
    values = {
        "root_logp": lambda: np.nan_to_num(np.where(first, batch.root_logp, 0.0), neginf=FLOOR),
        "root_rank": lambda: rank(np.nan_to_num(batch.root_logp, neginf=FLOOR)),
        "stale_logp": lambda: np.maximum(stale_logp, FLOOR),
        "stale_rank": lambda: rank(stale_logp),
        "stale_missing": lambda: missing.astype(np.float64),
        "draft_logp": lambda: logq,
        "draft_rank": lambda: rank(logq),
        "child_best": lambda: np.maximum(best.reshape(p, n), FLOOR),
        "child_mass": lambda: np.maximum(np.log(np.maximum(mass, 1e-300)).reshape(p, n), FLOOR),
        "chain_best": lambda: np.maximum(chain.reshape(p, n), FLOOR),
    }
    for j, name in enumerate(names):
        if name.startswith("root") and batch.root_logp is None:
            raise ValueError(f"feature {name!r} reads the exact root row: the pools carry none")
        out[..., j] = np.where(first, values[name](), 0.0)
    return out


def learned_scores(batch: PoolBatch) -> np.ndarray:
    model = batch.reranker
    if model is None:
        raise ValueError("a learned rule scores with a trained reranker: none was given "
                         "(targetrows train-reranker; --reranker FILE)")
    branch = branch_features(batch, model.features) @ np.asarray(model.weights)
    return batch.rescored_first(branch)


LEARNED_RULES = ("learned_rerank", "learned_stale_rerank")  # the rules defined below
learned_rerank = Rule("learned_rerank", "draft_rank with the first-level branches scored by a "
                      "model trained on row logs, from the exact root row and everything else known "
                      "(an extension)", learned_scores, reads=("root_row", "stale_row"),
                      baselines=("target_rerank",), paper=False, learned=True)
learned_stale_rerank = Rule("learned_stale_rerank", "draft_rank with the first-level branches "
                            "scored by a model trained on row logs, without the root row (no root "
                            "pass; an extension)", learned_scores, reads=("stale_row",),
                            baselines=("draft_rank", "stale_rerank"), paper=False, learned=True)
