"""`targetrows train-eagle3`: an EAGLE-3 head for any Hugging Face target, trained on the target's
own replies (`targetrows.train.replies`) and written in the EAGLE checkpoint layout.

The head (`targetrows.heads.module.Eagle3Head`) reads the inputs of three target layers (2, L//2,
L-3) at position t with the embedding of token t+1 and predicts token t+2. Training follows
EAGLE-3 (and SpecForge):
- **Training-time test.** The head is unrolled `ttt_steps` times on its own outputs: step k feeds
  the previous step's output g in place of the target's features, with token t+1+k, at position
  t+k; its query sees the target-fed entries up to t and its own earlier steps at t (exactly the
  tree attention of a depth-k node at inference). Step k's loss is weighted `ttt_decay`^k.
- **Soft labels.** Cross-entropy against the target's distribution restricted to the draft
  vocabulary (renormalised), computed from the stored final hidden states: the target never runs.
- **Draft vocabulary and initialisation** (`eagle3_init`): the tokens the target ranks in its
  top few at the training reply positions, covering `coverage` of them, plus the stop tokens;
  `lm_head` starts as the target's output rows of those tokens and `norm` as its final norm,
  the layer as the target layer that reads the last feature layer (`fc` passing that feature
  through); the target's embedding is used frozen (the checkpoint holds none, like the
  published heads).
- AdamW, linear warm-up then cosine decay, gradient clipping. Seeded: the same data, config and
  thread count give the same head.

The packed batches, the unrolled forward and the loss's autograd functions are in `eagle3_step`;
here the config, the loss they make (`batch_loss`), fitting, evaluation and the command.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from targetrows.heads.module import Eagle3Head
from targetrows.hf.loading import resolve_dtype
from targetrows.hf.packed import packed_product

from .eagle3_init import coverage_of, draft_vocabulary, head_tensors, new_head, target_rows
from .eagle3_step import (
    LOSS_CHUNK,
    Batch,
    HeadLogits,
    SoftCrossEntropy,
    make_batch,
    offsets,
    step_rows,
    unrolled,
)
from .on_replies import train_on_replies
from .optimise import batch_order, optimise
from .replies import RepliesConfig, TeacherData


@dataclass
class Eagle3TrainConfig:
    seed: int = 0
    coverage: float = 0.97  # share of the target's top tokens the draft vocabulary covers
    vocab_top_k: int = 4  # ... counted among its top-k at every training reply position
    train_lm_head: bool = True  # False: lm_head stays the target's rows (with init_from_target)
    ttt_steps: int = 2  # unrolled steps per position (training-time test)
    ttt_decay: float = 0.8  # weight of step k's loss: decay ** k
    steps: int = 1240  # optimiser steps (what they cost: docs/measurements.md, the default run)
    batch_size: int = 8  # sequences per step
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.0
    clip: float = 0.5
    # Gaussian noise added to the target's features, in units of each feature's standard
    # deviation over the training positions (EAGLE trains on noised features too), against
    # over-fitting the replies it sees several times (off by default: docs/measurements.md,
    # the head trials)
    feature_noise: float = 0.0
    init_from_target: bool = True  # lm_head and norm from the target's output rows and norm
    # the layer from the target layer that reads the last feature layer (eagle3_init.py)
    init_layer: bool = True
    # drop the positions whose target argmax lies outside the draft vocabulary from the loss
    # (EAGLE's and SpecForge's `loss_mask`); off: every position teaches the renormalised row
    mask_outside_vocab: bool = False
    eval_depth: int = 4  # chain depths reported on held-out replies
    device: str = "cpu"  # where the head trains (and the target runs for replies generated now)
    autocast: str = "auto"  # dtype of the matrix products (auto: bfloat16 where it is fast)
    train_minutes: float | None = None  # stop training after this (the schedule is not rescaled)


# -- the loss ----------------------------------------------------------------------------------
def batch_loss(head, embed, batch: Batch, config: Eagle3TrainConfig, target_w: torch.Tensor,
               grad_dtype: torch.dtype = torch.float32):
    """Σ_k decay^k · soft cross-entropy of step k against the target's draft-vocabulary rows;
    the logits' backward products run in `grad_dtype`."""
    # the labels in full precision even when the head's products run in bfloat16
    with torch.no_grad(), torch.autocast(batch.hidden.device.type, enabled=False):
        target_p = packed_product(batch.hidden, target_w).softmax(-1)
    total = batch.hidden.new_zeros(())
    in_vocab = None
    if config.mask_outside_vocab:  # the rows whose target argmax the head can draft
        drafted = torch.arange(len(head.d2t), device=head.d2t.device) + head.d2t
        in_vocab = torch.isin(batch.best, drafted.to(batch.best.device))
    for k, g in unrolled(head, embed, batch, config.ttt_steps):
        mask, rows = step_rows(batch, k)
        if in_vocab is not None:
            keep = in_vocab[rows]
            mask = mask.clone()
            mask[mask.clone()] = keep
            rows = rows[keep]
        if not len(rows):
            continue
        # the logits in float32 as well: bfloat16 rounds a logit of 15 by 0.06, as much as the
        # margins the top-1 is decided by
        with torch.autocast(g.device.type, enabled=False):  # head.draft_logits, but faster
            z = HeadLogits.apply(head.norm(g[mask].float()), head.lm_head.weight, grad_dtype)
        loss = SoftCrossEntropy.apply(z, target_p, rows, LOSS_CHUNK, True)  # z: this loss's alone
        total = total + config.ttt_decay ** k * loss
    return total


