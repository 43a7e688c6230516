"""The file of a fitted rule's model, whichever kind it is: a learned reranker
(`targetrows.core.rules.learned`) or Sequoia's acceptance vector
(`targetrows.core.rules.sequoia_model`), told apart by the format the file names."""

from __future__ import annotations

from .learned import FORMAT as RERANKER_FORMAT
from .learned import Reranker, read_json
from .sequoia_model import FORMAT as ACCEPTANCE_FORMAT
from .sequoia_model import AcceptanceVector


def load_fitted(path: str) -> Reranker | AcceptanceVector:
    """The model in `path`, by its format; a file of neither is refused naming both."""
    doc = read_json(path, "model")
    found = doc.get("format") if isinstance(doc, dict) else None
    if found == ACCEPTANCE_FORMAT:
        return AcceptanceVector.load(path)
    if found == RERANKER_FORMAT:
        return Reranker.load(path)
    raise ValueError(f"model file {path} is neither a {RERANKER_FORMAT} nor a "
                     f"{ACCEPTANCE_FORMAT} file (format {found!r}): targetrows train-reranker "
                     "writes them")
