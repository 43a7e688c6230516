"""The baselines `targetrows bench` times our decoders against: the target's own Hugging Face
`generate()` (greedy, or pure sampling), assisted generation with a standalone draft as
assistant, and prompt lookup decoding (candidates copied from the context, no draft at all), set
up to do the same work as our decoders (same stop tokens, same vocabulary)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from targetrows.core.rows import greedy

HF_METHODS = ("hf_generate", "hf_assisted", "hf_prompt_lookup")
# Prompt lookup matches the last 1..N tokens against the context and proposes what followed the
# match. 2 is transformers' own default (`max_matching_ngram_size or 2`); pinned here so that a
# change of that default cannot change what the report measures.
PROMPT_LOOKUP_NGRAM = 2


def assistant_for(target_hf, draft_hf, vocab_size: int):
    """The draft as transformers' assisted generation wants it: the target's logit width.

    transformers switches to universal assisted decoding (text re-tokenised every round) when
    the config vocab sizes differ, although target and draft share one tokenizer and differ only
    by padding rows. A copy of the draft with its embedding and head resized to the target's
    width, where the rows beyond the shared vocabulary carry a -1e4 bias (never proposed), keeps
    the plain assisted path; the draft itself is left untouched.
    """
    import torch

    width = int(target_hf.get_output_embeddings().weight.shape[0])
    if (
        int(draft_hf.get_output_embeddings().weight.shape[0]) == width
        and draft_hf.config.get_text_config().vocab_size
        == target_hf.config.get_text_config().vocab_size
    ):
        return draft_hf
    assistant = copy.deepcopy(draft_hf)
    assistant.config.tie_word_embeddings = False
    assistant.resize_token_embeddings(width, mean_resizing=False)
    old = assistant.get_output_embeddings()
    head = torch.nn.Linear(
        old.in_features, width, bias=True, dtype=old.weight.dtype, device=old.weight.device
    )
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[vocab_size:] = -1e4
    assistant.set_output_embeddings(head)
    assistant.config.get_text_config().vocab_size = width
    return assistant.eval()


def hf_generate(
    model,
    prompt_ids: Sequence[int],
    temperature: float,
    max_new_tokens: int,
    stop_ids,
    seed: int,
    vocab_size: int,
    assistant=None,
    prompt_lookup_tokens: int | None = None,
) -> list[int]:
    """New tokens of the target's own `generate()`, assisted by `assistant` or by prompt lookup
    with `prompt_lookup_tokens` candidates a round: greedy at temperature 0, else pure sampling
    (no top-k / top-p), stopping where our decoders stop.

    Prompt lookup samples too: its candidates carry no probabilities, so transformers samples
    every position from the target and keeps candidates up to the first mismatch, which leaves
    the target's distribution unchanged."""
    import torch

    if assistant is not None and prompt_lookup_tokens is not None:
        raise ValueError("give an assistant model or prompt_lookup_tokens, not both: "
                         "transformers runs one candidate generator per generate() call")

    ids = torch.tensor([list(prompt_ids)], device=model.get_input_embeddings().weight.device)
    kwargs = _generate_kwargs(model, temperature, max_new_tokens, stop_ids, vocab_size)
    kwargs["attention_mask"] = torch.ones_like(ids)
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if prompt_lookup_tokens is not None:
        kwargs.update(prompt_lookup_num_tokens=prompt_lookup_tokens,
                      max_matching_ngram_size=PROMPT_LOOKUP_NGRAM)
    return _generate(model, ids, kwargs, seed)[0]


def _generate_kwargs(model, temperature: float, max_new_tokens: int, stop_ids,
                     vocab_size: int) -> dict:
    """`generate()`'s settings for our decoders' work: greedy at temperature 0, else pure
    sampling, stopping at the stop tokens, never emitting a token past `vocab_size`."""
    width = int(model.get_output_embeddings().weight.shape[0])
    stops = sorted(stop_ids)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not greedy(temperature),
                  eos_token_id=stops or None, pad_token_id=stops[0] if stops else 0)
    if not greedy(temperature):
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    if width > vocab_size:  # random weights can pick padding rows, which our rows leave out
        kwargs["suppress_tokens"] = list(range(vocab_size, width))
    return kwargs


def _generate(model, ids, kwargs: dict, seed: int) -> list[list[int]]:
    """Each row's new tokens from `model.generate(ids, **kwargs)`, seeded."""
    import torch

    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    return out[:, ids.shape[1] :].tolist()


def hf_generate_batch(
    model,
    prompts: Sequence[Sequence[int]],
    temperature: float,
    max_new_tokens: int,
    stop_ids,
    seed: int,
    vocab_size: int,
) -> list[list[int]]:
    """New tokens of the target's own batched `generate()` over `prompts` at once (left-padded,
    with their attention mask), each cut after its first stop token, as our decoders stop:
    greedy at temperature 0, else pure sampling. Hugging Face runs the batch until its last
    sequence stops, and padding changes the rows' rounding: in reduced precision a padded
    sequence can part from its unpadded greedy tokens at a near-tie."""
    import torch

    device = model.get_input_embeddings().weight.device
    kwargs = _generate_kwargs(model, temperature, max_new_tokens, stop_ids, vocab_size)
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), kwargs["pad_token_id"], dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(list(p))
        mask[i, longest - len(p):] = 1
    kwargs["attention_mask"] = mask.to(device)
    cut = []
    for tokens in _generate(model, ids.to(device), kwargs, seed):
        ends = [i for i, t in enumerate(tokens) if t in stop_ids]
        cut.append(tokens[: ends[0] + 1] if ends else tokens)
    return cut
