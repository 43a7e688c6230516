"""`targetrows distill`: a small standalone draft for a target that has no small sibling.

The draft is the target cut to its first `--layers` decoder layers, with the target's final norm
and its embedding and output head copied (both frozen). The data are the target's own greedy
replies to many *different* chat prompts (`chat_prompts`); prompt variety matters more than
layers or steps. The replies (`targetrows.train.replies`, shared with `train-eagle3`) keep the
target's final hidden state and top-k tokens at every reply position: with the head shared, any
target logit is one dot product away, so the loss (KL at temperature 1 over the target's top-32
tokens plus a few thousand random ones, much cheaper than the full-vocabulary softmax) never
runs the target again. The layers train compiled (`torch.compile`), which is much faster.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .on_replies import train_on_replies
from .optimise import batch_order, optimise
from .replies import RepliesConfig, TeacherData
from .reply_generation import check_head


@dataclass
class DistillConfig:
    seed: int = 0
    layers: int = 2
    steps: int = 300
    batch_size: int = 16  # sequences per step
    lr: float = 2e-3
    warmup: int = 20
    n_random: int = 2048
    compile: bool = True
    train_minutes: float | None = None  # stop training after this (the schedule is not rescaled)


def make_draft(target, layers: int):
    """The target's first `layers` decoder layers, final norm and (frozen) embedding and head."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    if not 1 <= layers < config.num_hidden_layers:
        raise ValueError(f"--layers {layers} must be between 1 and the target's "
                         f"{config.num_hidden_layers - 1}")
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:layers])
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    prefix = f"{target.base_model_prefix}.layers."
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith(prefix) or int(k[len(prefix):].split(".")[0]) < layers}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"cannot cut the target to {layers} layers: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    draft.get_input_embeddings().weight.requires_grad_(False)
    draft.get_output_embeddings().weight.requires_grad_(False)
    return draft


def pack(data: TeacherData) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded inputs [n, L] (each sequence without its last token), the mask of reply
    positions [n, L] (position t predicts token t + 1) and row offsets into hidden/top [n + 1]."""
    width = max(len(s) for s in data.sequences) - 1
    inputs = torch.zeros((len(data.sequences), width), dtype=torch.long)
    mask = torch.zeros((len(data.sequences), width), dtype=torch.bool)
    for i, (seq, p) in enumerate(zip(data.sequences, data.prompt_lens, strict=True)):
        inputs[i, : len(seq) - 1] = torch.tensor(seq[:-1])
        mask[i, p - 1 : len(seq) - 1] = True
    offsets = torch.tensor([0, *data.reply_lens]).cumsum(0)
    return inputs, mask, offsets


def _rows(offsets: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Indices into hidden/top of the reply positions of sequences `idx`, in mask order."""
    return torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in idx.tolist()])


def subset_kl(h_s: torch.Tensor, h_t: torch.Tensor, weight: torch.Tensor, top: torch.Tensor,
              rand: torch.Tensor) -> torch.Tensor:
    """KL(target || draft) at temperature 1 over each row's `top` tokens plus the shared random
    tokens `rand` (sorted, distinct); a random token already in a row's top counts once."""
    w_top = weight[top]  # [n, k, d]
    w_rand = weight[rand]  # [r, d]
    where = torch.searchsorted(rand, top).clamp(max=len(rand) - 1)
    hits = (rand[where] == top).float()
    dup = torch.zeros(len(top), len(rand)).scatter_add_(1, where, hits) > 0

    def logits(h: torch.Tensor) -> torch.Tensor:
        # -1e4, not -inf: a zero-probability entry then adds 0 * finite to the KL, never NaN
        return torch.cat([torch.einsum("nd,nkd->nk", h, w_top),
                          (h @ w_rand.T).masked_fill(dup, -1e4)], 1)

    with torch.no_grad():
        log_t = logits(h_t).log_softmax(-1)
    log_s = logits(h_s).log_softmax(-1)
    return torch.nn.functional.kl_div(log_s, log_t, log_target=True, reduction="batchmean")


def fit_draft(draft, data: TeacherData, config: DistillConfig, vocab: int,
              deadline: float | None = None) -> list[float]:
    """Train `draft` in place on `data`; return the loss of each step taken."""
    inputs, mask, offsets = pack(data)
    weight = draft.get_output_embeddings().weight
    gen = torch.Generator().manual_seed(config.seed)
    batch = min(config.batch_size, len(inputs))
    # every batch has the same shape [batch, L], so the compiled layers compile once
    stream = batch_order(len(inputs), config.steps, batch, gen)
    body = draft.base_model
    if config.compile:
        body = torch.compile(body, dynamic=False)
    params = [p for p in draft.parameters() if p.requires_grad]

    def step_loss(step: int) -> torch.Tensor:
        idx = stream[step * batch : (step + 1) * batch]
        h_s = body(input_ids=inputs[idx], use_cache=False).last_hidden_state[mask[idx]]
        rows = _rows(offsets, idx)
        rand = torch.randperm(vocab, generator=gen)[: config.n_random].sort().values
        return subset_kl(h_s, data.hidden[rows].float(), weight, data.top[rows].long(), rand)

    draft.train()
    losses = optimise(step_loss, params, config.lr, 0.01, config.warmup, config.steps, 1.0,
                      "training draft", deadline)
    draft.eval()
    return losses


