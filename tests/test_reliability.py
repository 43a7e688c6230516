"""Faults: `targetrows decode` and `record` killed with SIGKILL half-way resume to exactly the
answers and row log of an uninterrupted run, and nothing reads as complete while half-written;
bad input and runtime faults (NaN logits, out of memory) give an error naming the file, line,
key or prompt, and write nothing.

Killed runs are separate processes (`python -m targetrows.cli`); reference runs and reruns call
`targetrows.cli.main` with the same arguments in this process, which also shows that answers do
not depend on the process they are computed in.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from needs import needs

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import save_tiny, save_tiny_pair, tiny_model, tiny_tokenizer

from targetrows.cli import main
from targetrows.rowlog import format as rowlog
from targetrows.specbench.chat import encode_conversation

QUESTIONS = [
    {"question_id": f"q{i}", "category": "writing" if i % 2 else "math",
     "turns": [f"Question {i}: tell me a story about the number {i}."]}
    for i in range(6)
]
QUESTIONS[1]["turns"].append("Now tell it again, shorter.")  # an MT-bench-like second turn
ROUND_TIMES = ("t_draft", "t_root", "t_drafting", "t_verify", "t_bookkeeping", "t_round")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), "llama")


def write_prompts(path, questions=QUESTIONS):
    path.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return str(path)


def decode_args(pair, prompts, out, *extra):
    target, draft = pair
    return ["decode", "--target", target, "--draft", draft, "--prompts", str(prompts),
            "--out", str(out), "--target-device", "cpu", "--no-progress", *extra]


def record_args(pair, prompts, out, *extra):
    target, draft = pair
    return ["record", "--target", target, "--draft", draft, "--prompts", str(prompts),
            "--out", str(out), "--target-device", "cpu", "--quiet", *extra]


def start(argv, driver=""):
    """`targetrows ARGV` in a new process; `driver` is Python run before the command (to make
    the process kill itself at a chosen point)."""
    code = f"import sys\n{driver}\nfrom targetrows.cli import main\nsys.exit(main({argv!r}))\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def signal_at_rename(name: str, signal_name: str) -> str:
    """A driver for `start`: the process sends itself `signal_name` just before it renames its
    finished temp file to `name`."""
    return (f"import os, signal\nreal = os.replace\n"
            f"def replace(src, dst):\n"
            f"    if os.path.basename(dst) == {name!r}:\n"
            f"        os.kill(os.getpid(), signal.{signal_name})\n"
            f"    return real(src, dst)\n"
            f"os.replace = replace\n")


def kill_when(proc, ready, what, timeout=240):
    """SIGKILL `proc` as soon as `ready()` holds; fail if it ends first (nothing interrupted)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            return
        if proc.poll() is not None:
            pytest.fail(f"the {what} run ended (status {proc.returncode}) before it could be "
                        f"killed half-way:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"the {what} run made no progress in {timeout} s")


def complete_lines(path) -> int:
    try:
        return path.read_text().count("\n")
    except FileNotFoundError:
        return 0


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def stable(record: dict) -> dict:
    """An answer without its timings: everything else must match between runs exactly."""
    record = json.loads(json.dumps(record))
    for choice in record["choices"]:
        choice.pop("wall_time")
    for key in ROUND_TIMES:
        record["rounds"].pop(key, None)
    return record


def answers(path) -> list[dict]:
    return [stable(json.loads(line)) for line in path.read_text().splitlines()]


# -- interruption -----------------------------------------------------------------------------


def test_killed_decode_resumes_to_the_same_answers(pair, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    opts = ("--decoder", "fts", "--budgets", "6", "3", "--temperature", "1",
            "--max-new-tokens", "24", "--top-k", "3", "--depth", "3", "--seed", "5")
    reference = tmp_path / "reference.jsonl"
    assert main(decode_args(pair, prompts, reference, *opts)) == 0
    expected = answers(reference)
    assert len(expected) == 2 * len(QUESTIONS)

    out = tmp_path / "answers.jsonl"
    partial = tmp_path / "answers.jsonl.partial"
    argv = decode_args(pair, prompts, out, *opts)
    # 1. killed from outside while decoding, once the first answer is safely on disk
    kill_when(start(argv), lambda: complete_lines(partial) >= 1, "decode")
    assert not out.exists()  # nothing reads as complete
    kept = [json.loads(line) for line in partial.read_text().splitlines()
            if line.endswith("}")]  # a line torn by the kill is not an answer
    assert 1 <= len(kept) < len(expected)
    assert [stable(r) for r in kept] == expected[: len(kept)]  # finished answers are final

    # 2. resumed, then killed at the last moment: the answers are written, not yet renamed
    proc = start(argv, signal_at_rename(out.name, "SIGKILL"))
    proc.wait(timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]
    assert not out.exists()
    assert complete_lines(partial) == len(expected)  # every answer kept for the next run

    assert temp_files(tmp_path)  # SIGKILL runs no cleanup: the unrenamed answers stay

    # 3. the same command again finishes from what is on disk, and clears the dead temp file
    assert main(argv) == 0
    assert answers(out) == expected
    assert not partial.exists()
    assert not temp_files(tmp_path)


def test_terminated_decode_leaves_no_temp_file(pair, tmp_path):
    """SIGTERM (scancel, a preemption) at the last moment: the temp file is removed, the
    answers stay in OUT.partial, and the status says the process was terminated."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:2])
    out = tmp_path / "answers.jsonl"
    argv = decode_args(pair, prompts, out, "--decoder", "pearl", "--budgets", "4",
                       "--max-new-tokens", "8", "--top-k", "2", "--depth", "2")
    proc = start(argv, signal_at_rename(out.name, "SIGTERM"))
    proc.wait(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr.read()[-3000:]
    assert not out.exists() and not temp_files(tmp_path)
    assert complete_lines(tmp_path / "answers.jsonl.partial") == 2


def test_killed_record_resumes_to_the_same_bytes(pair, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    opts = ("--temperature", "1", "--top-k", "3", "--depth", "3", "--max-new-tokens", "40",
            "--seed", "3")
    reference = tmp_path / "reference.npz"
    assert main(record_args(pair, prompts, reference, *opts)) == 0

    out = tmp_path / "rows.npz"
    parts = tmp_path / "rows.npz.parts"
    argv = record_args(pair, prompts, out, *opts)

    def finished_parts():
        return sorted(p for p in os.listdir(parts) if p.endswith(".npz")) if parts.exists() else []

    kill_when(start(argv), lambda: len(finished_parts()) >= 1, "record")
    assert not out.exists()
    done = finished_parts()
    assert 1 <= len(done) < len(QUESTIONS)
    for part in done:  # each finished question is a whole, readable part (never complete=True)
        header = rowlog.read(parts / part, require_complete=False).header
        assert header["complete"] is False
    with pytest.raises(ValueError, match="not complete"):
        rowlog.read(parts / done[0])

    # killed again while the merged log is in its temporary file, just before the rename
    proc = start(argv, signal_at_rename(out.name, "SIGKILL"))
    proc.wait(timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]
    assert not out.exists() and len(finished_parts()) == len(QUESTIONS)
    assert temp_files(out.parent)

    assert main(argv) == 0
    assert out.read_bytes() == reference.read_bytes()  # every array and the header, bit for bit
    assert not parts.exists()
    assert not temp_files(out.parent)


# -- bad input: a clear error, and nothing written ---------------------------------------------


def run_failing(argv, capsys, folder, status=2):
    """Run a command that must fail: its message, after checking `folder` did not change."""
    before = sorted(os.listdir(folder))
    assert main(argv) == status
    err = capsys.readouterr().err
    assert sorted(os.listdir(folder)) == before, "a failed command left files behind"
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("command", ["decode", "record"])
@pytest.mark.parametrize("text, message", [
    ('{"question_id": 1, "turns": ["hi"]}\n{"question_id": 2, "turns": [\n',
     r"prompts\.jsonl:2: not valid JSON"),
    ('{"question_id": 1, "turns": ["hi"]}\n{"question_id": 2, "turns": [""]}\n',
     r"prompts\.jsonl:2: turn 0 is empty"),
    ('{"question_id": 1, "turns": "hi"}\n', r"prompts\.jsonl:1: 'turns' must be a non-empty"),
    ('{"turns": ["hi"]}\n', r"prompts\.jsonl:1: missing field 'question_id'"),
    ("", r"prompts\.jsonl holds no questions"),
])
def test_bad_prompt_files(pair, tmp_path, capsys, command, text, message):
    (tmp_path / "prompts.jsonl").write_text(text)
    out = tmp_path / "out" / "o.npz"
    out.parent.mkdir()
    args = decode_args if command == "decode" else record_args
    extra = ("--decoder", "ar") if command == "decode" else ()
    err = run_failing(args(pair, tmp_path / "prompts.jsonl", out, *extra), capsys, out.parent)
    assert re.search(message, err), err


@pytest.mark.parametrize("command", ["decode", "record"])
def test_prompt_longer_than_the_context_window(pair, tmp_path, capsys, command):
    """An error naming the question, before anything is written (the model's window is 1024)."""
    short = {"question_id": "short", "turns": ["Hello."]}
    long = {"question_id": "too-long", "turns": ["x " * 600]}
    prompts = write_prompts(tmp_path / "prompts.jsonl", [short, long])
    out = tmp_path / "out" / "o"
    out.parent.mkdir()
    args = decode_args if command == "decode" else record_args
    extra = ("--decoder", "fts", "--budgets", "4") if command == "decode" else ()
    err = run_failing(args(pair, prompts, out, *extra, "--max-new-tokens", "8"), capsys,
                      out.parent)
    assert "question 'too-long' turn 0" in err and "context window" in err
    assert "--max-new-tokens" in err


@pytest.mark.parametrize("command", ["decode", "record"])
def test_model_folder_without_weights(pair, tmp_path, capsys, command):
    empty = tmp_path / "no-weights"
    tiny_tokenizer().save_pretrained(empty)
    tiny_model("llama").config.save_pretrained(empty)
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:1])
    out = tmp_path / "out" / "o"
    out.parent.mkdir()
    args = decode_args if command == "decode" else record_args
    argv = args((str(empty), pair[1]), prompts, out)
    if command == "decode":
        argv += ["--decoder", "rerank"]
    err = run_failing(argv, capsys, out.parent)
    assert "no-weights" in err and "no weights" in err


def test_tokenizer_mismatch_names_both_models(pair, tmp_path, capsys):
    other = save_tiny(tmp_path / "other-draft", "llama", seed=1, n_layers=1,
                      tokenizer=tiny_tokenizer(extra_tokens=("<|extra|>",)))
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:1])
    out = tmp_path / "out" / "o.jsonl"
    out.parent.mkdir()
    err = run_failing(decode_args((pair[0], other), prompts, out, "--decoder", "fts"), capsys,
                      out.parent)
    assert "llama-target" in err and "other-draft" in err and "different tokenizers" in err