# -- training and evaluation -------------------------------------------------------------------
def fit_head(head: Eagle3Head, embed, data: TeacherData, config: Eagle3TrainConfig,
             target_w: torch.Tensor, deadline: float | None = None) -> list[float]:
    """Train `head` in place; `target_w` = the target's output rows of the draft vocabulary.
    Returns the loss of each step taken."""
    f_off, h_off = offsets(data)
    gen = torch.Generator().manual_seed(config.seed)
    n = len(data.sequences)
    batch = min(config.batch_size, n)
    lengths = torch.tensor([len(s) for s in data.sequences])
    stream = batch_order(n, config.steps, batch, gen, lengths).tolist()
    head.lm_head.weight.requires_grad_(config.train_lm_head)
    params = [p for p in head.parameters() if p.requires_grad]
    dev = target_w.device
    dtype = resolve_dtype(config.autocast, str(dev))
    noise_gen = torch.Generator(device=dev).manual_seed(config.seed + 1)
    noise_scale = None
    if config.feature_noise:
        noise_scale = (config.feature_noise * feature_std(data)).to(dev)

    def step_loss(step: int) -> torch.Tensor:
        b = make_batch(data, stream[step * batch : (step + 1) * batch], config.ttt_steps,
                       f_off, h_off, dev)
        if noise_scale is not None:
            noise = torch.randn(b.features.shape, generator=noise_gen, device=dev)
            b.features.add_(noise.mul_(noise_scale))
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            return batch_loss(head, embed, b, config, target_w, dtype)

    head.train()
    losses = optimise(step_loss, params, config.lr, config.weight_decay, config.warmup,
                      config.steps, config.clip, "training head", deadline)
    head.eval()
    return losses


def feature_std(data: TeacherData, sample: int = 65536) -> torch.Tensor:
    """Each feature's standard deviation [F], over an evenly spaced sample of positions."""
    n = len(data.features)
    index = torch.linspace(0, n - 1, min(n, sample)).long()
    return data.features[index].float().std(0)


@torch.inference_mode()
def evaluate(head: Eagle3Head, embed, data: TeacherData, depth: int,
             batch_size: int = 16) -> dict:
    """On `data`'s greedy replies: step-0 top-1 agreement with the target, and the greedy
    acceptance of a chain drafted d = 1..depth tokens deep (all of its first d tokens right)."""
    f_off, h_off = offsets(data)
    dev = head.d2t.device
    draft_ids = torch.arange(len(head.d2t), device=dev) + head.d2t
    right = torch.zeros(depth, device=dev)  # chains whose first d tokens were right, by d
    counted = torch.zeros(depth, device=dev)
    for start in range(0, len(data.sequences), batch_size):
        batch = make_batch(data, list(range(start, min(start + batch_size, len(data.sequences)))),
                           depth, f_off, h_off, dev)
        chain = None
        for k, g in unrolled(head, embed, batch, depth):
            mask, rows = step_rows(batch, k)
            chain = torch.ones_like(mask) if chain is None else chain
            guess = draft_ids[head.draft_logits(g[mask]).argmax(-1)]
            hit = torch.zeros_like(chain)
            hit[mask] = guess == batch.greedy[rows]
            chain &= hit
            right[k] += chain[mask].sum()
            counted[k] += mask.sum()
    rates = (right / counted.clamp(min=1)).tolist()
    return {"top1_agreement": rates[0], "positions": int(counted[0]),
            "chain_acceptance_by_depth": rates,
            "expected_accepted_chain": float(sum(rates))}


