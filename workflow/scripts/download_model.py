"""Download a model snapshot from the Hugging Face hub into resources/models/{model}.

The token comes from HF_TOKEN (or a stored `hf auth login`) and is never logged. Transient
failures (connection errors, timeouts, HTTP 429/5xx) are retried with backoff; a gated repository
without access fails at once with instructions. The snapshot goes to a temporary sibling folder
that is renamed into place, so an interrupted download never looks finished.
"""

import os
import shutil
import sys
import time

# Weights as safetensors plus configs and tokenizer files; never the duplicate `original/`
# checkpoints (16 GB for Llama-3.1-8B) or pickled .bin weights. EAGLE-3 heads are the exception:
# many ship only pytorch_model.bin, which targetrows reads with torch's weights-only loader.
ALLOW = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py"]
IGNORE = ["original/*", "*.bin", "*.pth", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]
HEAD_ALLOW = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model.bin"]


def is_transient(err: BaseException) -> bool:
    """A failure worth retrying: the network or the hub, not the request."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(err, (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError)):
        return False
    if isinstance(err, HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", None)
        return status is None or status == 429 or status >= 500
    if isinstance(err, LocalEntryNotFoundError):  # raised when the hub cannot be reached
        return True
    return isinstance(err, (ConnectionError, TimeoutError, OSError)) or "Timeout" in type(
        err
    ).__name__ or "Connect" in type(err).__name__


def explain(err: BaseException, repo: str, gated: bool) -> str:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(err, GatedRepoError) or (gated and isinstance(err, RepositoryNotFoundError)):
        token = "HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "HF_TOKEN is not set"
        return (
            f"{repo} is a gated repository and this account has no access ({token}). Accept its "
            f"license at https://huggingface.co/{repo} with your Hugging Face account, create a "
            "read token at https://huggingface.co/settings/tokens, and rerun with HF_TOKEN=<token> "
            "in the environment (or run `hf auth login` once)."
        )
    if isinstance(err, RepositoryNotFoundError):
        return (
            f"{repo} was not found on the hub (or is private): check the `repo` of this model "
            "in the config"
        )
    return f"downloading {repo} failed: {type(err).__name__}: {err}"


def download(repo: str, revision: str, out: str, gated: bool = False, tries: int = 4,
             backoff_s: float = 10.0, log=sys.stderr, head: bool = False) -> None:
    from huggingface_hub import snapshot_download

    allow, ignore = (HEAD_ALLOW, ["original/*"]) if head else (ALLOW, IGNORE)
    tmp = f"{out.rstrip('/')}.partial"
    for attempt in range(1, tries + 1):
        try:
            # resumes into the same partial folder after a transient failure or a killed job
            snapshot_download(repo, revision=revision, local_dir=tmp,
                              allow_patterns=allow, ignore_patterns=ignore)
            break
        except Exception as err:  # classified below; anything not transient is re-raised
            if not is_transient(err) or attempt == tries:
                raise RuntimeError(explain(err, repo, gated)) from err
            wait = backoff_s * 2 ** (attempt - 1)
            print(f"attempt {attempt}/{tries} failed ({type(err).__name__}); retrying in "
                  f"{wait:.0f} s", file=log, flush=True)
            time.sleep(wait)
    shutil.rmtree(os.path.join(tmp, ".cache"), ignore_errors=True)
    names = os.listdir(tmp)
    if not any(n.endswith(".safetensors") or (head and n == "pytorch_model.bin") for n in names):
        raise RuntimeError(f"{repo}@{revision} has no safetensors weights; targetrows loads "
                           "safetensors only from the hub (and pytorch_model.bin for heads)")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"downloaded {repo}@{revision} into {out}", file=log)


def main(smk) -> None:
    with open(smk.log[0], "w") as log:
        sys.stderr = log
        download(smk.params.repo, smk.params.revision, smk.output[0], smk.params.gated, log=log,
                 head=smk.params.head)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
