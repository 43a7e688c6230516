"""The target's replies to a batch of prompts in one pass (`generate_batch`): the prompts
left-padded in one KV cache, then one token per step for the rows still replying, a finished row
leaving the batch and its cache rows. Kept on the way, at no extra forward: each labelled
position's final hidden state (fp16) and top-k ids, and the inputs of the feature layers at every
position fed (`layer_inputs`).

Apart from `replies`, which decides what is generated (which prompts, how many, in which dtype,
on which device) and stores it, because this is the loop that runs the target token by token:
its bookkeeping (`_left_padded`, `_reply_steps`, `_by_row`) is about batching and the cache, not
about the data. `check_head` is here because the hidden states kept stand for the logits only
when the output head is a plain linear map; the trainings check it before they start too.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .self_prompts import sample_rows


def check_head(model) -> torch.Tensor:
    """The output head's weight; both trainings need logits = hidden @ weight.T exactly."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None or getattr(model.config, "final_logit_softcapping",
                                                          None):
        raise ValueError("training from replies needs a target whose logits are a plain linear "
                         "map of the final hidden state (no head bias, no logit soft-capping)")
    return head.weight


@contextmanager
def layer_inputs(model, layer_ids: Sequence[int]):
    """Within the block, `store[i]` holds the input of decoder layer i in the latest forward."""
    store: dict[int, torch.Tensor] = {}
    layers = model.get_decoder().layers

    def grabber(i):
        def grab(module, args, kwargs):
            store[i] = args[0] if args else kwargs["hidden_states"]
        return grab

    handles = [layers[i].register_forward_pre_hook(grabber(i), with_kwargs=True)
               for i in sorted(set(layer_ids))]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


@torch.inference_mode()
def generate_batch(model, prompts: list[list[int]], max_new: int, stop: set[int], top_k: int,
                   feature_layers: Sequence[int] = (), label_from: Sequence[int] | None = None,
                   sampler: torch.Generator | None = None):
    """Greedy replies to `prompts` (left-padded, one KV cache), or with `sampler` replies
    sampled at temperature 1 from it; finished rows leave the batch.
    Returns per prompt (reply ids, hidden [len, d] fp16, top [len, k], features or None), the
    features [prompt + reply - 1, len(feature_layers) * d] for every position fed. hidden and
    top start at position `label_from[i]` of prompt i (default: its last position, whose next
    token is the reply's first)."""
    from targetrows.hf.hf_forward import cache_kwargs
    from targetrows.train.growing_cache import growing_cache

    check_head(model)
    base, head = model.base_model, model.get_output_embeddings()  # logits: head(hidden)
    n, width = len(prompts), max(len(p) for p in prompts)
    label_from = [len(p) - 1 for p in prompts] if label_from is None else label_from
    # a model spread over GPUs reads its inputs on its embedding's card and gives its rows on
    # its head's; the bookkeeping stays on the head's (one device: no copies at all)
    dev, into = head.weight.device, model.get_input_embeddings().weight.device
    ids, mask, pos = _left_padded(prompts, width, dev)
    cache = growing_cache(model.config, width + max_new)
    with layer_inputs(model, feature_layers) as store:

        def grab() -> torch.Tensor | None:  # the fed positions' features, layers concatenated
            if not feature_layers:
                return None
            return torch.cat([store[i].to(dev) for i in feature_layers], -1).half()

        def run(ids, mask, pos) -> torch.Tensor:  # the last layer's output states
            return base(input_ids=ids.to(into), attention_mask=mask.to(into),
                        position_ids=pos.to(into), use_cache=True,
                        **cache_kwargs(base, cache)).last_hidden_state.to(dev)

        states = run(ids, mask, pos)
        hidden, prefill = states[:, -1], grab()
        # the prompts' own labelled positions (before the last), row by row: logits are wide
        early = [states[i, width - len(p) + label_from[i] : -1] for i, p in enumerate(prompts)]
        early = [(h.half().cpu(), head(h).float().topk(top_k).indices.int().cpu())
                 for h in early]

        def step(nxt, mask, pos):  # one token per live row: the next hidden state
            return run(nxt[:, None], mask, pos)[:, -1]

        steps = _reply_steps(head, step, cache, hidden, mask, pos[:, -1:], stop, max_new, top_k,
                             sampler, grab if feature_layers else None)
    replies = [(t, torch.cat([e[0], h]), torch.cat([e[1], k])) for t, h, k, e in zip(
        *_by_row([steps.toks, steps.hidden, steps.tops], steps.rows, n, max_new), early,
        strict=True)]
    if not feature_layers:
        return [(*r, None) for r in replies]
    # a reply of m tokens fed its first m - 1 (step s feeds the token chosen at step s)
    prefill = prefill.cpu()
    tail, = _by_row([steps.feats], steps.rows[1: 1 + len(steps.feats)], n, max_new,
                    empty=prefill[:0, 0])
    return [(*r, torch.cat([prefill[i, width - len(prompts[i]):], tail[i]]))
            for i, r in enumerate(replies)]


