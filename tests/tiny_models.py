"""Tiny random-weight Hugging Face models and an offline tokenizer, for tests, examples and the
GPU check (no hub access): ``from tiny_models import tiny_model, save_tiny_pair``.
Weights use a large initializer range (0.3 by default) so logits are spread out and the argmax
of a row is not decided by rounding; pass ``dtype=torch.float64`` for bit-level comparisons.

The tokenizer is byte-level BPE with no merges: its 256 byte tokens encode any text, and three
ChatML special tokens give it an end-of-text token and a chat template.
"""

from __future__ import annotations

import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHS = ("llama", "qwen2", "qwen3")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_BYTES = 256
TOKENIZER_SIZE = N_BYTES + len(SPECIAL_TOKENS)  # 259
# Logit widths larger than the tokenizer, and different between target and draft, like the
# padded vocabularies of Qwen2.5 (151,936 vs 152,064 for 151,665 tokens).
TARGET_VOCAB = 272
DRAFT_VOCAB = 264

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CLASSES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def tiny_tokenizer(extra_tokens: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer over 256 bytes + ChatML specials (+ `extra_tokens`, to make a
    tokenizer that differs from the default one)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    assert len(vocab) == N_BYTES
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:] + tuple(extra_tokens)),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(
    arch: str = "llama",
    n_layers: int = 2,
    vocab_size: int = TARGET_VOCAB,
    init_range: float = 0.3,
    **overrides,
):
    """A small config of `arch` (GQA: 4 query heads, 2 KV heads, head dim 16)."""
    if arch not in _CLASSES:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {ARCHS}")
    config_cls, _ = _CLASSES[arch]
    eos = SPECIAL_TOKENS.index("<|endoftext|>") + N_BYTES
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=init_range,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    kwargs.update(overrides)
    return config_cls(**kwargs)


def tiny_model(
    arch: str = "llama",
    seed: int = 0,
    n_layers: int = 2,
    vocab_size: int = TARGET_VOCAB,
    init_range: float = 0.3,
    dtype: torch.dtype = torch.float32,
    attn: str = "sdpa",
    **overrides,
):
    """A random-weight causal LM of `arch`, deterministic in `seed`, in eval mode."""
    config = tiny_config(arch, n_layers, vocab_size, init_range, **overrides)
    model_cls = _CLASSES[arch][1]
    config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
        torch.manual_seed(seed)
        model = model_cls(config)
    # Norm weights start at 1 and biases at 0; randomise them too so every parameter matters.
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 10_000)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * init_range)
            elif name.endswith(".bias"):
                p.normal_(0.0, init_range)
    model.generation_config.eos_token_id = [config.eos_token_id, N_BYTES + 2]  # + <|im_end|>
    return model.to(dtype).eval()


def save_tiny(
    path: str | os.PathLike,
    arch: str = "llama",
    seed: int = 0,
    n_layers: int = 2,
    vocab_size: int = TARGET_VOCAB,
    dtype: torch.dtype = torch.float32,
    tokenizer: PreTrainedTokenizerFast | None = None,
    safe: bool = True,
) -> str:
    """Save a tiny model and its tokenizer to folder `path` (safetensors, or pickle `.bin`
    when ``safe=False``) and return the folder as a string."""
    path = os.fspath(path)
    model = tiny_model(arch, seed=seed, n_layers=n_layers, vocab_size=vocab_size, dtype=dtype)
    model.save_pretrained(path, safe_serialization=safe)
    if not safe:  # transformers 5 always writes safetensors; make a pickle-only folder by hand
        for name in os.listdir(path):
            if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
                os.remove(os.path.join(path, name))
        torch.save(model.state_dict(), os.path.join(path, "pytorch_model.bin"))
    (tokenizer or tiny_tokenizer()).save_pretrained(path)
    return path


def save_tiny_pair(
    tmpdir: str | os.PathLike,
    arch: str = "llama",
    dtype: torch.dtype = torch.float32,
) -> tuple[str, str]:
    """Save a 2-layer target and a 1-layer draft of `arch` sharing one tokenizer, with
    different logit widths; return (target_dir, draft_dir)."""
    tmpdir = os.fspath(tmpdir)
    target = save_tiny(os.path.join(tmpdir, f"{arch}-target"), arch, 0, 2, TARGET_VOCAB, dtype)
    draft = save_tiny(os.path.join(tmpdir, f"{arch}-draft"), arch, 1, 1, DRAFT_VOCAB, dtype)
    return target, draft


@torch.inference_mode()
def reference_logits(model, tokens) -> torch.Tensor:
    """Logits [len(tokens), logit width] of a plain causal forward, no cache: the ground truth
    that cached tree passes must reproduce."""
    ids = torch.as_tensor(list(tokens), dtype=torch.long, device=model.device)[None]
    return model(input_ids=ids, use_cache=False).logits[0]


def random_tree(rng, root: int, n_nodes: int, vocab_size: int = TOKENIZER_SIZE):
    """A random `Tree` of `n_nodes` nodes (root token `root`, distinct sibling tokens), nodes
    numbered so that parents come first."""
    from targetrows.core.tree import Tree

    tokens, parents, seen = [int(root)], [-1], set()
    while len(tokens) < n_nodes:
        parent, token = int(rng.integers(len(tokens))), int(rng.integers(vocab_size))
        if (parent, token) not in seen:
            seen.add((parent, token))
            tokens.append(token)
            parents.append(parent)
    return Tree(tokens, parents)


def save_tiny_gguf(
    folder: str | os.PathLike, seed: int = 0, n_layers: int = 2, vocab_size: int = TARGET_VOCAB
) -> str:
    """Write a tiny Qwen2 model (float32 tensors) and the tiny tokenizer as one GGUF file in
    `folder`, the way llama.cpp lays it out (token list padded to the logit width with
    ``[PADn]`` tokens), and return the file's path. Qwen2 only: llama.cpp permutes Llama's q/k
    weights, and transformers reads a Qwen3 GGUF's head size as 128."""
    import gguf

    model = tiny_model("qwen2", seed=seed, n_layers=n_layers, vocab_size=vocab_size)
    config, tokenizer = model.config, tiny_tokenizer()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(os.fspath(folder), "tiny-qwen2-f32.gguf")
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(vocab_size)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    pads = [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens + pads)
    # 1 normal, 3 control (the ChatML specials), 5 unused (padding)
    writer.add_token_types([1] * N_BYTES + [3] * len(SPECIAL_TOKENS) + [5] * len(pads))
    writer.add_token_scores([0.0] * vocab_size)  # no merges: transformers derives none
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, n_layers)
    for name, tensor in model.state_dict().items():
        module, kind = name.rsplit(".", 1)
        writer.add_tensor(f"{names.get_name(module)}.{kind}", tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
