"""Sequoia's acceptance vector as a model file, and the registered `sequoia` rule that reads it.

Sequoia (arXiv 2402.12374) shapes its tree for an acceptance vector p, measured once per pair:
p[k - 1] is the chance that verification moves from a node to its rank-k child
(`targetrows.core.rules.sequoia`). Here p is fitted on row logs the way the learned rerankers
are (`targetrows train-reranker --rules sequoia`, `targetrows.train.sequoia`): at temperature 0
the share of positions where the target's argmax is the draft's rank-k first-level token, above
it the target's mean probability of that token (what our verification accepts it with). It
travels like a `Reranker`: a small JSON file (no pickle), cross-fitted by prompt (`folds`,
`fold_of`), so that every prompt is scored offline and decoded online with a p fitted without
it; `for_prompt`, `digest` and `load` are the interface `DecodeConfig`, `decode` and the row-log
scorer use for both kinds of model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..checks import check_format
from .learned import FittedFile, fold_of_from, read_json
from .sequoia import check_acceptance, sequoia_rule

FORMAT = "targetrows-acceptance"
VERSION = 1
SEQUOIA = "sequoia"  # the rule (and decoder) that reads this model

sequoia = sequoia_rule(name=SEQUOIA)  # p from the model its pools carry: a learned rule


@dataclass(frozen=True)
class AcceptanceVector(FittedFile):
    """`p[k - 1]`: the acceptance probability of a node's rank-k child, fitted on row logs.
    ``folds[j]`` was fitted without the prompts whose key ``fold_of`` maps to j."""

    rule: str
    p: tuple[float, ...]
    folds: tuple[tuple[float, ...], ...] = ()
    fold_of: Mapping[str, int] = field(default_factory=dict)
    meta: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if self.rule != SEQUOIA:
            raise ValueError(f"an acceptance vector is for rule {SEQUOIA!r}, not {self.rule!r}")
        for p in (self.p, *self.folds):
            try:
                check_acceptance(p)
            except ValueError as err:
                raise ValueError(f"acceptance vector for {self.rule!r}: {err}") from None
            if len(p) != len(self.p):
                raise ValueError(f"acceptance vector for {self.rule!r}: a fold has {len(p)} "
                                 f"ranks, the model {len(self.p)}")
        if not isinstance(self.fold_of, Mapping):
            raise ValueError(f"acceptance vector for {self.rule!r}: fold_of must map prompt "
                             f"keys to fold numbers, got a {type(self.fold_of).__name__}")
        if any(isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self.folds)
               for k in self.fold_of.values()):
            raise ValueError(f"acceptance vector for {self.rule!r}: fold_of names a fold it "
                             "does not hold")

    def for_prompt(self, key: str) -> AcceptanceVector:
        """The vector to score prompt `key` ("task/question_id") with: the fold's that was
        fitted without it, or the one fitted on every prompt."""
        k = self.fold_of.get(key)
        return AcceptanceVector(self.rule, self.p if k is None else self.folds[k],
                                meta=self.meta)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "rule": self.rule,
                           "p": list(self.p), "folds": [list(p) for p in self.folds],
                           "fold_of": dict(self.fold_of), "meta": dict(self.meta)},
                          indent=1) + "\n"

    @classmethod
    def load(cls, path: str) -> AcceptanceVector:
        """An acceptance vector file (JSON); a malformed or foreign file is refused naming the
        file and what is wrong."""
        doc = read_json(path, "acceptance vector")
        check_format(doc, FORMAT, VERSION, f"acceptance vector file {path}",
                     "fit it again with targetrows train-reranker --rules sequoia")
        try:
            return cls(str(doc["rule"]), tuple(_floats(doc["p"])),
                       tuple(tuple(_floats(f)) for f in doc.get("folds", [])),
                       fold_of_from(doc.get("fold_of", {})), dict(doc.get("meta", {})))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"acceptance vector file {path}: {err}") from None


def _floats(values) -> list[float]:
    if not isinstance(values, list) or any(isinstance(v, bool) or not isinstance(v, int | float)
                                           for v in values):
        raise ValueError(f"expected a list of probabilities, got {values!r}")
    return [float(v) for v in values]
