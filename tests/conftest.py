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
