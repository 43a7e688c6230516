"""The tensor work of an EAGLE-3 head's training step that reads no training config: sequences
packed into a batch (`make_batch`), the head unrolled over it on its own outputs (`unrolled`, the
training-time test), the rows each unrolled step is scored on (`step_rows`), and the two autograd
functions the loss's vocabulary-wide products go through (`HeadLogits`, `SoftCrossEntropy`).

Apart from `eagle3_train` because each piece stands alone: the tests hold each to a plain
reference (`tests/test_train_eagle3.py`: the unrolled forward to the backend's tree pass, the
rows to the positions they predict, the losses to autograd's), and `evaluate` reuses the batch
and the unrolled forward as they are. `eagle3_train` puts them together with the config
(`batch_loss`), fits the head and evaluates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from targetrows.heads.module import Eagle3Head
from targetrows.hf.packed import packed_product

from .replies import TeacherData


# -- batches -----------------------------------------------------------------------------------
@dataclass
class Batch:
    """Sequences packed for the unrolled head. Index t of row b stands for the entry pairing
    feature t with token t+1; `tokens[b, t + k]` is token t+1+k; `rows[b, t + k]` is the local
    row (into `hidden` and `greedy`) of the target's distribution at position t+1+k, or -1 when
    that position does not predict a reply token."""

    features: torch.Tensor  # [B, L, F]
    tokens: torch.Tensor  # [B, L + K]
    rows: torch.Tensor  # [B, L + K]
    hidden: torch.Tensor  # [R, d] the target's final hidden states of the local rows
    greedy: torch.Tensor  # [R] the reply token each local row predicts
    best: torch.Tensor  # [R] the target's argmax at each local row (any vocabulary id)
    roots: torch.Tensor  # [B] prompt length - 2: from this index on, an entry can be a root

    @property
    def lo(self) -> int:
        """The first index that is a root in some row: the unrolled steps start there."""
        return int(self.roots.min())


def offsets(data: TeacherData) -> tuple[list[int], list[int]]:
    """Start of each sequence's rows in `features` and in `hidden`."""
    f = [0, *torch.tensor([len(s) - 1 for s in data.sequences]).cumsum(0).tolist()]
    h = [0, *torch.tensor(data.reply_lens).cumsum(0).tolist()]
    return f, h


def make_batch(data: TeacherData, idx: list[int], k_steps: int, f_off, h_off,
               device: str | torch.device = "cpu") -> Batch:
    seqs = [data.sequences[i] for i in idx]
    width = max(len(s) - 1 for s in seqs)
    n_feat = data.features.shape[1]
    features = torch.zeros((len(idx), width, n_feat))
    tokens = torch.zeros((len(idx), width + k_steps), dtype=torch.long)
    rows = torch.full((len(idx), width + k_steps), -1, dtype=torch.long)
    hidden, greedy, best, roots, local = [], [], [], [], 0
    for b, (i, seq) in enumerate(zip(idx, seqs, strict=True)):
        n, p = len(seq), data.prompt_lens[i]
        features[b, : n - 1] = data.features[f_off[i] : f_off[i] + n - 1].float()
        tokens[b, : n - 1] = torch.tensor(seq[1:])
        m = n - p  # reply rows: positions p-1 .. n-2, at index t + k = position - 1
        first = max(p - 2, 0)  # a 1-token prompt: no entry predicts the first reply token
        rows[b, first : n - 2] = torch.arange(local + first - (p - 2), local + m)
        hidden.append(data.hidden[h_off[i] : h_off[i] + m])
        greedy.append(torch.tensor(seq[p:]))
        best.append(data.top[h_off[i] : h_off[i] + m, 0].long())
        roots.append(first)
        local += m
    return Batch(features.to(device), tokens.to(device), rows.to(device),
                 torch.cat(hidden).float().to(device), torch.cat(greedy).to(device),
                 torch.cat(best).to(device), torch.tensor(roots, device=device))


