"""What a model folder, the environment and the pipeline's names may do: a checkpoint's own code
runs only with --trust-remote-code, pickle weights are never unpickled without --allow-pickle,
HF_TOKEN never reaches a log or an output, and wildcard values cannot name a path outside
results/ and resources/."""

import inspect
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from needs import needs

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import save_tiny, save_tiny_pair

from targetrows.cli import main

REPO = Path(__file__).resolve().parents[1]
from snakemake_env import SNAKEMAKE, snakemake_env

QUESTIONS = [{"question_id": "s1", "category": "qa", "turns": ["Is this safe?"]}]
FAKE_TOKEN = "hf_FAKEtokenDoNotLeak0123456789abcdef"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), "qwen3")


def write_prompts(folder):
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return str(path)


def decode(target, prompts, out, *extra):
    return ["decode", "--target", str(target), "--prompts", prompts, "--out", str(out),
            "--decoder", "ar", "--max-new-tokens", "4", "--no-progress", *extra]


# -- model folders --------------------------------------------------------------------------


def make_custom_code_model(folder, marker):
    """A model folder whose config asks for its own Python module, which writes `marker` when
    it is imported (what a hostile checkpoint's code could do instead)."""
    path = save_tiny(folder, "llama", seed=0, n_layers=1)
    config_path = os.path.join(path, "config.json")
    config = json.loads(Path(config_path).read_text())
    config["model_type"] = "customllama"
    config["auto_map"] = {"AutoConfig": "custom_code.CustomConfig",
                          "AutoModelForCausalLM": "custom_code.CustomForCausalLM"}
    Path(config_path).write_text(json.dumps(config))
    Path(path, "custom_code.py").write_text(
        f"open({str(marker)!r}, 'w').write('the checkpoint ran code')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class CustomConfig(LlamaConfig):\n    model_type = 'customllama'\n"
        "class CustomForCausalLM(LlamaForCausalLM):\n    config_class = CustomConfig\n"
    )
    return path


