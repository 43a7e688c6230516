"""Loading tiny saved models, the tokenizer check, prompt encoding and stop tokens."""

from __future__ import annotations

import argparse
import os

import numpy as np
import pytest
import torch
from tiny_models import (
    ARCHS,
    DRAFT_VOCAB,
    N_BYTES,
    TARGET_VOCAB,
    TOKENIZER_SIZE,
    reference_logits,
    save_tiny,
    save_tiny_pair,
    tiny_model,
    tiny_tokenizer,
)

from targetrows.cli.common import add_model_arguments, load_from_args
from targetrows.core.tree import Tree
from targetrows.hf.loading import (
    load_model,
    load_pair,
    tokenizer_difference,
)
from targetrows.hf.model import HFModel
from targetrows.specbench.chat import encode_conversation, encode_prompt, stop_ids

EOS, IM_START, IM_END = N_BYTES, N_BYTES + 1, N_BYTES + 2


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), "llama")


def test_load_pair_gives_matching_models(pair):
    target_dir, draft_dir = pair
    target, draft, tokenizer = load_pair(target_dir, draft_dir, "cpu", "cpu", "float32")
    assert isinstance(target, HFModel) and isinstance(draft, HFModel)
    assert len(tokenizer) == TOKENIZER_SIZE
    # logit widths differ (272 vs 264); rows are cut to the shared vocabulary
    assert target.model.get_output_embeddings().weight.shape[0] == TARGET_VOCAB
    assert draft.model.get_output_embeddings().weight.shape[0] == DRAFT_VOCAB
    assert target.vocab_size == draft.vocab_size == TOKENIZER_SIZE
    assert target.model.dtype == torch.float32
    assert str(target.device) == "cpu"
    # the loaded target is the saved one
    ids = encode_prompt(tokenizer, "hi")
    target.reset(0)
    rows = target.logits(ids, Tree.root_only(ids[-1]), [0])
    expected = reference_logits(tiny_model("llama", seed=0, n_layers=2), ids)[-1, :TOKENIZER_SIZE]
    torch.testing.assert_close(rows[0], expected, atol=1e-5, rtol=0)
    _, none, _ = load_pair(target_dir, None, "cpu")
    assert none is None


@pytest.mark.parametrize("arch", ARCHS)
def test_load_each_architecture(tmp_path, arch):
    path = save_tiny(tmp_path / arch, arch, seed=2, n_layers=1)
    model, tokenizer = load_model(path, "cpu", "bfloat16")
    assert model.model.config.model_type == arch
    assert model.dtype == torch.bfloat16
    ids = encode_prompt(tokenizer, "abc")
    model.reset(0)
    assert model.logits(ids, Tree.root_only(ids[-1]), [0]).shape == (1, TOKENIZER_SIZE)


def test_unknown_path_is_refused(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match="no-such-model"):
        load_model(missing)
    with pytest.raises(ValueError, match="neither a local folder"):
        load_model("not a hub id!")


def test_folder_without_weights_is_refused(tmp_path):
    folder = tmp_path / "empty-model"
    folder.mkdir()
    tiny_tokenizer().save_pretrained(folder)
    with pytest.raises(ValueError, match=r"empty-model.*no weights"):
        load_model(str(folder))


def test_pickle_weights_need_permission(tmp_path):
    path = save_tiny(tmp_path / "pickled", "qwen3", seed=5, n_layers=1, safe=False)
    assert "pytorch_model.bin" in os.listdir(path)
    with pytest.raises(ValueError, match=r"pickled.*allow-pickle"):
        load_model(path)
    model, _ = load_model(path, "cpu", "float32", allow_pickle=True)
    ids = [3, 4, 5]
    model.reset(0)
    rows = model.logits(ids, Tree.root_only(5), [0])
    expected = reference_logits(tiny_model("qwen3", seed=5, n_layers=1), ids)[-1, :TOKENIZER_SIZE]
    torch.testing.assert_close(rows[0], expected, atol=1e-5, rtol=0)


def test_gguf_files_load(tmp_path):
    pytest.importorskip("gguf")
    from tiny_models import save_tiny_gguf

    path = save_tiny_gguf(tmp_path / "gguf-model", seed=0)
    expected = reference_logits(tiny_model("qwen2", seed=0), [5, 6, 7])[-1]
    for where in (path, os.path.dirname(path)):  # the file, or the folder holding one GGUF
        model, tokenizer = load_model(where, "cpu", "float32")
        assert tokenizer("héllo")["input_ids"] == tiny_tokenizer()("héllo")["input_ids"]
        assert model.vocab_size == TARGET_VOCAB  # the GGUF's token list is padded to the width
        assert stop_ids(tokenizer, model) == {EOS, IM_END}
        model.reset(0)
        rows = model.logits([5, 6, 7], Tree.root_only(7), [0])
        torch.testing.assert_close(rows[0], expected, atol=1e-5, rtol=0)
    # a GGUF target with a safetensors draft: placeholders are not a tokenizer mismatch
    draft_dir = save_tiny(tmp_path / "draft", "qwen2", seed=1, n_layers=1, vocab_size=DRAFT_VOCAB)
    target, draft, _ = load_pair(path, draft_dir, "cpu")
    assert target.vocab_size == draft.vocab_size == TOKENIZER_SIZE


