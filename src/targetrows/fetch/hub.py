"""Download a model snapshot from the Hugging Face hub (or a mirror named by HF_ENDPOINT).

The token comes from HF_TOKEN (or a stored `hf auth login`) and never appears in a message: the
errors below are redacted before they are printed or raised. Transient failures (connection
errors, timeouts, HTTP 429/5xx) are retried with backoff; a gated repository without access and
an unknown repository fail at once, each with what to do. The snapshot goes to `OUT.partial`,
renamed into place when complete, so an interrupted download never looks finished and a rerun
resumes where it stopped.
"""

import os
import shutil
import sys
import time

# Weights as safetensors plus configs and tokenizer files; never the duplicate `original/`
# checkpoints (16 GB for Llama-3.1-8B) or pickled .bin weights.
ALLOW = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py"]
IGNORE = ["original/*", "*.bin", "*.pth", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]
# EAGLE-3 heads are the exception: many ship only pytorch_model.bin, which targetrows reads
# with torch's weights-only loader (targetrows.heads.checkpoint)
HEAD_ALLOW = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model.bin"]


def redact(text: str, env=os.environ) -> str:
    """`text` with the value of HF_TOKEN (if any) replaced, so no log ever shows the token."""
    token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
    return text.replace(token, "<HF_TOKEN>") if token else text


def http_status(err: BaseException) -> int | None:
    return getattr(getattr(err, "response", None), "status_code", None)


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
    if type(err).__name__ == "DatasetNotFoundError":  # datasets' own (an OSError), not transient
        return False
    if isinstance(err, HfHubHTTPError):
        status = http_status(err)
        return status is None or status == 429 or status >= 500
    if isinstance(err, LocalEntryNotFoundError):  # raised when the hub cannot be reached
        return True
    name = type(err).__name__
    return isinstance(err, (ConnectionError, TimeoutError, OSError)) or "Timeout" in name or (
        "Connect" in name) or "RemoteProtocol" in name or "ReadError" in name


def explain(err: BaseException, repo: str, gated: bool, revision: str = "main",
            check: str = "the `repo` of this model in the config") -> str:
    """What went wrong and what to do, for a failure that retrying will not fix; `check` says
    where a wrong repository id comes from."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    denied = isinstance(err, GatedRepoError) or http_status(err) in (401, 403)
    if denied or (gated and isinstance(err, RepositoryNotFoundError)):
        token = "HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "HF_TOKEN is not set"
        return (
            f"{repo} is a gated repository and this account has no access ({token}). Accept its "
            f"license at {endpoint}/{repo} with your Hugging Face account, create a read token "
            "at https://huggingface.co/settings/tokens, and rerun with HF_TOKEN=<token> in the "
            "environment (or run `hf auth login` once)."
        )
    if isinstance(err, RevisionNotFoundError):
        return (f"{repo} has no revision {revision!r} on {endpoint}: check the `revision` of this "
                "model in the config")
    if isinstance(err, RepositoryNotFoundError) or type(err).__name__ == "DatasetNotFoundError":
        return (
            f"{repo} was not found on {endpoint} (or is private): check {check}"
        )
    return redact(f"downloading {repo} failed: {type(err).__name__}: {err}")


def download(repo: str, revision: str, out: str, gated: bool = False, tries: int = 4,
             backoff_s: float = 10.0, log=sys.stderr, head: bool = False) -> None:
    """Fetch `repo` at `revision` into the folder `out`, which exists only once complete;
    `head`: an EAGLE-3 head (its config and weights, a pickle `.bin` included)."""
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
                raise RuntimeError(explain(err, repo, gated, revision)) from None
            wait = backoff_s * 2 ** (attempt - 1)
            print(redact(f"attempt {attempt}/{tries} failed ({type(err).__name__}: {err}); "
                         f"retrying in {wait:.0f} s"), file=log, flush=True)
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