def test_tokenizer_with_ids_past_the_models_embeddings(tmp_path, capsys):
    """A tokenizer from another model (ids beyond the embedding table) is named before any
    forward pass, instead of an IndexError (or, on a GPU, a device-side assert)."""
    model = tiny_model("llama", n_layers=1, vocab_size=200, pad_token_id=None, eos_token_id=1)
    folder = tmp_path / "small-vocab"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:1])
    out = tmp_path / "out" / "o.jsonl"
    out.parent.mkdir()
    err = run_failing(["decode", "--target", str(folder), "--prompts", prompts, "--out",
                       str(out), "--decoder", "ar", "--no-progress"], capsys, out.parent)
    assert "question 'q0' turn 0" in err and "200 embeddings" in err and "tokenizer" in err


@pytest.fixture(scope="module")
def nan_target(tmp_path_factory):
    """The tiny target with NaN weights for the byte token '~': every row from a context that
    holds '~' is NaN (attention spreads it), every other row is the normal target's."""
    folder = tmp_path_factory.mktemp("nan") / "nan-target"
    model = tiny_model("llama", seed=0, n_layers=2)
    tilde = tiny_tokenizer().convert_tokens_to_ids("~")
    with torch.no_grad():
        model.model.embed_tokens.weight[tilde] = float("nan")
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("command", ["decode", "record"])
def test_nan_logits_name_the_prompt_and_position(pair, nan_target, tmp_path, capsys, command):
    fine = {"question_id": "fine", "turns": ["Count to three."]}
    bad = {"question_id": "has-tilde", "turns": ["What does ~ mean?"]}
    prompts = write_prompts(tmp_path / "prompts.jsonl", [fine, bad])
    out = tmp_path / "o"
    args = decode_args if command == "decode" else record_args
    extra = ("--decoder", "fts", "--budgets", "4") if command == "decode" else ()
    assert main(args((nan_target, pair[1]), prompts, out, *extra, "--max-new-tokens", "6",
                     "--top-k", "3", "--depth", "2")) == 2
    err = capsys.readouterr().err
    n = len(encode_conversation(tiny_tokenizer(), [("user", bad["turns"][0])]))
    # decode asks first for the root row (after the last prompt token); record first for the
    # rows at every prompt position (the path's top ids), in one pass the NaN spreads through
    positions = [n - 1] if command == "decode" else list(range(n))
    assert "question 'has-tilde' turn 0" in err and "nan-target" in err, err
    assert f"position(s) {positions}" in err and "NaN or inf" in err, err
    assert not out.exists()  # no complete output; the finished question is kept for a rerun
    if command == "decode":
        kept = [json.loads(line) for line in open(f"{out}.partial")]
        assert [r["question_id"] for r in kept] == ["fine"]
    else:
        assert os.listdir(f"{out}.parts") == ["000000.npz"]


