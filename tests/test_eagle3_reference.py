"""EAGLE-3 heads read as the engines that made them read them, checked against those engines'
own head modules, never against our own writer:

- speculators (vllm-project, PyPI): `Eagle3DraftModel` built with its own config class and
  written with its own `save_pretrained`; its forward pass (training-time test, teacher-forced)
  gives the reference draft logits at levels 1..3;
- SpecForge (sgl-project, PyPI): `LlamaForCausalLMEagle3` and the same loop as its trainer
  (`embed_input_ids`, `project_hidden_states`, `backbone`, `compute_logits`).

Both libraries get the target's features as their engine takes them from the target (vLLM:
``hidden_states[j]`` for each top-level id j; SGLang: ``hidden_states[j + 1]`` for each
``eagle_config`` id j; the default the inputs of layers 2, L//2, L-3), computed here from a plain
Hugging Face forward with ``output_hidden_states``. Our loader reads the written folder on its
own; a misread layer id, variant or embedding changes the logits and fails the test. The EAGLE
reference has no EAGLE-3 package on PyPI (``eagle-llm`` is EAGLE-1/2): its reading rules are
checked from its code in `test_eagle3_conventions.py`.
"""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _need(module: str, why: str):
    try:
        return pytest.importorskip(module, reason=why)
    except pytest.skip.Exception:
        if os.environ.get("CI") == "true":  # CI installs them: a missing one is a failure
            pytest.fail(f"{module} is not installed: {why}")
        raise


speculators = _need("speculators", "speculators (pip install --no-deps speculators==0.9.0 "
                    "hs-connectors==0.9.0 openai sniffio) is the reference for its layout")

from tiny_models import tiny_model  # noqa: E402

from targetrows.core.tree import Tree  # noqa: E402
from targetrows.hf.loading import load_eagle3  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402

N_LAYERS = 8  # default feature layers: the inputs of 2, 4, 5
DRAFT_VOCAB = 120
LEVELS = 3
SEQ = [5, 17, 42, 9, 101, 33, 7, 250, 64, 12, 3]
N_CONTEXT = 8  # the committed context is SEQ[:8]; SEQ[8:] are the teacher-forced chain
# float64 throughout, but transformers' RMSNorm (which both libraries' layers use) normalises in
# float32: the logits agree to float32 rounding, accumulated over the layer and up to three
# levels (2e-5 seen on one CPU); a misread layer, variant or table moves them by orders of
# magnitude more
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=1, n_layers=N_LAYERS, dtype=torch.float64)


def hidden_states(model, tokens):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    return out.hidden_states


def vocabulary(vocab: int, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    keep = torch.randperm(vocab, generator=gen)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    return t2d, keep - torch.arange(DRAFT_VOCAB)


def fill(model, seed: int):
    """Random weights everywhere (speculators starts its embedding and heads at NaN)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_((1.0 + 0.2 * noise) if "norm" in name else 0.3 * noise)


def ours(target_hf, folder, levels=LEVELS):
    """Our loader's draft logits, over the draft vocabulary, at the root and down the
    teacher-forced chain SEQ[N_CONTEXT:] ([levels, DRAFT_VOCAB]), and the d2t it read."""
    target = HFModel(target_hf, name="target")
    draft = load_eagle3(str(folder), target)
    ctx = SEQ[:N_CONTEXT]
    chain = Tree([ctx[-1], *SEQ[N_CONTEXT : N_CONTEXT + levels - 1]], list(range(-1, levels - 1)))
    rows = draft.logits(ctx, chain, range(levels))
    d2t = draft.head.d2t.cpu()
    return rows[:, torch.arange(DRAFT_VOCAB) + d2t], draft


def reference_inputs(target_hf, layers):
    """What the engine feeds the head: the target's features at positions 0..T-1 (the layers in
    ascending order) and each position's next token."""
    length = N_CONTEXT - 1 + LEVELS - 1  # step k at the root index reads token root + 1 + k
    hs = hidden_states(target_hf, SEQ[:length])
    features = torch.cat([hs[j] for j in sorted(layers)], dim=-1)
    return features, torch.tensor([SEQ[1 : length + 1]])


# -- speculators ----------------------------------------------------------------------------------

SPECULATORS_VARIANTS = ["plain", "norm_output", "norm_before_residual", "norm_before_fc",
                        "fc_norm", "qwen3_layer"]


