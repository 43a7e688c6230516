"""Training prompts the target writes itself: user turns sampled from its own chat template.

An instruction-tuned model given its chat template up to the start of a user message (the
system turn, then the user header, nothing after) writes a plausible user request, because
that is what followed the header in everything it was tuned on. This is Magpie's recipe (Xu et
al., 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with
Nothing"). The requests cover whatever the target was tuned to answer, in its users' wordings,
where the templates of `chat_prompts` cover only the kinds of request written into them: a head
trained on template prompts agrees with the target far more often on unseen template prompts
than on hand-written ones, so the wordings, not the amount of data, were what it lacked.

Sampling is plain (temperature 1, the whole distribution, as Magpie does), batched with one KV
cache, seeded. A turn that does not end within `max_tokens` is dropped (it was a passage or a
list running on, not a request), and so are empty turns and repeats.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

_MARK = "\u2063TARGETROWS_USER_TURN\u2063"  # a placeholder no tokenizer merges with its neighbours


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user message's text starts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-written prompts need a chat template: this tokenizer has none; "
                         "use template prompts only (--self-prompts 0)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False,
                                         add_generation_prompt=False)
    if _MARK not in text:
        raise ValueError("the chat template does not place the user's text verbatim; use "
                         "template prompts only (--self-prompts 0)")
    return list(tokenizer(text[: text.index(_MARK)], add_special_tokens=False)["input_ids"])


def sample_rows(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs` [n, vocab], drawn by inverse transform sampling: one
    uniform per row against the row's cumulative sum (in float64, so a token's share is its
    probability to rounding). torch.multinomial draws the same distribution, but on a CPU at a
    batch of a hundred rows over a vocabulary of tens of thousands it took most of a batched
    generation step."""
    cdf = probs.double().cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64,
                   device=probs.device) * cdf[:, -1:]
    # right=True: the first token whose cdf exceeds u, so a zero-probability token is never drawn
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=probs.shape[-1] - 1)


@torch.inference_mode()
def sample_turns(model, prefix: list[int], n: int, max_tokens: int, stop: set[int],
                 generator: torch.Generator) -> list[list[int] | None]:
    """`n` sampled continuations of `prefix` (one batch, one KV cache), each up to its first
    stop token (excluded); None for a row that reached `max_tokens` without one."""
    from targetrows.hf.hf_forward import cache_kwargs
    from targetrows.train.batched_attention import batched_attention
    from targetrows.train.growing_cache import growing_cache

    # a model spread over GPUs reads on its embedding's card; rows are drawn on its head's
    dev, into = model.get_output_embeddings().weight.device, model.get_input_embeddings().weight.device
    ids = torch.tensor(prefix, device=into).repeat(n, 1)
    cache = growing_cache(model.config, len(prefix) + max_tokens)
    with batched_attention(model):  # unmasked one-token passes: not torch's fused kernel
        # logits of the last position only: a batch of full prefixes would be n x len x vocab
        logits = model(input_ids=ids, use_cache=True, logits_to_keep=1,
                       **cache_kwargs(model, cache)).logits[:, -1].to(dev)
        stop_t = torch.tensor(sorted(stop), dtype=torch.long, device=dev)
        alive = torch.arange(n, device=dev)
        turns: list[list[int] | None] = [None] * n
        picked = []  # per step: (rows alive, their tokens)
        for _ in range(max_tokens):
            probs = torch.softmax(logits.float(), dim=-1)
            nxt = sample_rows(probs, generator)
            picked.append((alive, nxt))
            ended = torch.isin(nxt, stop_t)
            for row in alive[ended].tolist():
                turns[row] = []  # filled below from `picked`
            keep = ~ended
            if not keep.any():
                break
            if not keep.all():
                cache.reorder_cache(keep.nonzero()[:, 0])
                alive, nxt = alive[keep], nxt[keep]
            logits = model(input_ids=nxt[:, None].to(into), use_cache=True,
                           **cache_kwargs(model, cache)).logits[:, -1].to(dev)
    for rows, tokens in picked:
        for row, tok in zip(rows.tolist(), tokens.tolist(), strict=True):
            if turns[row] is not None and tok not in stop:
                turns[row].append(tok)
    return turns


def self_prompts(model, tokenizer, n: int, seed: int, stop: set[int], max_tokens: int = 64,
                 batch: int = 128, exclude: set[str] = frozenset()) -> list[str]:
    """`n` distinct user requests written by `model` (a transformers causal LM) from its chat
    template, none in `exclude`; the same model, seed, arguments and thread count give the same
    list."""
    prefix = user_turn_prefix(tokenizer)
    dev = model.get_output_embeddings().weight.device
    generator = torch.Generator(device=dev).manual_seed(seed)
    seen, out = set(exclude), []
    bar = tqdm(total=n, desc="self-written prompts", unit="prompt", mininterval=2.0)
    tries = 0
    while len(out) < n:
        if tries >= 4 * n + batch:
            raise ValueError(f"the target wrote only {len(out)} distinct finished user turns in "
                             f"{tries} tries; lower --self-prompts (0: template prompts only)")
        for turn in sample_turns(model, prefix, batch, max_tokens, stop, generator):
            tries += 1
            text = None if turn is None else tokenizer.decode(turn, skip_special_tokens=True).strip()
            if text and text not in seen and len(out) < n:
                seen.add(text)
                out.append(text)
                bar.update(1)
        bar.set_postfix(sampled=tries)  # the rest ran past max_tokens or repeated a request
    bar.close()
    return out
