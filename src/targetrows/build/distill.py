"""`targetrows distill`: a small standalone draft for a target that has no small sibling.

The draft is the target cut to its first `--layers` decoder layers, with the target's final norm
and its embedding and output head copied (both frozen). The data are the target's own greedy
replies to many *different* chat prompts (`chat_prompts`); prompt variety matters more than
layers or steps. Generation keeps the target's final hidden state and top-k tokens at every reply
position: with the head shared, any target logit is one dot product away, so the loss (KL at
temperature 1 over the target's top-32 tokens plus ~2,048 random ones; the full-vocabulary
softmax was 7x slower) never runs the target again. The compiled layers train ~4.5x faster.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .chat_prompts import HELDOUT_PROMPTS, training_prompts
from .embedded import replace_folder


@dataclass
class DistillConfig:
    seed: int = 0
    layers: int = 2
    prompts: int = 1024  # distinct training prompts (each one greedy reply)
    heldout: int = len(HELDOUT_PROMPTS)
    max_new_tokens: int = 112
    gen_batch: int = 128
    steps: int = 300
    batch_size: int = 16  # sequences per step
    lr: float = 2e-3
    warmup: int = 20
    top_k: int = 32
    n_random: int = 2048
    compile: bool = True
    data_minutes: float | None = None  # stop starting new generation batches after this
    train_minutes: float | None = None  # stop training after this (the schedule is not rescaled)


@dataclass
class TeacherData:
    """The target's greedy replies: `sequences[i]` = prompt + reply; for the reply positions of
    all sequences in order, the target's final hidden state (fp16) and its top-k token ids."""

    sequences: list[list[int]]
    prompt_lens: list[int]
    hidden: torch.Tensor  # [rows, d]
    top: torch.Tensor  # [rows, k] int32, best first (column 0: the greedy token, barring ties)

    @property
    def reply_lens(self) -> list[int]:
        return [len(s) - p for s, p in zip(self.sequences, self.prompt_lens, strict=True)]

    def head(self, n: int) -> TeacherData:
        rows = sum(self.reply_lens[:n])
        return TeacherData(self.sequences[:n], self.prompt_lens[:n], self.hidden[:rows],
                           self.top[:rows])


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


def check_head(model) -> torch.Tensor:
    """The output head's weight; the loss needs logits = hidden @ weight.T exactly."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None or getattr(model.config, "final_logit_softcapping",
                                                          None):
        raise ValueError("distill needs a target whose logits are a plain linear map of the final "
                         "hidden state (no head bias, no logit soft-capping)")
    return head.weight


@torch.inference_mode()
def generate_batch(model, prompts: list[list[int]], max_new: int, stop: set[int], top_k: int):
    """Greedy replies to `prompts` (left-padded, one KV cache); finished rows leave the batch.
    Returns per prompt (reply ids, hidden [len, d] fp16, top [len, k])."""
    from transformers import DynamicCache

    base, weight = model.base_model, check_head(model)
    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    hidden = base(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                  use_cache=True).last_hidden_state[:, -1]
    pos, alive, stop_t = pos[:, -1:], torch.arange(n), torch.tensor(sorted(stop))
    rows, hs, tops, toks = [], [], [], []
    for step in range(max_new):
        logits = hidden.float() @ weight.T
        nxt = logits.argmax(-1)  # the greedy token is also the label at this position
        rows.append(alive)
        hs.append(hidden.half())
        tops.append(logits.topk(top_k).indices.int())
        toks.append(nxt)
        keep = ~torch.isin(nxt, stop_t)
        if step == max_new - 1 or not keep.any():
            break
        if not keep.all():
            cache.reorder_cache(keep.nonzero()[:, 0])
            alive, nxt, mask, pos = alive[keep], nxt[keep], mask[keep], pos[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        pos = pos + 1
        hidden = base(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, cache=cache,
                      use_cache=True).last_hidden_state[:, -1]
    # records are step-major; regroup them prompt by prompt
    rows_t = torch.cat(rows)
    steps_t = torch.cat([torch.full_like(r, s) for s, r in enumerate(rows)])
    order = torch.argsort(rows_t * (max_new + 1) + steps_t)
    counts = torch.bincount(rows_t, minlength=n).tolist()
    return list(zip(torch.cat(toks)[order].split(counts), torch.cat(hs)[order].split(counts),
                    torch.cat(tops)[order].split(counts), strict=True))


def teacher_data(model, prompts: list[list[int]], config: DistillConfig, stop: set[int],
                 desc: str, deadline: float | None = None) -> TeacherData:
    """The target's greedy replies to `prompts`, in batches of similar length (sorted), in the
    prompts' order; prompts not reached before `deadline` (perf_counter) are left out."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    done: dict[int, tuple] = {}
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", mininterval=2.0)
    for start in range(0, len(order), config.gen_batch):
        if deadline is not None and time.perf_counter() > deadline:
            break
        chunk = order[start:start + config.gen_batch]
        out = generate_batch(model, [prompts[i] for i in chunk], config.max_new_tokens, stop,
                             config.top_k)
        done.update(zip(chunk, out, strict=True))
        bar.update(len(chunk))
        bar.set_postfix(tokens=sum(len(v[0]) for v in done.values()))
    bar.close()
    kept = sorted(done)
    return TeacherData(
        sequences=[prompts[i] + done[i][0].tolist() for i in kept],
        prompt_lens=[len(prompts[i]) for i in kept],
        hidden=torch.cat([done[i][1] for i in kept]),
        top=torch.cat([done[i][2] for i in kept]),
    )


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


