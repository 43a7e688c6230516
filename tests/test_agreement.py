"""`targetrows agreement`: a draft's agreement with its target per task, online (the round loop at
budget 1) and, for an EAGLE-3 head, teacher-forced (CPU, tiny random weights)."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_heads import save_tiny_head
from tiny_models import save_tiny, tiny_model

from targetrows.cli import main
from targetrows.train.agreement import AgreementConfig, agreement_report, pooled

QUESTIONS = {
    "qa": [{"question_id": 1, "category": "qa", "turns": ["What is a cat?"]},
           {"question_id": 2, "category": "qa", "turns": ["Why is the sky blue?", "And red?"]}],
    "code": [{"question_id": 3, "category": "code", "turns": ["def add(a, b):"]}],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agreement")
    target = save_tiny(folder / "target", "llama", seed=0, n_layers=4)
    head = save_tiny_head(folder / "head", tiny_model("llama", n_layers=4).config,
                          draft_vocab_size=120)
    files = []
    for task, questions in QUESTIONS.items():
        path = folder / f"{task}.jsonl"
        path.write_text("".join(json.dumps(q) + "\n" for q in questions))
        files.append(str(path))
    return target, head, files


def test_a_draft_that_is_the_target_always_agrees(models):
    """At temperature 0 the target's own guess is always its next token: every round accepts
    its one drafted token, whatever the task; a standalone draft has no teacher-forced figure."""
    target, _, files = models
    report = agreement_report(target, target, files, AgreementConfig(max_new_tokens=8))
    assert report["online_b1"] == 1.0
    assert {t: v["online_b1"] for t, v in report["tasks"].items()} == {"qa": 1.0, "code": 1.0}
    assert {t: v["prompts"] for t, v in report["tasks"].items()} == {"qa": 2, "code": 1}
    assert "teacher_forced_top1" not in report


def test_a_heads_figures_per_task_and_pooled(models):
    target, head, files = models
    report = agreement_report(target, head, files, AgreementConfig(max_new_tokens=8, depth=3))
    tasks = report["tasks"]
    for t in tasks.values():
        chain = t["chain_acceptance_by_depth"]
        assert chain[0] == t["teacher_forced_top1"] and chain == sorted(chain, reverse=True)
        assert 0 <= t["online_b1"] <= 1 and t["rounds"] >= 8 // 2 * t["prompts"]
        # the greedy reply's positions, each predicting its next token (stops end it early)
        assert 1 <= t["positions"] <= 8 * t["prompts"]
    assert report["teacher_forced_top1"] == pytest.approx(
        pooled(tasks, "teacher_forced_top1", "positions"))
    assert report["online_b1"] == pytest.approx(pooled(tasks, "online_b1", "rounds"))
    assert min(t["online_b1"] for t in tasks.values()) <= report["online_b1"] <= max(
        t["online_b1"] for t in tasks.values())


def test_the_command_writes_the_report_and_the_table(models, tmp_path, capsys):
    target, head, files = models
    out = tmp_path / "a.json"
    assert main(["agreement", "--target", target, "--draft", head, "--prompts", *files,
                 "--max-new-tokens", "6", "--depth", "2", "--json", str(out),
                 "--table", str(tmp_path / "a.md")]) == 0
    table = (tmp_path / "a.md").read_text()
    assert table == capsys.readouterr().out
    assert table.splitlines()[0] == ("| task | prompts | online B=1 | teacher-forced top-1 | "
                                     "chain 1 | chain 2 |")
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == ["| qa", "| code", "| all"]
    assert json.loads(out.read_text())["config"]["depth"] == 2
    assert main(["agreement", "--target", target, "--draft", head, "--prompts",
                 str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
