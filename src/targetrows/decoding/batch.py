"""Batched decoding of prompts: `generate` for many prompts at once, on the scheduler of
`targetrows.decoding.schedule` (one thread; sequences are data; passes batched per model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .config import DecodeConfig
from .loop import DecodeResult, decode_passes
from .schedule import BatchStats, Job, run_batched


def generate_batch(target: Any, draft: Any | None, prompts: Sequence[Sequence[int]],
                   configs: DecodeConfig | Sequence[DecodeConfig], batch_size: int | None = None,
                   stats: BatchStats | None = None) -> list[DecodeResult]:
    """`generate` for every prompt (one config for all, or one per prompt: each its own seed),
    `batch_size` sequences at a time (default: the configs' `batch_size`); each result as its
    batch-1 `generate` gives it. A draft-free decoder that keeps what it learned across prompts
    depends on their order, so it runs at batch size 1 only."""
    if isinstance(configs, DecodeConfig):
        configs = [configs] * len(prompts)
    if len(configs) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(configs)} configs")
    if batch_size is None:
        batch_size = configs[0].batch_size if configs else 1
    check_batchable(configs, batch_size)
    jobs = [_job(p, c) for p, c in zip(prompts, configs, strict=True)]
    return run_batched(target, draft, jobs, batch_size, stats)


def check_batchable(configs: Sequence[DecodeConfig], batch_size: int) -> None:
    """Refuse what a batch cannot reproduce: a draft-free state carried from prompt to prompt
    (`DecodeConfig.keep_across_prompts`) learns in prompt order, which a batch does not keep."""
    if batch_size > 1 and any(c.keep_across_prompts and c.decoder.new_state for c in configs):
        raise ValueError("keep_across_prompts carries a draft-free decoder's state from prompt "
                         "to prompt in order, which a batch does not keep: use batch size 1")


def _job(prompt: Sequence[int], config: DecodeConfig) -> Job:
    def job(target, draft):
        return decode_passes(target, draft if config.decoder.needs_draft else None, prompt,
                             config)
    return job