def test_remote_code_runs_only_when_asked(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    model = make_custom_code_model(tmp_path / "custom", marker)
    prompts = write_prompts(tmp_path)
    out = tmp_path / "out.jsonl"
    assert main(decode(model, prompts, out)) == 2
    err = capsys.readouterr().err
    assert "custom" in err and "--trust-remote-code" in err and "own Python code" in err
    assert not marker.exists() and not out.exists()
    # the same folder with the option runs the code: the refusal above is what kept it out
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"))
    proc = subprocess.run([sys.executable, "-m", "targetrows.cli",
                           *decode(model, prompts, out, "--trust-remote-code")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists() and out.exists()


class _Payload:
    """Unpickling this runs code (writes the marker file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('unpickled')",))


def test_pickle_weights_are_not_unpickled_without_permission(tmp_path, capsys, pair):
    marker = tmp_path / "unpickled"
    prompts = write_prompts(tmp_path)
    # a folder holding only pickle weights is refused before any file is read
    hostile = tmp_path / "pickle-only"
    shutil.copytree(pair[0], hostile)
    for name in os.listdir(hostile):
        if name.endswith(".safetensors"):
            os.remove(hostile / name)
    (hostile / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    assert main(decode(hostile, prompts, tmp_path / "a.jsonl")) == 2
    err = capsys.readouterr().err
    assert "pickle-only" in err and "--allow-pickle" in err
    assert not marker.exists() and not (tmp_path / "a.jsonl").exists()
    # beside safetensors weights, a pickle file is never opened
    mixed = tmp_path / "mixed"
    shutil.copytree(pair[0], mixed)
    (mixed / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    assert main(decode(mixed, prompts, tmp_path / "b.jsonl")) == 0
    assert not marker.exists() and (tmp_path / "b.jsonl").exists()


def test_defaults_are_safe():
    import argparse

    from targetrows.cli.common import add_model_arguments
    from targetrows.hf.loading import load_model, load_pair, load_tokenizer

    for fn in (load_model, load_pair, load_tokenizer):
        params = inspect.signature(fn).parameters
        assert params["trust_remote_code"].default is False
        assert params["allow_pickle"].default is False
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(["--target", "t"])
    assert args.trust_remote_code is False and args.allow_pickle is False


def test_trust_remote_code_can_name_one_model():
    import argparse

    from targetrows.cli.common import add_model_arguments
    from targetrows.hf.loading import trusts

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    parse = parser.parse_args
    assert parse(["--trust-remote-code", "--target", "t"]).trust_remote_code == "all"
    assert parse(["--target", "t", "--trust-remote-code", "draft"]).trust_remote_code == "draft"
    values = (False, True, "all", "target", "draft")
    assert [trusts(v, "target") for v in values] == [False, True, True, True, False]
    assert [trusts(v, "draft") for v in values] == [False, True, True, False, True]
    with pytest.raises(ValueError, match="'both'"):
        trusts("both", "draft")


def test_pipeline_never_turns_on_remote_code_or_pickle():
    """Only a user's own config can pass these options (a model's `trust_remote_code: true`,
    read by common.smk's `trust_args`, or `args`); no rule or script turns them on."""
    hits = []
    for folder in ("workflow", "config"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in (".smk", ".py", ".yaml", ".yml", ".sh", ""):
                text = path.read_text(errors="replace")
                if path.name == "common.smk":
                    text = re.sub(r"\ndef trust_args\(.*?\n\n\n", "\n", text, flags=re.S)
                for needle in ("--trust-remote-code", "--allow-pickle", "trust_remote_code=True",
                               "allow_pickle=True", "trust_remote_code: true"):
                    if needle in text:
                        hits.append(f"{path.relative_to(REPO)}: {needle}")
    assert not hits


# -- the token ------------------------------------------------------------------------------


def test_hf_token_never_appears_in_logs_or_outputs(tmp_path, pair):
    target, draft = pair
    prompts = write_prompts(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    commands = [
        ["decode", "--target", target, "--draft", draft, "--prompts", prompts, "--decoder",
         "fts", "--budgets", "4", "--max-new-tokens", "6", "--top-k", "3", "--depth", "2",
         "--out", str(out / "answers.jsonl")],
        ["record", "--target", target, "--draft", draft, "--prompts", prompts, "--top-k", "3",
         "--depth", "2", "--max-new-tokens", "4", "--out", str(out / "rows.npz")],
        ["score", str(out / "rows.npz"), "--budgets", "2", "4", "--out", str(out / "s.csv")],
        # failures print messages too: a hub id that cannot be reached, a missing folder
        ["decode", "--target", "some-owner/missing-model", "--prompts", prompts, "--decoder",
         "ar", "--out", str(out / "never.jsonl")],
        ["record", "--target", str(tmp_path / "nowhere"), "--draft", draft, "--prompts",
         prompts, "--out", str(out / "never.npz")],
    ]
    driver = ("import sys\nfrom targetrows.cli import main\n"
              f"for argv in {commands!r}:\n"
              "    print('status', main(argv), file=sys.stderr)\n")
    env = dict(os.environ, HF_TOKEN=FAKE_TOKEN, HUGGING_FACE_HUB_TOKEN=FAKE_TOKEN,
               TRANSFORMERS_VERBOSITY="debug", HF_HUB_VERBOSITY="debug")
    proc = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    statuses = re.findall(r"^status (\d+)$", proc.stderr, re.M)
    assert statuses == ["0", "0", "0", "2", "2"], proc.stderr[-3000:]
    assert FAKE_TOKEN not in proc.stdout + proc.stderr
    assert "some-owner/missing-model" in proc.stderr  # the failures did print their messages
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"answers.jsonl", "rows.npz", "s.csv"}
    for path in written:
        assert FAKE_TOKEN.encode() not in path.read_bytes(), path


# -- wildcards ------------------------------------------------------------------------------

needs_snakemake = needs(SNAKEMAKE is None, "snakemake is not installed (pip install -e .[pipeline])")


def test_every_wildcard_is_constrained():
    """Every wildcard in a rule's file patterns has a global constraint in common.smk."""
    text = (REPO / "workflow" / "rules" / "common.smk").read_text()
    block = text.split("wildcard_constraints:", 1)[1].split("\n\n", 1)[0]
    constrained = set(re.findall(r"^\s+(\w+)=alternation\(", block, re.M))
    used = set()
    for rules in (REPO / "workflow" / "rules").glob("*.smk"):
        source = rules.read_text()
        # plain string patterns under results/ or resources/ (not f-strings, not expand()'s)
        for m in re.finditer(r'(?<![\w])"((?:results|resources)/[^"]*)"', source):
            if not source[: m.start()].rstrip().endswith("expand("):
                used |= set(re.findall(r"\{(\w+)\}", m.group(1)))
    assert {"pair", "target", "task", "temperature", "decoder", "model"} <= used
    assert used <= constrained, used - constrained


def dry_run(work, *args):
    env = snakemake_env()
    return subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(work),
                           "-n", *args], capture_output=True, text=True, timeout=300, env=env)


def _custom_pair_config(folder, target, draft, trust):
    import yaml

    cfg = yaml.safe_load((REPO / "tests" / "pipeline_config" / "config.yaml").read_text())
    cfg["pairs"] = [{"target": "custom", "draft": "plain"}]
    cfg["models"] = {"custom": {"source": "local", "path": str(target), "trust_remote_code": trust},
                     "plain": {"source": "local", "path": str(draft)}}
    cfg.update(tasks=["gsm8k"], temperatures=[0])
    cfg["prompts"]["n"] = 1
    cfg["decode"].update(decoders=["draft_rank"], budgets=[3], decoder_budgets={}, max_new_tokens=4)
    path = folder / f"trust-{trust}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@needs_snakemake
def test_pipeline_runs_a_models_code_only_when_its_config_allows(tmp_path):
    """`trust_remote_code: true` on the target lets its code run, and nothing else's: the draft
    beside it still loads without the option."""
    marker = tmp_path / "code-ran"
    target = make_custom_code_model(tmp_path / "custom", marker)
    draft = save_tiny(tmp_path / "plain", "llama", seed=1, n_layers=1)
    env = snakemake_env(HF_HOME=str(tmp_path / "hf-home"))
    out = "results/decode/custom/gsm8k/T0/draft_rank.jsonl"
    for trust in (False, True):
        work = tmp_path / f"work-{trust}"
        work.mkdir()
        config = _custom_pair_config(tmp_path, target, draft, trust)
        proc = subprocess.run([SNAKEMAKE, out, "-s", str(REPO / "Snakefile"), "--directory",
                               str(work), "--cores", "1", "--configfile", config],
                              capture_output=True, text=True, timeout=300, env=env)
        log = work / "results/logs/decode/custom/T0/draft_rank.log"
        if not trust:  # the first job to load the pair, the part-times job, refuses
            first = work / "results/logs/parts/custom.log"
            assert proc.returncode != 0 and not marker.exists()
            assert "trust_remote_code: true" in first.read_text(), first.read_text()[-2000:]
            assert not (work / out).exists()
        else:
            assert proc.returncode == 0, proc.stderr[-3000:] + log.read_text()[-2000:]
            assert marker.exists() and (work / out).exists()


@needs_snakemake
def test_names_outside_the_config_make_no_job(tmp_path):
    """Asking for a file under a name the config does not define, or one that climbs out with
    '..', matches no rule: no job could write it."""
    config = str(REPO / "config" / "config.yaml")
    for target in ("results/decode/evil/gsm8k/T0/ar.jsonl",
                   "results/rows/smollm2-135m-instruct/../../../escape/T0.npz",
                   "resources/models/evil"):
        proc = dry_run(tmp_path, target, "--configfile", config)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "No rule to produce" in out, out[-2000:]


@needs_snakemake
def test_model_names_that_climb_out_are_rejected(tmp_path):
    import yaml

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["models"]["../outside"] = {"source": "local", "path": "models/x"}
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = dry_run(tmp_path, "--configfile", str(config))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config key models" in out and "../outside" in out, out[-2000:]