def train(draft, data: TeacherData, config: DistillConfig, vocab: int,
          deadline: float | None = None) -> list[float]:
    """Train `draft` in place on `data`; return the loss of each step taken."""
    inputs, mask, offsets = pack(data)
    weight = draft.get_output_embeddings().weight
    gen = torch.Generator().manual_seed(config.seed)
    batch = min(config.batch_size, len(inputs))
    # every batch has the same shape [batch, L], so the compiled layers compile once
    stream = torch.cat([torch.randperm(len(inputs), generator=gen)
                        for _ in range(math.ceil(config.steps * batch / len(inputs)))])
    body = draft.base_model
    if config.compile:
        body = torch.compile(body, dynamic=False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)
    warmup, total = max(1, config.warmup), config.steps

    def schedule(step: int) -> float:  # linear warm-up, then cosine to zero
        return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    draft.train()
    losses: list[float] = []
    bar = tqdm(range(config.steps), desc="training draft", unit="step", mininterval=2.0)
    for step in bar:
        if deadline is not None and time.perf_counter() > deadline:
            break
        idx = stream[step * batch : (step + 1) * batch]
        h_s = body(input_ids=inputs[idx], use_cache=False).last_hidden_state[mask[idx]]
        rows = _rows(offsets, idx)
        rand = torch.randperm(vocab, generator=gen)[: config.n_random].sort().values
        loss = subset_kl(h_s, data.hidden[rows].float(), weight, data.top[rows].long(), rand)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
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
    from transformers import DynamicCache

    ids = torch.arange(100, 100 + context + block)[None] % model.config.vocab_size
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context], cache=cache, use_cache=True)
    times = []
    for _ in range(reps + 3):
        start = time.perf_counter()
        model(input_ids=ids[:, context:], cache=cache, use_cache=True)
        times.append(time.perf_counter() - start)
        cache.crop(-block)
    return sorted(times[3:])[reps // 2]


def forward_cost(target, draft) -> dict[str, float]:
    """Draft / target forward time: one decode step, and a 64-token block (a tree pass)."""
    out = {}
    for name, block in [("decode_step", 1), ("block_64", 64)]:
        t, d = forward_seconds(target, block), forward_seconds(draft, block)
        out[f"{name}_target_ms"], out[f"{name}_draft_ms"] = 1e3 * t, 1e3 * d
        out[f"{name}_ratio"] = d / t
    return out


def distill(target_dir: str, out: str | Path, config: DistillConfig, force: bool = False) -> dict:
    """Build the draft of `target_dir` into folder `out`; return the report (also written to
    out/distill_report.json)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from targetrows.decoding.chat import encode_prompt, stop_ids

    out = Path(out)
    if out.exists() and not force:
        raise ValueError(f"{out} already exists; pass --force to replace it")
    if not 1 <= config.heldout <= len(HELDOUT_PROMPTS):
        raise ValueError(f"--heldout must be between 1 and {len(HELDOUT_PROMPTS)}")
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    weight = check_head(target)
    stop = stop_ids(tokenizer, target)
    vocab = min(len(tokenizer), weight.shape[0])

    train_ids = [encode_prompt(tokenizer, p) for p in training_prompts(config.prompts, config.seed)]
    held_ids = [encode_prompt(tokenizer, p) for p in HELDOUT_PROMPTS[: config.heldout]]
    cap = None if config.data_minutes is None else start + 60 * config.data_minutes
    train_data = teacher_data(target, train_ids, config, stop, "target replies", cap)
    held_data = teacher_data(target, held_ids, config, stop, "held-out replies")
    data_s = time.perf_counter() - start
    print(f"distill: {len(train_data.sequences)} replies, {len(train_data.hidden)} positions in "
          f"{data_s:.0f} s", file=sys.stderr)

    draft = make_draft(target, config.layers)
    draft.generation_config = copy.deepcopy(target.generation_config)
    train_start = time.perf_counter()
    cap = None if config.train_minutes is None else train_start + 60 * config.train_minutes
    losses = train(draft, train_data, config, vocab, cap)
    train_s = time.perf_counter() - train_start

    held, held_n = top1_agreement(draft, held_data)
    report = {
        "target": str(target_dir), "config": asdict(config),
        "heldout_top1_agreement": held, "heldout_positions": held_n,
        "train_top1_agreement": top1_agreement(draft, train_data.head(config.heldout))[0],
        "train_prompts": len(train_data.sequences), "train_positions": len(train_data.hidden),
        "steps_done": len(losses), "loss_first": losses[0] if losses else None,
        "loss_last": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "forward_cost": forward_cost(target, draft),
        "data_seconds": data_s, "train_seconds": train_s,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    report["total_seconds"] = time.perf_counter() - start

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        draft.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "distill_report.json").write_text(json.dumps(report, indent=2) + "\n")
        replace_folder(tmp, out, force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return report
