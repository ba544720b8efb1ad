"""`spade ... --help` as a newcomer reads it, and what stderr shows besides spade's own lines."""

import logging

import pytest
from typer.testing import CliRunner

from spade_cli import app as app_module
from spade_cli.app import app

runner = CliRunner()
STAGES = ["run", "seeds", "design", "validate", "audit", "hint", "rollout", "score-regret",
          "train-grpo", "eval", "model tiny", "model smollm2"]


def help_text(command: str) -> str:
    result = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", STAGES)
def test_help_has_an_example_and_no_python_type_names(command):
    text = help_text(command)
    assert "Example" in text and f"spade {command}" in text
    for python_type in ("<bool>", "<str>", "<int", "<float", "<list[", "<tuple"):
        assert python_type not in text


def test_validate_help_names_py_files_and_the_exit_status():
    text = help_text("validate")
    assert ".py env files" in text and "65 when every design" in text


@pytest.mark.parametrize("command", ["design", "hint", "audit", "rollout", "train-grpo"])
def test_model_is_marked_required(command):
    assert "[required]" in help_text(command).split("--model", 1)[1].split("--", 1)[0]


def test_eval_says_when_its_model_is_required():
    """`spade eval --compare BASE TRAINED` reads two eval outputs and loads no model."""
    text = " ".join(help_text("eval").replace("│", " ").split())
    assert "model name (openai). Required, except with --compare." in text


def test_libraries_info_lines_and_bars_stay_off_stderr(capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert runner.invoke(app, ["seeds", "--paths"]).exit_code == 0
    assert app_module.os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    app_module.setup_logging(logging.INFO)
    logging.getLogger("sentence_transformers.base.model").info("Loading SentenceTransformer")
    logging.getLogger("stages.report").info("our own line")
    logging.getLogger("sentence_transformers.base.model").warning("a library warning")
    err = capsys.readouterr().err
    assert "Loading SentenceTransformer" not in err
    assert "our own line" in err and "a library warning" in err
