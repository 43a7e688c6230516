"""Every registered decoder against Hugging Face generate() and assisted generation: a thin wrapper
around `targetrows bench` (same arguments, same code), for running from a checkout.

    python benchmarks/decoders.py \
        --target resources/models/smollm2-135m-instruct \
        --draft resources/models/smollm2-135m-draft \
        --prompts config/prompts/mt_bench.jsonl --num-prompts 4 \
        --temperature 0 --budget auto --max-new-tokens 64 --threads 2

Writes benchmarks/results/bench_<date-time>.csv and .md (see --out-dir, --name).
"""

import sys

from targetrows.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
