"""Env-derived text on its way to a person: escape sequences stay inert, rich markup stays text,
and a damaged shard is one error line (exit 65) naming the file."""

import logging

import pytest
from typer.testing import CliRunner

from spade_cli.app import app, setup_logging
from spade_cli.errors import DATA, errors_to_exit
from spade_cli.summary import summarize
from spade_cli.terminal import terminal_safe
from stages.records import Memory, RecordError, dumps
from stages.shards import Stats, write_atomic

# colour, clear screen, an OSC window title, an OSC 8 hyperlink, a C1 CSI, a carriage return
HOSTILE = "\x1b[31mred\x1b[2J\x1b]0;owned\x07\x1b]8;;http://x.test\x1b\\link\x9b1m\rover"
MARKUP = "[/] [bold]b[/bold] $\\undefinedmacro{x}^$"
runner = CliRunner()


def assert_inert(text: str) -> None:
    assert not any(ch in text for ch in "\x1b\x07\x9b\r"), repr(text)


def test_terminal_safe_writes_controls_out_and_keeps_text_newlines_and_tabs():
    assert terminal_safe(HOSTILE) == ("\\x1b[31mred\\x1b[2J\\x1b]0;owned\\x07"
                                      "\\x1b]8;;http://x.test\\x1b\\link\\x9b1m\\x0dover")
    assert terminal_safe("a\tb\nc é 日本 [/]") == "a\tb\nc é 日本 [/]"
    assert terminal_safe("\u202egnp.exe \ud800") == "\\u202egnp.exe \\ud800"


def test_summary_line_and_run_log_are_inert(capsys, tmp_path, monkeypatch):
    from spade_cli import summary

    monkeypatch.setattr(summary, "_run_log", None)
    summary.open_run_log(tmp_path / "run.log")
    stats = Stats()
    stats.reasons[f"program_error: {HOSTILE}"] += 1
    summarize("validate", stats, "1 designs -> 0 envs")
    err = capsys.readouterr().err
    assert_inert(err)
    assert "program_error: \\x1b[31mred" in err
    assert_inert((tmp_path / "run.log").read_text())


def test_error_line_is_inert(capsys):
    with pytest.raises(SystemExit) as exit_info:
        with errors_to_exit("validate"):
            raise RecordError(f"field 'skill': {HOSTILE}", "designs.jsonl:3")
    assert exit_info.value.code == DATA
    err = capsys.readouterr().err
    assert_inert(err)
    assert err.startswith("spade validate: error: designs.jsonl:3: field 'skill': \\x1b[31m")


def test_log_lines_are_inert(capsys):
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        setup_logging(logging.INFO)
        logging.getLogger("stages.validate").warning("env failed: %s", HOSTILE)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    err = capsys.readouterr().err
    assert_inert(err)
    assert "env failed: \\x1b[31mred" in err


def test_memory_show_prints_markup_and_escapes_as_text(tmp_path):
    path = tmp_path / "memory.jsonl"
    write_atomic(path, [dumps(Memory(env_id="env_a", skill=MARKUP,
                                     snippet=f"class A:  {HOSTILE}"))])
    result = runner.invoke(app, ["memory", "show", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.stderr
    assert_inert(result.stdout)
    assert MARKUP in result.stdout and "\\x1b]0;owned\\x07" in result.stdout


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_cut_off_compressed_shard_is_exit_65_naming_the_file(tmp_path, suffix):
    path = tmp_path / f"memory{suffix}"
    write_atomic(path, [dumps(Memory(env_id=f"env_{i}", snippet="x" * 200)) for i in range(50)])
    path.write_bytes(path.read_bytes()[:-8])
    result = runner.invoke(app, ["memory", "show", str(path)])
    assert result.exit_code == DATA
    assert result.stderr.startswith(f"spade memory show: error: {path}: not a complete ")
