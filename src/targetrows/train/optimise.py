"""What both trainings (`distill`, `train-eagle3`) share: the order they visit their replies in,
AdamW with a linear warm-up then a cosine decay to zero, and the loop of optimiser steps."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from tqdm import tqdm


def batch_order(n: int, steps: int, batch: int, gen: torch.Generator,
                lengths: torch.Tensor | None = None, window: int = 8) -> torch.Tensor:
    """Sequence indices for `steps` batches of `batch`: whole shuffled epochs, back to back.
    With the sequences' `lengths`, each run of `window` batches of an epoch is sorted by length,
    so that a batch pads its sequences to a similar width (the windows stay random)."""
    epochs = [torch.randperm(n, generator=gen) for _ in range(math.ceil(steps * batch / n))]
    if lengths is not None:
        span = window * batch
        epochs = [torch.cat([w[lengths[w].argsort(stable=True)] for w in e.split(span)])
                  for e in epochs]
    return torch.cat(epochs)


def adamw_warmup_cosine(params, lr: float, weight_decay: float, warmup: int, steps: int):
    """(AdamW, its scheduler): lr rises linearly over `warmup` steps, then decays as a cosine to
    zero at `steps`; call the scheduler's step() after each optimiser step."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warmup = max(1, warmup)

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def optimise(step_loss: Callable[[int], torch.Tensor], params, lr: float, weight_decay: float,
             warmup: int, steps: int, clip: float, desc: str,
             deadline: float | None = None) -> list[float]:
    """Run up to `steps` optimiser steps on `step_loss(step)` (AdamW, warm-up and cosine decay,
    gradients clipped to norm `clip`), stopping early at `deadline` (a perf_counter time);
    return each step's loss."""
    opt, sched = adamw_warmup_cosine(params, lr, weight_decay, warmup, steps)
    losses: list[float] = []
    bar = tqdm(range(steps), desc=desc, unit="step", mininterval=2.0)
    for step in bar:
        if deadline is not None and time.perf_counter() > deadline:
            break
        loss = step_loss(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    return losses
