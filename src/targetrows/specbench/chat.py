"""Prompts as token ids, and where generation stops: what a tokenizer and its chat template say.

Plain calls on a Hugging Face tokenizer object (no torch), shared by every command that turns
user messages into a prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

# End-of-turn markers of common chat templates; generation stops at any of them.
END_OF_TURN = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
)


def _messages(turns) -> list[dict]:
    if isinstance(turns, str):
        turns = [turns]
    messages = []
    for i, turn in enumerate(turns):
        if isinstance(turn, str):
            messages.append({"role": "user", "content": turn})
        elif isinstance(turn, dict) and {"role", "content"} <= turn.keys():
            messages.append({"role": turn["role"], "content": turn["content"]})
        elif isinstance(turn, Sequence) and len(turn) == 2:
            messages.append({"role": str(turn[0]), "content": str(turn[1])})
        else:
            raise ValueError(f"turn {i} ({turn!r}) is not a string, (role, text) or message dict")
    if not messages:
        raise ValueError("the prompt has no turns")
    return messages


# where `set_thinking` keeps a tokenizer's choice (a tokenizer object has no place for template
# variables of its own; every prompt this package encodes goes through `encode_conversation`)
_THINKING = "targetrows_enable_thinking"


def set_thinking(tokenizer, thinking: bool | None) -> None:
    """Render this tokenizer's chat template with thinking on or off from now on: the template's
    `enable_thinking` variable (Qwen3: off writes an empty `<think></think>` block after the
    assistant header, so the reply is the answer alone; on lets the model reason first, which
    can fill a short reply with `<think>` text). None: the template's own default. Templates
    without the variable ignore it."""
    setattr(tokenizer, _THINKING, thinking)


def encode_conversation(tokenizer, conversation, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation so far (list of (role, text) or {"role", "content"}), ready
    for the assistant's next reply: the chat template when the tokenizer has one (with thinking
    as `set_thinking` chose), otherwise the texts joined by blank lines (with the tokenizer's
    BOS, if any)."""
    messages = _messages(conversation)
    if getattr(tokenizer, "chat_template", None):
        thinking = getattr(tokenizer, _THINKING, None)
        options = {} if thinking is None else {"enable_thinking": bool(thinking)}
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **options
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # BOS is in the text
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])


def encode_prompt(tokenizer, turns) -> list[int]:
    """Token ids of a prompt: a string (one user message) or a list of user messages (each a
    string) or of (role, text) pairs. For MT-bench's second turn, pass the conversation with the
    first answer in it (`encode_conversation`)."""
    return encode_conversation(tokenizer, turns)


def stop_ids(tokenizer, model=None) -> set[int]:
    """Token ids that end generation: the tokenizer's EOS, the model's (config and generation
    config, which may list several) and the chat template's end-of-turn tokens."""
    ids: set[int] = set()

    def add(value):
        if value is None:
            return
        for v in value if isinstance(value, (list, tuple, set)) else [value]:
            if v is not None and int(v) >= 0:
                ids.add(int(v))

    add(tokenizer.eos_token_id)
    hf = getattr(model, "model", model)  # an HFModel or a transformers model
    if hf is not None:
        add(getattr(getattr(hf, "generation_config", None), "eos_token_id", None))
        add(getattr(getattr(hf, "config", None), "eos_token_id", None))
    vocab = tokenizer.get_vocab()
    add([vocab[t] for t in END_OF_TURN if t in vocab])
    return ids