def speculators_head(folder, vocab: int, variant: str, ids):
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig, Qwen3Config

    layer_cls = Qwen3Config if variant == "qwen3_layer" else LlamaConfig
    layer = layer_cls(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      intermediate_size=96, vocab_size=vocab, num_hidden_layers=1,
                      rms_norm_eps=1e-6, max_position_embeddings=1024, rope_theta=10000.0,
                      hidden_act="silu", tie_word_embeddings=False)
    layer._attn_implementation = "sdpa"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=variant == "norm_before_residual",
        norm_before_fc=variant == "norm_before_fc", fc_norm=variant == "fc_norm",
        norm_output=variant == "norm_output", target_hidden_size=64,
        eagle_aux_hidden_state_layer_ids=ids,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=LEVELS)],
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])))
    model = Eagle3DraftModel(config)
    fill(model, seed=len(variant))
    model.load_vocab_mappings(*vocabulary(vocab))
    model.save_pretrained(str(folder))  # speculators' own writer
    return model.double().eval()


def speculators_logits(model, features, tokens):
    """speculators' forward (training-time test) with a hook on lm_head: logits per step."""
    steps = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: steps.append(o.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=features, input_ids=tokens, document_ids=torch.zeros_like(tokens),
                  position_ids=torch.arange(tokens.shape[1])[None],  # ours start at 0 too
                  verifier_last_hidden_states=None, ttt_steps=LEVELS)
    finally:
        hook.remove()
    return torch.stack([s[0, N_CONTEXT - 2] for s in steps])  # the root's index, every step