# -- the unrolled head -------------------------------------------------------------------------
def unrolled(head: Eagle3Head, embed: torch.nn.Embedding, batch: Batch, k_steps: int):
    """Yield (k, g [B, L - lo, H]) for k = 0..k_steps-1: the head's outputs at indices lo..L-1
    when it is unrolled on its own outputs (the training-time test), batched over sequences.
    Step 0 runs at every index (its entries are what later queries attend to); later steps only
    where a tree can be rooted (index >= prompt length - 2), as at inference."""
    s = head.shape
    n_b, width = batch.features.shape[:2]
    scale = 1.0 / math.sqrt(s.head_dim)
    group = s.num_heads // s.num_kv_heads
    dev, lo = batch.features.device, batch.lo
    causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
    h = head.project(batch.features)
    keys, values = [], []
    for k in range(k_steps):
        start = 0 if k == 0 else lo  # the indices this step runs at
        n_q = width - start
        emb = embed(batch.tokens[:, start + k : width + k]).float()
        pos = (torch.arange(start, width, device=dev) + k).expand(n_b, n_q)
        q, kk, vv, residual = head.attention_inputs(h, emb, pos)
        # step 0's keys span every index; a later step's, indices lo.. (seen only at their own)
        keys.append(kk.repeat_interleave(group, 1))
        values.append(vv.repeat_interleave(group, 1))
        # step 0's entries up to t (causal), then this index's own earlier steps (diagonal)
        scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal[start:],
                                                                      float("-inf"))]
        scores += [(q * key).sum(-1, keepdim=True) * scale for key in keys[1:k + 1]]
        probs = torch.cat(scores, -1).softmax(-1)
        out = probs[..., :width] @ values[0]
        for j, value in enumerate(values[1:k + 1]):
            out = out + probs[..., width + j : width + j + 1] * value
        g = head.layer_output(residual, out.transpose(1, 2).flatten(2))[:, lo - start:]
        yield k, g
        h = head.fed_back(g)


def step_rows(batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask [B, L - lo] of the indices lo.. whose step-k prediction is a reply token of a tree
    rooted there, their local rows)."""
    width = batch.features.shape[1]
    rows = batch.rows[:, batch.lo + k : width + k]
    index = torch.arange(batch.lo, width, device=rows.device)
    mask = (rows >= 0) & (index >= batch.roots[:, None])
    return mask, rows[mask]


# -- the loss's autograd functions -------------------------------------------------------------
LOSS_CHUNK = 512  # rows of the soft cross-entropy at a time (`SoftCrossEntropy`)


class SoftCrossEntropy(torch.autograd.Function):
    """mean over i of -Σ_v p_i · log_softmax(z_i), p_i = `target_p[rows[i]]`, computed as
    logsumexp(z_i) - p_i·z_i (Σ p_i = 1), with the gradient softmax(z_i) - p_i.

    The rows are as wide as the draft vocabulary, so these passes are memory-bound. Going
    through `chunk` rows at a time keeps every temporary small and warm, and the labels are
    gathered per chunk rather than copied whole: cheaper than autograd's log_softmax, exp and
    product over whole rows, which the allocator maps and faults in afresh every time. For the
    same reason, with `own_logits` (z is an intermediate that nothing else reads) the gradient
    is written over z rather than into a fresh buffer as large (a tenth of a training step on
    2 CPU cores; the same numbers)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, target_p: torch.Tensor, rows: torch.Tensor,
                chunk: int = LOSS_CHUNK, own_logits: bool = False) -> torch.Tensor:
        ctx.save_for_backward(z, target_p, rows)
        ctx.chunk, ctx.own_logits = chunk, own_logits
        total = target_p.new_zeros(())  # in the labels' precision, whatever z's
        for a in range(0, len(z), chunk):
            zc, pc = z[a : a + chunk].to(target_p.dtype), target_p[rows[a : a + chunk]]
            total += (zc.logsumexp(-1) - torch.linalg.vecdot(pc, zc)).sum()
        return total / len(z)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        z, target_p, rows = ctx.saved_tensors
        dz = z if ctx.own_logits else torch.empty_like(z)
        scale, chunk = grad / len(z), ctx.chunk
        for a in range(0, len(z), chunk):  # chunk by chunk: each is read before it is written
            pc = target_p[rows[a : a + chunk]]
            dz[a : a + chunk] = z[a : a + chunk].to(pc.dtype).softmax(-1).sub_(pc).mul_(scale)
        return dz, None, None, None, None


class HeadLogits(torch.autograd.Function):
    """The head's logits ``x @ w.T`` in x's dtype, with their two backward products in
    `grad_dtype`.

    These products are as wide as the draft vocabulary and were most of an iteration on a CPU.
    The logits stay float32 (see `eagle3_train.batch_loss`), through a packed copy of w on a CPU
    (`packed_product`: less than half the time of torch's own float32 product); their gradients
    need no such precision, and in bfloat16 the two backward products cost a quarter of
    float32's on a CPU with AVX512-BF16."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, grad_dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.grad_dtype = grad_dtype
        return packed_product(x, w)

    @staticmethod
    def backward(ctx, dz: torch.Tensor):
        x, w = ctx.saved_tensors
        dz_low = dz.to(ctx.grad_dtype)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = (dz_low @ w.to(ctx.grad_dtype)).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = (dz_low.T @ x.to(ctx.grad_dtype)).to(w.dtype)
        return dx, dw, None
