"""How heads are read and written, against each engine's reading rules as its code states them
(cited below), and the published heads' layouts (tests/published_heads.py): every one loads
and drafts losslessly, is described by `inspect-head`, and one that differs from what this
backend knows is refused by name. Heads written by earlier targetrows versions still load."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import published_heads  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from targetrows.cli import main  # noqa: E402
from targetrows.decoding.config import DecodeConfig  # noqa: E402
from targetrows.decoding.loop import generate  # noqa: E402
from targetrows.heads.checkpoint import head_config_json, write_head  # noqa: E402
from targetrows.heads.describe import describe  # noqa: E402
from targetrows.hf.loading import load_eagle3  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402

N_LAYERS = 8


@pytest.fixture(scope="module")
def target_hf():
    return tiny_model("llama", seed=2, n_layers=N_LAYERS, dtype=torch.float64)


# -- each engine's reading rule, from its code ----------------------------------------------------

def eagle_reads(config: dict, tensors: set[str], n_layers: int) -> dict:
    """SafeAILab/EAGLE @ cb7e084: eagle/model/configs.py `EConfig._rope_scaling_validation`
    (rope_scaling None or {type: linear|dynamic, factor}); eagle/model/cnets.py
    `LlamaAttention._init_rope` (base rope_theta if present, else 10000; head_dim is
    hidden_size // num_attention_heads), `Model.__init__` (with target_hidden_size, the
    embedding is only what the checkpoint holds: random without one; without it, copied from the
    target's sharded index); eagle/model/modeling_llama_kv.py `LlamaModel.forward` (features:
    the inputs of layers 2, L//2, L-3, hard-coded)."""
    scaling = config.get("rope_scaling")
    if scaling is not None and (set(scaling) != {"type", "factor"}
                                or scaling["type"] not in ("linear", "dynamic")):
        raise ValueError(f"EConfig rejects rope_scaling {scaling}")
    if "target_hidden_size" in config and "embed_tokens.weight" not in tensors:
        raise ValueError("EAGLE keeps a random embedding")
    return dict(inputs=[2, n_layers // 2, n_layers - 3], rope_theta=config.get("rope_theta", 10000),
                head_dim=config["hidden_size"] // config["num_attention_heads"])


def sglang_reads(config: dict, n_layers: int) -> dict:
    """sglang 0.5.23: model_runner_components/spec_aux_hidden_state.py
    `_resolve_eagle_aux_hidden_state` (only eagle_config's ids), models/llama.py
    `set_eagle3_layers_to_capture` (capture id + 1, else [2, L//2, L-3]), llama.py
    `LlamaDecoderLayer` (rope_parameters' rope_theta, else rope_theta, else 10000),
    models/llama.py `set_embed` (the target's embedding unless target_hidden_size differs)."""
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    rope = config.get("rope_parameters") or {}
    return dict(inputs=sorted(i + 1 for i in ids) if ids else [2, n_layers // 2, n_layers - 3],
                rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000)),
                embedding="target" if config.get("target_hidden_size", config["hidden_size"])
                == config["hidden_size"] else "own")


def vllm_reads(config: dict, n_layers: int) -> dict:
    """vllm 0.33.0: v1/worker/gpu/spec_decode/eagle/eagle3_utils.py
    `get_eagle3_aux_layers_from_config` (top-level ids, inputs), models/interfaces.py
    `get_eagle3_default_aux_hidden_state_layers` ((2, L//2, L-3)), models/llama_eagle3.py
    (norm_before_residual default False outside speculators configs),
    transformers_utils/config.py `patch_rope_parameters` (rope_theta into rope_parameters)."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    rope = config.get("rope_parameters") or {}
    return dict(inputs=sorted(ids) if ids else [2, n_layers // 2, n_layers - 3],
                rope_theta=rope.get("rope_theta", config.get("rope_theta")),
                norm_before_residual=config.get("norm_before_residual", False))


@pytest.mark.parametrize("layers", [None, [1, 3, 6]], ids=["default", "chosen"])
def test_the_heads_we_write_read_the_same_in_every_engine(target_hf, tmp_path, layers):
    """What train-eagle3 writes (`head_config_json`, the target's table as embed_tokens) is read
    as the same head by EAGLE's reference loader, SGLang, vLLM and this backend."""
    from tiny_heads import tiny_head_tensors

    from targetrows.train.eagle3_init import layer_config

    config = head_config_json(layer_config(target_hf.config), 100, target_hf.config, layers)
    tensors = tiny_head_tensors(target_hf.config, draft_vocab_size=100, head_dim=16,
                                intermediate=128)
    tensors["embed_tokens.weight"] = target_hf.get_input_embeddings().weight.detach().float()
    write_head(str(tmp_path / "head"), tensors, config)
    names = {k.replace("layer.", "midlayer.") for k in tensors}
    theta = target_hf.config.rope_parameters["rope_theta"]
    inputs = layers or [2, N_LAYERS // 2, N_LAYERS - 3]
    draft = load_eagle3(str(tmp_path / "head"), HFModel(target_hf, name="t"))
    assert list(draft.feature_layers) == inputs
    assert float(draft.head.rotary.inv_freq[1]) == pytest.approx(theta ** (-2 / 16))
    if layers is None:  # EAGLE reads no ids: only default-layer heads are EAGLE's
        assert eagle_reads(config, names, N_LAYERS) == dict(inputs=inputs, rope_theta=theta,
                                                            head_dim=16)
    assert sglang_reads(config, N_LAYERS) == dict(inputs=inputs, rope_theta=theta,
                                                  embedding="target")
    assert vllm_reads(config, N_LAYERS) == dict(inputs=inputs, rope_theta=theta,
                                                norm_before_residual=False)


def test_a_head_reading_the_embedding_is_not_written(target_hf):
    """Layer 0's input has no name among SGLang's layer outputs, where a missing id would fall
    back to SGLang's default layers without a word: the writer refuses such a head."""
    from targetrows.train.eagle3_init import layer_config

    with pytest.raises(ValueError, match="layer 0's input"):
        head_config_json(layer_config(target_hf.config), 100, target_hf.config, [0, 3, 6])


# -- the published heads --------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(published_heads.HEADS))
def test_each_published_layout_loads_drafts_and_is_described(target_hf, tmp_path, name):
    folder = published_heads.write(tmp_path / "head", name)
    target = HFModel(target_hf, name="t")
    draft = load_eagle3(folder, target)
    info = describe(folder, target_hf.config)
    spec = published_heads.HEADS[name]
    top = spec["config"].get("eagle_aux_hidden_state_layer_ids")
    assert info["fits the target"] == "yes"
    assert info["feature layers (inputs)"] == list(draft.feature_layers) == (
        top or [2, N_LAYERS // 2, N_LAYERS - 3])
    assert info["layout"] == ("speculators" if "speculators" in name else "specforge")
    assert draft.head.shape.head_dim == spec["head_dim"]
    assert (draft.head.embed_tokens is not None) == ("embed_tokens" in spec["tensors"])
    prompt = [5, 17, 42, 9]
    want = generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=10)).tokens
    got = generate(target, draft, prompt, DecodeConfig("draft_rank", budget=6, max_new_tokens=10))
    assert got.tokens == want


@pytest.mark.parametrize("change, message", [
    (dict(config_overrides={"norm_output_v2": True}), "config keys \\['norm_output_v2'\\]"),
    (dict(config_overrides={"eagle_config": {"layer_ids": [1, 2, 3]}}), "eagle_config.layer_ids"),
    (dict(extra_tensor="midlayer.self_attn.q_norm.weight"), "does not declare"),
    (dict(extra_tensor="fc.bias"), "does not implement"),
])
def test_a_download_that_differs_from_the_known_layouts_is_refused(target_hf, tmp_path, change,
                                                                   message):
    folder = published_heads.write(tmp_path / "head", "Tengyunw/qwen3_8b_eagle3", **change)
    with pytest.raises(ValueError, match=message) as err:
        load_eagle3(folder, HFModel(target_hf, name="t"))
    assert folder in str(err.value)


def test_heads_written_by_earlier_targetrows_keep_their_layers(target_hf, tmp_path):
    """Before layer ids followed each engine's key, train-eagle3 wrote the inputs it read under
    eagle_config (and its report beside the config): such a head is still read as it was
    trained. The same config from anywhere else is read as SGLang reads it."""
    from tiny_heads import tiny_head_tensors

    tensors = tiny_head_tensors(target_hf.config, draft_vocab_size=100, head_dim=16)
    layer = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=target_hf.config.vocab_size,
                 rms_norm_eps=1e-6, hidden_act="silu", max_position_embeddings=1024,
                 rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    old = dict(layer, architectures=["LlamaForCausalLMEagle3"], model_type="llama",
               num_hidden_layers=1, draft_vocab_size=100, target_hidden_size=64,
               tie_word_embeddings=False, torch_dtype="float32",
               eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5],
                             "use_aux_hidden_state": True})
    for folder, report in ((tmp_path / "old", True), (tmp_path / "other", False)):
        write_head(str(folder), tensors, old)
        if report:
            (folder / "train_eagle3_report.json").write_text(
                json.dumps({"feature_layers": [2, 4, 5], "target": "t"}))
        draft = load_eagle3(str(folder), HFModel(target_hf, name="t"))
        assert list(draft.feature_layers) == ([2, 4, 5] if report else [3, 5, 6])


def test_inspect_head_command(target_hf, tmp_path, capsys):
    from tiny_models import save_tiny

    target = save_tiny(tmp_path / "target", "llama", seed=2, n_layers=N_LAYERS)
    folder = published_heads.write(tmp_path / "head", "WhiFlash/Qwen3-4B-EAGLE3")
    assert main(["inspect-head", folder, "--target", target]) == 0
    out = capsys.readouterr().out
    assert "layout" in out and "specforge" in out and "fits the target" in out
    assert "default: inputs of layers 2, L//2, L-3" in out and "2, 4, 5" in out
    assert "midlayer.self_attn.q_proj.weight" not in out and "layer.self_attn.q_proj" in out
    assert main(["inspect-head", folder, "--json", "--no-weights"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["draft vocabulary"] == published_heads.DRAFT_VOCAB and "tensors" not in info
    other = save_tiny(tmp_path / "other", "llama", seed=2, n_layers=N_LAYERS, vocab_size=300)
    assert main(["inspect-head", folder, "--target", other]) == 1
    assert "fits the target" in (out := capsys.readouterr().out) and "vocab_size is 272" in out


def test_norm_before_residual_defaults_as_each_engine_reads_its_layout():
    """A config without the key: vLLM reads a speculators config through its converter, which
    sets norm_before_residual true (transformers_utils/configs/speculators/algos.py
    `update_eagle3`: `config_dict.get("norm_before_residual", True)`); vLLM's own Eagle3 layer
    (`getattr(config, "norm_before_residual", False)`) and SpecForge default to false. A key
    that is there is read as it is."""
    from targetrows.heads.conventions import LAYOUTS, variants

    layer = {"model_type": "llama", "num_hidden_layers": 1}
    speculators = {"speculators_model_type": "eagle3", "transformer_layer_config": layer}
    assert variants(speculators, LAYOUTS["speculators"], "s").norm_before_residual
    said = dict(speculators, norm_before_residual=False)
    assert not variants(said, LAYOUTS["speculators"], "s").norm_before_residual
    for name in ("vllm", "specforge"):
        assert not variants(dict(layer), LAYOUTS[name], name).norm_before_residual
        assert variants(dict(layer, norm_before_residual=True), LAYOUTS[name],
                        name).norm_before_residual
