"""GPU placement from model sizes (`targetrows.pipeline.placement`) and the device strings the
loader turns into Hugging Face device maps (`targetrows.hf.loading.device_map`)."""

from __future__ import annotations

import json

import pytest

from targetrows.pipeline.gpu_lock import device_env
from targetrows.pipeline.placement import (
    CARD_RESERVE_GB,
    Placement,
    folder_weights_gb,
    model_weights_gb,
    place,
)

GIB = 2**30


def test_a_target_larger_than_a_card_spreads_over_the_fewest_cards_that_hold_it():
    qwen32b = 32.76e9 * 2 / GIB  # bfloat16: 61 GiB
    assert place(qwen32b, 0.9, 48) == Placement(2, False)  # the draft shares the second card
    assert place(qwen32b, 0.9, 80) == Placement(1, False)
    assert place(qwen32b, 0.9, 24).target_cards == 3
    assert place(8.0, 0.9, 48) == Placement(1, False)
    assert place(8.0, 0.9, 48, own_draft_card=True) == Placement(1, True)
    # no room beside the target's share: the draft takes a card of its own
    full = 48 - CARD_RESERVE_GB - 0.5
    assert place(full, 1.0, 48) == Placement(1, True)
    with pytest.raises(ValueError, match="gpu_memory_gb"):
        place(1.0, 0.0, 2)


def test_devices_number_the_claimed_gpus_and_fall_back_to_sharing():
    assert Placement(2, False).devices(2) == ("cuda:0,1", "cuda:1")
    assert Placement(2, True).devices(3) == ("cuda:0,1", "cuda:2")
    assert Placement(2, True).devices(2) == ("cuda:0,1", "cuda:1")  # one short: the draft shares
    assert Placement(1, True).devices(2) == ("cuda:0", "cuda:1")
    assert Placement(1, False).devices(1) == ("cuda:0", "cuda:0")
    assert Placement(2, False).devices(0) == ("cpu", "cpu")
    with pytest.raises(ValueError, match="needs 2 GPUs"):
        Placement(2, False).devices(1)
    env, target, draft = device_env(["1", "3", "6"], Placement(2, True), env={})
    assert (target, draft, env["CUDA_VISIBLE_DEVICES"]) == ("cuda:0,1", "cuda:2", "1,3,6")


def test_weights_come_from_the_folder_scaled_to_the_dtype_else_from_params(tmp_path):
    folder = tmp_path / "m"
    assert folder_weights_gb(folder, "bfloat16") is None
    assert model_weights_gb(folder, 7.0, "bfloat16") == pytest.approx(7e9 * 2 / GIB)
    assert model_weights_gb(folder, 7.0, "float32") == pytest.approx(7e9 * 4 / GIB)
    assert model_weights_gb(folder, None, "auto") == 0.0
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"dtype": "float32"}))
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    assert folder_weights_gb(folder, "float32") == pytest.approx(4096 / GIB)
    assert folder_weights_gb(folder, "bfloat16") == pytest.approx(2048 / GIB)
    assert model_weights_gb(folder, 7.0, "bfloat16") == pytest.approx(2048 / GIB)  # the folder wins


def test_device_strings_become_device_maps(monkeypatch):
    torch = pytest.importorskip("torch")
    from targetrows.hf.loading import device_map

    assert device_map("cpu") == ("cpu", None)
    assert device_map("cuda:1") == ("cuda:1", None)
    assert device_map("auto") == ("auto", None)

    class Props:
        def __init__(self, i):
            self.total_memory = (40 + i) * GIB

    monkeypatch.setattr(torch.cuda, "get_device_properties", Props)
    assert device_map("cuda:0,1") == ("balanced", {0: 40 * GIB, 1: 41 * GIB})
    with pytest.raises(ValueError, match="by number"):
        device_map("cuda:0,x")
    with pytest.raises(ValueError, match="twice"):
        device_map("cuda:1,1")


def test_auto_dtype_is_bfloat16_only_on_gpus_that_have_it(monkeypatch):
    torch = pytest.importorskip("torch")
    from targetrows.hf import loading

    capability = {"value": (7, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: capability["value"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert loading.resolve_dtype("auto", "cuda:0") == torch.float16  # a V100: emulated bfloat16
    assert loading.resolve_dtype("auto", "cuda:1,2") == torch.float16
    capability["value"] = (8, 0)
    assert loading.resolve_dtype("auto", "cuda") == torch.bfloat16
    assert loading.resolve_dtype("float32", "cuda:0") == torch.float32
