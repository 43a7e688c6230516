"""Tiny repositories for the hub-compatible test server (tests/hub_server.py).

Datasets: the seven of config/paper.yaml (targetrows.fetch.datasets.SOURCES) under their real ids,
configurations, splits and columns, as parquet files laid out as on the hub (a README whose YAML
names the configurations' data files), with a handful of rows each. Models: a tiny random-weight
model folder (tests/tiny_models.py) as a model repository.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

N_ROWS = 5  # rows per split: fewer than a test's prompts.n, so the split is taken whole


def _parquet(columns: dict) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf)
    return buf.getvalue()


def _readme(configs: list[tuple[str, str, str, bool]]) -> bytes:
    """A dataset card naming each (config, split, file glob, default) as the hub's do."""
    lines = ["---", "configs:"]
    for name, split, path, default in configs:
        lines += [f"- config_name: {name}"] + (["  default: true"] if default else []) + [
            "  data_files:", f"  - split: {split}", f"    path: {path}"]
    return ("\n".join(lines + ["---", "", "Tiny test copy.", ""])).encode()


def _rows(n: int, fmt: str) -> list[str]:
    return [fmt.format(i=i) for i in range(n)]


def dataset_repos(n: int = N_ROWS) -> dict[str, dict[str, bytes]]:
    """repo id -> {path: bytes} for the seven task datasets."""
    shard = "-00000-of-00001.parquet"
    return {
        "HuggingFaceH4/mt_bench_prompts": {
            "README.md": _readme([("default", "train", "data/train-*", True)]),
            f"data/train{shard}": _parquet({
                "prompt": [[f"Write a short poem about the number {i}.",
                            "Now make it rhyme."] for i in range(n)],
                "prompt_id": [81 + i for i in range(n)],
                "category": ["writing"] * n,
                "reference": [[] for _ in range(n)],
            }),
        },
        "openai/openai_humaneval": {
            "README.md": _readme([("openai_humaneval", "test", "openai_humaneval/test-*", True)]),
            f"openai_humaneval/test{shard}": _parquet({
                "task_id": _rows(n, "HumanEval/{i}"),
                "prompt": _rows(n, 'def add_{i}(x: int) -> int:\n    """Return x + {i}."""\n'),
                "canonical_solution": _rows(n, "    return x + {i}\n"),
                "test": _rows(n, "def check(f):\n    assert f(0) == {i}\n"),
                "entry_point": _rows(n, "add_{i}"),
            }),
        },
        "openai/gsm8k": {
            "README.md": _readme([("main", "test", "main/test-*", False),
                                  ("socratic", "test", "socratic/test-*", False)]),
            f"main/test{shard}": _parquet({
                "question": _rows(n, "Tom has {i} apples and buys 3 more. How many now?"),
                "answer": _rows(n, "{i} + 3 apples\n#### {i}3"),
            }),
            f"socratic/test{shard}": _parquet({
                "question": _rows(n, "How many? ({i})"), "answer": _rows(n, "#### {i}"),
            }),
        },
        "tatsu-lab/alpaca": {
            "README.md": _readme([("default", "train", "data/train-*", True)]),
            f"data/train{shard}": _parquet({
                "instruction": _rows(n, "Give {i} tips for staying healthy."),
                "input": ["" if i % 2 else f"Context {i}." for i in range(n)],
                "output": _rows(n, "Eat well ({i})."),
                "text": _rows(n, "Below is an instruction ({i})."),
            }),
        },
        "abisee/cnn_dailymail": {
            "README.md": _readme([("3.0.0", "test", "3.0.0/test-*", False),
                                  ("1.0.0", "test", "1.0.0/test-*", False)]),
            f"3.0.0/test{shard}": _parquet({
                "article": _rows(n, "(CNN) Story number {i}: a town held a fair on Sunday."),
                "highlights": _rows(n, "Town fair {i}."),
                "id": _rows(n, "{i:040x}"),
            }),
            f"1.0.0/test{shard}": _parquet({
                "article": _rows(n, "Old {i}."), "highlights": _rows(n, "o{i}"),
                "id": _rows(n, "{i:040x}"),
            }),
        },
        "google-research-datasets/nq_open": {
            "README.md": _readme([("nq_open", "validation", "nq_open/validation-*", True)]),
            f"nq_open/validation{shard}": _parquet({
                "question": _rows(n, "who wrote book number {i}"),
                "answer": [[f"Author {i}"] for i in range(n)],
            }),
        },
        "wmt/wmt14": {
            "README.md": _readme([("de-en", "test", "de-en/test-*", False),
                                  ("fr-en", "test", "fr-en/test-*", False)]),
            f"de-en/test{shard}": _parquet({
                "translation": [{"de": f"Das ist Satz {i}.", "en": f"This is sentence {i}."}
                                for i in range(n)],
            }),
            f"fr-en/test{shard}": _parquet({
                "translation": [{"fr": f"Phrase {i}.", "en": f"Sentence {i}."} for i in range(n)],
            }),
        },
    }


def model_files(folder: Path) -> dict[str, bytes]:
    """A saved model folder as a repository's files."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}