@torch.inference_mode()
def top1_agreement(draft, data: TeacherData, batch: int = 16) -> tuple[float, int]:
    """Share of reply positions where the draft's argmax is the target's greedy token (the
    draft reads the target's reply), and the number of positions."""
    inputs, mask, _ = pack(data)
    weight = draft.get_output_embeddings().weight
    pairs = zip(data.sequences, data.prompt_lens, strict=True)
    labels = torch.cat([torch.tensor(seq[p:]) for seq, p in pairs])
    preds = []
    for i in range(0, len(inputs), batch):
        h = draft.base_model(input_ids=inputs[i : i + batch], use_cache=False).last_hidden_state
        preds.append((h[mask[i : i + batch]] @ weight.T).argmax(-1))
    return float((torch.cat(preds) == labels).float().mean()), len(labels)


@torch.inference_mode()
def forward_seconds(model, block: int, context: int = 128, reps: int = 15) -> float:
    """Median time of one forward of `block` new tokens after `context` cached ones (batch 1)."""
    from targetrows.hf.hf_forward import cache_kwargs
    from targetrows.train.growing_cache import growing_cache

    ids = torch.arange(100, 100 + context + block, device=model.device)[None]
    ids = ids % model.config.vocab_size
    cache = growing_cache(model.config, context + block)
    model(input_ids=ids[:, :context], use_cache=True, **cache_kwargs(model, cache))
    times = []
    for _ in range(reps + 3):
        start = time.perf_counter()
        model(input_ids=ids[:, context:], use_cache=True, **cache_kwargs(model, cache))
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        times.append(time.perf_counter() - start)
        cache.crop(-block)
    return sorted(times[3:])[reps // 2]


def forward_cost(target, draft) -> dict[str, float]:
    """Draft / target forward time: one decode step, and a 64-token block (a tree pass). The
    draft is timed as the decoders run it by default: a copy with packed linear layers, in the
    dtype `load_pair` gives a draft (`draft_dtype_for`: bfloat16 where that is fast; the target
    from `load_target` is packed already)."""
    from targetrows.hf.loading import draft_dtype_for, resolve_dtype
    from targetrows.hf.packed import packed_copy

    device = str(draft.device)
    dtype = resolve_dtype(draft_dtype_for("auto", None, device), device)
    draft = packed_copy(draft, dtype)
    out = {"draft_dtype": str(dtype).removeprefix("torch.")}
    for name, block in [("decode_step", 1), ("block_64", 64)]:
        t, d = forward_seconds(target, block), forward_seconds(draft, block)
        out[f"{name}_target_ms"], out[f"{name}_draft_ms"] = 1e3 * t, 1e3 * d
        out[f"{name}_ratio"] = d / t
    return out


@dataclass
class DistillTraining:
    """`train_on_replies`'s part for a distilled draft (`targetrows.train.on_replies`)."""

    config: DistillConfig
    data: RepliesConfig = field(default_factory=lambda: RepliesConfig(features=False))
    report_name: str = "distill_report.json"
    device: str = "cpu"

    @property
    def seed(self) -> int:
        return self.config.seed

    def build(self, target, tokenizer, train: TeacherData):
        vocab = min(len(tokenizer), check_head(target).shape[0])
        draft = make_draft(target, self.config.layers)
        draft.generation_config = copy.deepcopy(target.generation_config)
        return draft, vocab

    def fit(self, state, train: TeacherData, deadline: float | None) -> list[float]:
        draft, vocab = state
        return fit_draft(draft, train, self.config, vocab, deadline)

    def describe(self, state, target, train: TeacherData, held: TeacherData) -> dict:
        draft, _ = state
        agreement, positions = top1_agreement(draft, held)
        return {"heldout_top1_agreement": agreement, "heldout_positions": positions,
                "train_top1_agreement": top1_agreement(draft, train.head(len(held.sequences)))[0],
                "forward_cost": forward_cost(target, draft)}

    def save(self, state, tokenizer, folder: Path) -> None:
        draft, _ = state
        draft.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


def distill(target_dir: str, out: str | Path, config: DistillConfig,
            replies: str | Path | None = None, data: RepliesConfig | None = None,
            force: bool = False) -> dict:
    """Build the draft of `target_dir` into folder `out` from the replies folder `replies` (or
    replies generated now with `data`); return the report (also out/distill_report.json)."""
    training = DistillTraining(config)
    if data is not None:
        training.data = data
    return train_on_replies(training, target_dir, out, replies, force)