@torch.inference_mode()
def forward_cost(target, head: Eagle3Head, context: int = 128, reps: int = 15) -> dict:
    """One head step (one new entry after `context` cached ones, its draft-vocabulary logits)
    against one cached target decode step, both batch 1, median of `reps`, both on the target's
    device (a head trained on a GPU beside a target left on the CPU is timed there too). The
    head is timed as the decoders run it by default: a copy with packed linear layers, in the
    dtype `load_pair` gives a draft (`draft_dtype_for`: bfloat16 where that is fast)."""
    from targetrows.hf.loading import draft_dtype_for, resolve_dtype
    from targetrows.hf.packed import packed_copy

    from .distill import forward_seconds

    dev = target.device
    dtype = resolve_dtype(draft_dtype_for("auto", None, str(dev)), str(dev))
    if head.d2t.device != dev:
        head = copy.deepcopy(head).to(dev)
    head = packed_copy(head, dtype)
    s = head.shape
    past = torch.randn(s.num_kv_heads, context, s.head_dim, device=dev, dtype=dtype)
    h, emb = torch.randn(2, 1, s.hidden_size, device=dev, dtype=dtype)
    allowed = torch.ones(1, context + 1, dtype=torch.bool, device=dev)[None, None]
    pos = torch.tensor([context], device=dev)
    times = []
    for _ in range(reps + 3):
        start = time.perf_counter()
        g, _, _ = head.step(h, emb, pos, past, past, allowed)
        head.draft_logits(g)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - start)
    head_s = sorted(times[3:])[reps // 2]
    target_s = forward_seconds(target, 1, context, reps)
    return {"head_step_ms": 1e3 * head_s, "target_step_ms": 1e3 * target_s,
            "ratio": head_s / target_s, "head_dtype": str(dtype).removeprefix("torch.")}


def check_replies(data: TeacherData, target) -> None:
    if data.features is None:
        raise ValueError("these replies hold no features (made with --no-features); make them "
                         "again without it for train-eagle3")
    n_layers = int(target.config.num_hidden_layers)
    if max(data.feature_layers) >= n_layers:
        raise ValueError(f"the replies' feature layers {list(data.feature_layers)} do not fit a "
                         f"target of {n_layers} layers: they were made for another target")


@dataclass
class HeadTraining:
    """`train_on_replies`'s part for an EAGLE-3 head (`targetrows.train.on_replies`)."""

    config: Eagle3TrainConfig
    data: RepliesConfig = field(default_factory=RepliesConfig)
    report_name: str = "train_eagle3_report.json"
    seed: None = None  # the head's own initialisation is seeded (`new_head`)

    @property
    def device(self) -> str:
        return self.config.device

    def build(self, target, tokenizer, train: TeacherData) -> _Head:
        from targetrows.specbench.chat import stop_ids

        check_replies(train, target)
        config = self.config
        vocab = min(len(tokenizer), int(target.config.vocab_size))
        draft_ids = draft_vocabulary(train, config.coverage, stop_ids(tokenizer, target), vocab,
                                     config.vocab_top_k)
        head, head_config = new_head(target, draft_ids, train.feature_layers,
                                     config.init_from_target, config.seed, config.init_layer)
        head.to(config.device)
        embed = target.get_input_embeddings().requires_grad_(False)
        if embed.weight.device != head.d2t.device:  # the target stayed on the CPU: a copy
            embed = copy.deepcopy(embed).to(head.d2t.device)
        return _Head(head, head_config, embed, draft_ids,
                     target_rows(target, draft_ids).to(head.d2t.device),
                     int(target.config.vocab_size))

    def fit(self, state: _Head, train: TeacherData, deadline: float | None) -> list[float]:
        return fit_head(state.head, state.embed, train, self.config, state.target_w, deadline)

    def describe(self, state: _Head, target, train: TeacherData, held: TeacherData) -> dict:
        head, embed = state.head, state.embed
        on_held = evaluate(head, embed, held, self.config.eval_depth)
        return {
            "feature_layers": list(train.feature_layers),
            "draft_vocab_size": len(state.draft_ids),
            "train_coverage": coverage_of(state.draft_ids, train),
            "heldout_coverage": coverage_of(state.draft_ids, held),
            "heldout_top1_agreement": on_held["top1_agreement"],
            "heldout_positions": on_held["positions"],
            "heldout_chain_acceptance_by_depth": on_held["chain_acceptance_by_depth"],
            "heldout_expected_accepted_chain": on_held["expected_accepted_chain"],
            "train_top1_agreement": evaluate(head, embed, train.head(len(held.sequences)),
                                             1)["top1_agreement"],
            "forward_cost": forward_cost(target, head),
            "train_dtype": str(resolve_dtype(self.config.autocast,
                                             self.config.device)).removeprefix("torch."),
        }

    def save(self, state: _Head, tokenizer, folder: Path) -> None:
        from targetrows.heads.checkpoint import write_head

        tensors = head_tensors(state.head.cpu(), state.vocab_size, state.embed.weight.cpu())
        write_head(str(folder), tensors, state.head_config)


@dataclass
class _Head:
    """A head being trained, and what its training and its checkpoint need beside it."""

    head: Eagle3Head
    head_config: dict
    embed: torch.nn.Embedding  # the target's, frozen
    draft_ids: torch.Tensor  # the draft vocabulary (target ids)
    target_w: torch.Tensor  # the target's output rows of the draft vocabulary
    vocab_size: int  # the target's


def train_eagle3(target_dir: str, out: str | Path, config: Eagle3TrainConfig,
                 replies: str | Path | None = None, data: RepliesConfig | None = None,
                 force: bool = False) -> dict:
    """Train a head for the target at `target_dir` on the replies folder `replies` (or on
    replies generated now with `data`) and write it to `out` in the EAGLE layout with its report
    (out/train_eagle3_report.json); return the report."""
    training = HeadTraining(config)
    if data is not None:
        training.data = data
    return train_on_replies(training, target_dir, out, replies, force)