@pytest.mark.parametrize("command", ["decode", "record"])
def test_out_of_memory_suggests_smaller_trees_or_a_device_map(pair, tmp_path, capsys,
                                                              monkeypatch, command):
    from targetrows.hf.forward import LeanForward

    def no_memory(self, inputs, cache, feature_layers=()):  # every pass, at any batch size
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)")

    monkeypatch.setattr(LeanForward, "__call__", no_memory)
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:2])
    out = tmp_path / "out" / "o"
    out.parent.mkdir()
    args = decode_args if command == "decode" else record_args
    extra = ("--decoder", "pearl") if command == "decode" else ()
    err = run_failing(args(pair, prompts, out, *extra), capsys, out.parent, status=3)
    assert "ran out of memory" in err and "Tried to allocate 2.00 GiB" in err
    assert "--budgets" in err and "--depth" in err and "device map" in err
    assert "--target-device cuda:0,1" in err and "resources.gpu_memory_gb" in err


def test_damaged_or_unfinished_row_logs_are_not_scored(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:2])
    log = tmp_path / "rows.npz"
    assert main(["record", "--target", "toy:16:1", "--draft", "toy:0.9", "--prompts", prompts,
                 "--top-k", "3", "--depth", "2", "--max-new-tokens", "4", "--out", str(log),
                 "--quiet"]) == 0
    out = tmp_path / "scores" / "s.csv"
    out.parent.mkdir()
    data = log.read_bytes()
    (tmp_path / "torn.npz").write_bytes(data[: len(data) // 2])  # as a copy cut short leaves it
    err = run_failing(["score", str(tmp_path / "torn.npz"), "--out", str(out)], capsys,
                      out.parent)
    assert "torn.npz" in err and "truncated or corrupted" in err
    unfinished = rowlog.read(log)
    unfinished.header["complete"] = False  # what a part file of an interrupted recording says
    rowlog.write(tmp_path / "part.npz", unfinished)
    err = run_failing(["score", str(tmp_path / "part.npz"), "--out", str(out)], capsys,
                      out.parent)
    assert "part.npz" in err and "not complete" in err


def test_partial_answers_from_other_settings_are_not_reused(pair, tmp_path):
    """A leftover OUT.partial written under another decoder or prompts file is ignored, so a
    reused --out never mixes conditions into one file."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", QUESTIONS[:2])
    out = tmp_path / "a.jsonl"
    opts = ("--max-new-tokens", "6", "--top-k", "3", "--depth", "2", "--budgets", "3")
    assert main(decode_args(pair, prompts, out, "--decoder", "pearl", *opts)) == 0
    pearl = out.read_text()
    (tmp_path / "a.jsonl.partial").write_text(pearl)  # as if a pearl run had been interrupted
    assert main(decode_args(pair, prompts, out, "--decoder", "draft_rank", *opts)) == 0
    decoders = {json.loads(line)["decoder"] for line in out.read_text().splitlines()}
    assert decoders == {"draft_rank"}
    # the same decoder on an edited prompts file does not reuse answers either
    (tmp_path / "a.jsonl.partial").write_text(pearl)
    write_prompts(tmp_path / "prompts.jsonl", [dict(QUESTIONS[0], turns=["Another text."]),
                                                QUESTIONS[1]])
    assert main(decode_args(pair, prompts, out, "--decoder", "pearl", *opts)) == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert first["token_ids"] != json.loads(pearl.splitlines()[0])["token_ids"]


def test_row_log_bytes_do_not_depend_on_the_clock(tmp_path, monkeypatch):
    """numpy.savez stamps each member with the current time; row logs use a fixed one, so two
    recordings of the same rows are the same file even a second apart."""
    log = rowlog.from_segments({"temperature": 1.0, "depth": 1}, [dict(
        question="q", task="t", turn=0, stopped=False, prompt=[1, 2], trajectory=[3],
        records=[dict(position=0, scored=True, tokens=np.array([2, 5]),
                      parents=np.array([-1, 0]), logq=np.array([0.0, -0.5]),
                      edge_p=np.array([1.0, 0.25]), stale_p=np.array([0.5]),
                      root_tokens=np.array([5]), root_p=np.array([0.25]))])])
    rowlog.write(tmp_path / "a.npz", log)
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)
    rowlog.write(tmp_path / "b.npz", log)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


# -- the pipeline ------------------------------------------------------------------------------

from snakemake_env import SNAKEMAKE, snakemake_env

REPO = Path(__file__).resolve().parents[1]
PIPELINE_CONFIG = {  # one pair of saved tiny models, one task, one temperature: seconds a job
    "pairs": [{"target": "tiny-target", "draft": "tiny-draft"}],
    "models": {"tiny-target": {"source": "local", "path": "models/tiny-target"},
               "tiny-draft": {"source": "local", "path": "models/tiny-draft"}},
    "tasks": ["gsm8k"], "temperatures": [1],
    "prompts": {"source": "bundled", "n": 3},
    "pool": {"top_k": 3, "depth": 3},
    "decode": {"decoders": ["fts"], "budgets": [6, 3], "max_new_tokens": 32, "seed": 0},
    "record": {"stride": 1, "max_new_tokens": 24, "seed": 0},
    "score": {"budgets": [2, 4]},
    "threads": {"decode": 1, "record": 1},
}
PIPELINE_OUTPUTS = ("results/decode/tiny-target/gsm8k/T1/fts.jsonl",
                    "results/rows/tiny-target/gsm8k/T1.npz",
                    "results/scores/tiny-target/gsm8k/T1.csv")


def pipeline_workdir(root: Path, pair) -> Path:
    import yaml

    work = root / "work"
    for name, source in zip(("tiny-target", "tiny-draft"), pair, strict=True):
        shutil.copytree(source, work / "models" / name)
    (work / "config.yaml").write_text(yaml.safe_dump(PIPELINE_CONFIG))
    return work


def snakemake_argv(work: Path, *extra) -> list[str]:
    return [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(work), *PIPELINE_OUTPUTS,
            "--cores", "2", "--configfile", str(work / "config.yaml"), *extra]


def pipeline_env():
    return snakemake_env(HF_TOKEN="hf_FAKEpipelineTokenNeverLogged42")


@pytest.mark.slow
@needs(SNAKEMAKE is None, "snakemake is not installed (.[pipeline])")
def test_killed_pipeline_resumes_to_the_same_outputs(pair, tmp_path):
    """SIGKILL snakemake and its jobs mid-run; after `--unlock`, `--rerun-incomplete` finishes
    with the outputs of an uninterrupted run (answers but their timings, row log and scores
    byte for byte), and HF_TOKEN is in none of the files or logs."""
    plain = pipeline_workdir(tmp_path / "plain", pair)
    proc = subprocess.run(snakemake_argv(plain), capture_output=True, text=True, timeout=600,
                          env=pipeline_env())
    assert proc.returncode == 0, proc.stderr[-5000:]

    work = pipeline_workdir(tmp_path / "killed", pair)
    partial = work / (PIPELINE_OUTPUTS[0] + ".partial")
    run = subprocess.Popen(snakemake_argv(work), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, env=pipeline_env(),
                           start_new_session=True)
    deadline = time.monotonic() + 300
    while complete_lines(partial) < 1:  # decoding is under way, its first answer on disk
        assert run.poll() is None, f"snakemake ended before the kill:\n{run.stderr.read()}"
        assert time.monotonic() < deadline, "decoding did not start"
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)  # snakemake and every job it started
    run.wait(timeout=60)
    assert not (work / PIPELINE_OUTPUTS[0]).exists()

    again = subprocess.run(snakemake_argv(work, "--rerun-incomplete"), capture_output=True,
                           text=True, timeout=600, env=pipeline_env())
    if again.returncode != 0:  # a killed snakemake leaves its lock: the user unlocks first
        assert "--unlock" in again.stdout + again.stderr, again.stderr[-5000:]
        subprocess.run(snakemake_argv(work, "--unlock"), capture_output=True, timeout=300,
                       env=pipeline_env(), check=True)
        again = subprocess.run(snakemake_argv(work, "--rerun-incomplete"), capture_output=True,
                               text=True, timeout=600, env=pipeline_env())
    assert again.returncode == 0, again.stderr[-5000:]

    assert answers(work / PIPELINE_OUTPUTS[0]) == answers(plain / PIPELINE_OUTPUTS[0])
    for name in PIPELINE_OUTPUTS[1:]:
        assert (work / name).read_bytes() == (plain / name).read_bytes(), name
    leftovers = [p for p in (work / "results").rglob("*")
                 if p.name.endswith((".partial", ".parts"))]
    assert not leftovers
    token = pipeline_env()["HF_TOKEN"].encode()
    for folder in (work, plain):
        for path in folder.rglob("*"):
            if path.is_file():
                assert token not in path.read_bytes(), path
    assert token.decode() not in proc.stdout + proc.stderr + again.stdout + again.stderr
