"""Test-wide settings.

Tiny models run fastest on one thread: torch's thread pool costs more than it saves on 64-wide
matrices, and on a busy 2-core machine two threads each can make a step 10-50x slower. The
variable is set before torch loads, so the CLI subprocesses the tests start inherit it too.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub

# The files that take minutes on 2 cores, longest first (seconds per file from `pytest
# --durations` on 2 workers, 2026-12-07, in this order: about 350, 255, 265, 140, 130, 95, 80 and
# 70). pytest-xdist hands each worker one file at a time in collection order (`--dist loadfile
# --no-loadscope-reorder`), so these start first and the short files fill in beside them, instead
# of a long file starting last.
LONGEST_FIRST = ("test_lossless_toy.py", "test_slurm.py", "test_pipeline.py",
                 "test_decoders_hf.py", "test_hub.py", "test_bench.py", "test_reliability.py",
                 "test_eagle3.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest in order