def _left_padded(prompts: list[list[int]], width: int, device):
    """(ids, attention mask, positions) [n, width] of the prompts padded on the left."""
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@dataclass
class _Steps:
    """What each generation step recorded, step-major, on the CPU: the rows alive at it, their
    hidden states (fp16), top-k ids, chosen tokens, and the features of the tokens fed."""

    rows: list
    hidden: list
    tops: list
    toks: list
    feats: list


def _reply_steps(head, step, cache, hidden, mask, pos, stop: set[int], max_new: int,
                 top_k: int, sampler, grab) -> _Steps:
    """Generate from the prefill's last hidden states until every row has stopped or
    `max_new` steps: each step's token (greedy, or drawn with `sampler`), the rows still alive
    feeding theirs through `step`; a finished row leaves the batch and its cache rows."""
    dev = hidden.device
    alive = torch.arange(hidden.shape[0], device=dev)
    stop_t = torch.tensor(sorted(stop), dtype=torch.long, device=dev)
    rows, hs, tops, toks, feats = [], [], [], [], []
    for i in range(max_new):
        logits = head(hidden).float()
        if sampler is None:  # the greedy token is also the label at this position
            nxt = logits.argmax(-1)
        else:
            nxt = sample_rows(logits.softmax(-1), sampler)
        rows.append(alive)
        hs.append(hidden.half())
        tops.append(logits.topk(top_k).indices.int())
        toks.append(nxt)
        keep = ~torch.isin(nxt, stop_t)
        if i == max_new - 1 or not keep.any():
            break
        if not keep.all():
            cache.reorder_cache(keep.nonzero()[:, 0])
            alive, nxt, mask, pos = alive[keep], nxt[keep], mask[keep], pos[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        pos = pos + 1
        hidden = step(nxt, mask, pos)
        if grab is not None:
            feats.append(grab()[:, 0])
    cpu = [[t.cpu() for t in part] for part in (rows, hs, tops, toks, feats)]
    return _Steps(*cpu)


def _by_row(parts: list[list[torch.Tensor]], rows: list[torch.Tensor], n: int, max_new: int,
            empty: torch.Tensor | None = None) -> list[tuple[torch.Tensor, ...]]:
    """Step-major records regrouped row by row: for each of `parts` (a list of per-step
    tensors aligned with `rows`, the rows alive at each step), a tuple of n tensors, row i's
    records in step order (`empty` stands for a part with no steps at all)."""
    if not rows:
        return [tuple(empty for _ in range(n)) for _ in parts]
    rows_t = torch.cat(rows)
    steps_t = torch.cat([torch.full_like(r, s) for s, r in enumerate(rows)])
    order = torch.argsort(rows_t * (max_new + 1) + steps_t)
    counts = torch.bincount(rows_t, minlength=n).tolist()
    return [tuple(torch.cat(part)[order].split(counts)) for part in parts]