@pytest.mark.parametrize("variant", SPECULATORS_VARIANTS)
@pytest.mark.parametrize("ids", [None, [5, 1, 3]], ids=["default-ids", "ids-5-1-3"])
def test_speculators_heads_draft_as_speculators_does(target, tmp_path, variant, ids):
    """Top-level ids are layer inputs (vLLM keeps hidden_states[j]); every variant speculators
    writes; the head's own embedding table (speculators saves it) is the one used."""
    model = speculators_head(tmp_path / "head", target.config.vocab_size, variant, ids)
    features, tokens = reference_inputs(target, ids or [2, N_LAYERS // 2, N_LAYERS - 3])
    want = speculators_logits(model, features, tokens)
    got, draft = ours(target, tmp_path / "head")
    assert draft.head.embed_tokens is not None  # its own table, as vLLM keeps one that differs
    torch.testing.assert_close(got, want, **TOLERANCE)


# -- SpecForge ------------------------------------------------------------------------------------

@pytest.fixture
def specforge():
    module = _need("specforge.modeling.draft.llama3_eagle",
                   "specforge (pip install --no-deps specforge==0.2.0) is the reference for the "
                   "EAGLE/SpecForge layout")
    disabled = torch._dynamo.config.disable
    torch._dynamo.config.disable = True  # its rotary and norms are torch.compile'd: run eagerly
    yield module
    torch._dynamo.config.disable = disabled


def specforge_head(module, folder, target_hf, nested_ids, fc_norm: bool):
    from transformers import LlamaConfig

    config = LlamaConfig(architectures=["LlamaForCausalLMEagle3"], hidden_size=64,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=96, vocab_size=target_hf.config.vocab_size,
                         num_hidden_layers=1, rms_norm_eps=1e-6, max_position_embeddings=1024,
                         rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False)
    config.draft_vocab_size, config.target_hidden_size, config.fc_norm = DRAFT_VOCAB, 64, fc_norm
    if nested_ids is not None:
        config.eagle_config = {"eagle_aux_hidden_state_layer_ids": nested_ids,
                               "use_aux_hidden_state": True}
    model = module.LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    fill(model, seed=7)
    t2d, d2t = vocabulary(target_hf.config.vocab_size)
    with torch.no_grad():  # SpecForge trains on the target's table, frozen
        model.embed_tokens.weight.copy_(target_hf.get_input_embeddings().weight)
        model.t2d.copy_(t2d)
        model.d2t.copy_(d2t)
    model.save_pretrained(str(folder))  # SpecForge's own writer
    return model.eval()  # float32: its mask builder takes no float64


def specforge_logits(model, features, tokens):
    """SpecForge's training-time test, as `OnlineEagle3Model.forward` runs it (sdpa)."""
    from specforge.utils import padding

    b, t, _ = features.shape
    hs = model.project_hidden_states(features.float())
    mask = model.prepare_decoder_attention_mask(
        attention_mask=torch.ones(b, t, dtype=torch.bool), hidden_states=hs, batch_size=b,
        seq_length=t, past_key_values_length=0)
    cache, ids, steps = [[], []], tokens, []
    with torch.no_grad():
        for _ in range(LEVELS):
            hs = model.backbone(input_embeds=model.embed_input_ids(ids), hidden_states=hs,
                                cache_hidden=cache, attention_mask=mask,
                                position_ids=torch.arange(t)[None], past_key_values=None,
                                use_cache=True)
            steps.append(model.compute_logits(hs)[0, N_CONTEXT - 2])
            ids = padding(ids, left=False)
    return torch.stack(steps).double()


@pytest.mark.parametrize("nested_ids, inputs", [
    (None, [2, N_LAYERS // 2, N_LAYERS - 3]),
    ([1, 3, 4], [2, 4, 5]),  # SpecForge's default [1, L//2-1, L-4]: the same tensors
    ([5, 0, 2], [1, 3, 6]),  # any order: ascending layers
])
@pytest.mark.parametrize("fc_norm", [False, True])
def test_specforge_heads_draft_as_specforge_does(specforge, target, tmp_path, nested_ids, inputs,
                                                 fc_norm):
    """eagle_config ids are layer outputs (SGLang captures id + 1, SpecForge trains on layer
    outputs); the head is SpecForge's own module, written by its own save_pretrained."""
    model = specforge_head(specforge, tmp_path / "head", target, nested_ids, fc_norm)
    features, tokens = reference_inputs(target, inputs)
    want = specforge_logits(model, features, tokens)
    got, draft = ours(target, tmp_path / "head")
    assert list(draft.feature_layers) == inputs
    torch.testing.assert_close(got, want, **TOLERANCE)


def test_our_heads_load_in_specforge_and_draft_the_same(specforge, target, tmp_path):
    """A head written as train-eagle3 writes it (`head_config_json`, `write_head`) is read by
    SpecForge's own class as it is (strict state dict, config via transformers), and drafts the
    same logits there as here."""
    from tiny_heads import tiny_head_tensors
    from transformers import AutoConfig

    from targetrows.heads.checkpoint import head_config_json, write_head
    from targetrows.train.eagle3_init import layer_config

    tensors = tiny_head_tensors(target.config, draft_vocab_size=DRAFT_VOCAB, seed=4)
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().float()
    layer = dict(layer_config(target.config), head_dim=20, intermediate_size=96)
    write_head(str(tmp_path / "head"), tensors,
               head_config_json(layer, DRAFT_VOCAB, target.config))
    config = AutoConfig.from_pretrained(str(tmp_path / "head"))
    model = specforge.LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(tmp_path / "head" / "model.safetensors")), strict=True)
    model = model.eval()
    features, tokens = reference_inputs(target, [2, N_LAYERS // 2, N_LAYERS - 3])
    want = specforge_logits(model, features, tokens)
    got, _ = ours(target, tmp_path / "head")
    torch.testing.assert_close(got, want, **TOLERANCE)


def test_one_heads_weights_in_every_layout_draft_the_same_tokens(specforge, target, tmp_path):
    """SpecForge's head, its weights described as speculators describes them (``layers.0.*``,
    top-level ids as inputs), and as EAGLE's reference config (no ids: the default layers)
    all draft the same tokens through our loader."""
    import json

    from safetensors.torch import load_file, save_file

    specforge_head(specforge, tmp_path / "sf", target, [1, 3, 4], fc_norm=False)
    base, _ = ours(target, tmp_path / "sf")
    config = json.loads((tmp_path / "sf" / "config.json").read_text())
    state = load_file(str(tmp_path / "sf" / "model.safetensors"))
    layouts = {
        "speculators": (dict(speculators_model_type="eagle3", architectures=["Eagle3Speculator"],
                             draft_vocab_size=DRAFT_VOCAB, target_hidden_size=64,
                             eagle_aux_hidden_state_layer_ids=[2, 4, 5],
                             # speculators writes it always; absent, vLLM would read true
                             norm_before_residual=False,
                             transformer_layer_config={k: v for k, v in config.items()
                                                       if k not in ("draft_vocab_size",
                                                                    "target_hidden_size",
                                                                    "eagle_config", "fc_norm",
                                                                    "norm_output")}),
                        {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}),
        "eagle": (dict({k: v for k, v in config.items() if k not in ("eagle_config", "fc_norm",
                                                                      "norm_output")},
                       architectures=["LlamaForCausalLM"]), state),
    }
    for name, (written, tensors) in layouts.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(written))
        save_file(tensors, str(folder / "model.safetensors"))
        got, _ = ours(target, folder)
        torch.testing.assert_close(got, base, rtol=1e-12, atol=1e-12)
        assert torch.equal(got.argmax(-1), base.argmax(-1)), name