def test_tokenizer_mismatch_names_both_models(tmp_path, pair):
    target_dir, _ = pair
    other = save_tiny(
        tmp_path / "other-draft",
        "llama",
        seed=1,
        n_layers=1,
        tokenizer=tiny_tokenizer(extra_tokens=("<|extra|>",)),
    )
    with pytest.raises(ValueError, match=r"llama-target.*other-draft.*different tokenizers"):
        load_pair(target_dir, other, "cpu")


def test_tokenizer_difference():
    plain = tiny_tokenizer()
    assert tokenizer_difference(plain, tiny_tokenizer()) is None
    assert tokenizer_difference(plain, tiny_tokenizer(("[PAD259]", "[PAD260]"))) is None
    assert "'<a>' has id 259 vs None" in tokenizer_difference(
        tiny_tokenizer(("<a>",)), tiny_tokenizer(("<b>",))
    )
    assert "'<b>' (id 259) is in one only" in tokenizer_difference(plain, tiny_tokenizer(("<b>",)))


def test_bad_dtype_is_refused(pair):
    with pytest.raises(ValueError, match="float13"):
        load_model(pair[0], dtype="float13")


def test_model_arguments(pair):
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(
        ["--target", pair[0], "--draft", pair[1], "--target-device", "cpu", "--dtype", "float64"]
    )
    assert args.draft_device is None and not args.trust_remote_code and not args.allow_pickle
    target, draft, _ = load_from_args(args)
    assert target.dtype == draft.dtype == torch.float64
    assert str(draft.device) == "cpu"  # the draft follows the target's device
    lone = argparse.ArgumentParser()
    add_model_arguments(lone, draft=False)
    assert not hasattr(lone.parse_args(["--target", "x"]), "draft")


def test_graphs_on_a_cpu_is_refused_and_auto_runs_eager(pair):
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    base = ["--target", pair[0], "--draft", pair[1], "--target-device", "cpu"]
    with pytest.raises(ValueError, match="--graphs on: .* CUDA"):
        load_from_args(parser.parse_args([*base, "--graphs", "on"]))
    target, draft, _ = load_from_args(parser.parse_args([*base, "--graphs", "auto"]))
    assert not target.engine.shape.graphs and not draft.engine.shape.graphs


def test_encode_prompt_uses_the_chat_template():
    tokenizer = tiny_tokenizer()
    ids = encode_prompt(tokenizer, "Hi!")
    assert tokenizer.decode(ids) == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == IM_START and ids.count(IM_END) == 1
    assert encode_prompt(tokenizer, ["Hi!"]) == ids
    convo = encode_conversation(tokenizer, [("user", "Hi!"), ("assistant", "Yo"), ("user", "Q")])
    assert tokenizer.decode(convo).endswith(
        "Yo<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )
    assert convo[: len(ids) - 3] == ids[:-3]  # the earlier turns are a prefix
    dicts = [{"role": "user", "content": "Hi!"}]
    assert encode_conversation(tokenizer, dicts) == ids
    with pytest.raises(ValueError, match="no turns"):
        encode_prompt(tokenizer, [])


def test_encode_prompt_without_a_template():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    assert tokenizer.decode(encode_prompt(tokenizer, "plain text")) == "plain text"
    both = encode_conversation(tokenizer, [("user", "a"), ("assistant", "b")])
    assert tokenizer.decode(both) == "a\n\nb"


def test_stop_ids_include_end_of_turn(pair):
    model, tokenizer = load_model(pair[0])
    assert stop_ids(tokenizer, model) == {EOS, IM_END}
    assert stop_ids(tokenizer) == {EOS, IM_END}  # <|im_end|> from the vocabulary alone
    bare = tiny_tokenizer()
    assert IM_END in stop_ids(bare, model.model)
    assert np.all([isinstance(i, int) for i in stop_ids(bare)])
    model.model.generation_config.eos_token_id = [EOS, 65]  # a model-specific end token
    assert stop_ids(bare, model) == {EOS, IM_END, 65}
