"""`spade eval` from the command line: exit codes, eval records on stdout, the table on stderr."""

import sys
from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from spade_cli import eval as command
from stages.backends.scripted import ScriptedBackend

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"
QA = FIXTURES / "qa.jsonl"
RIGHT = {"What is 2 + 3?": "5", "Write one thousand in digits.": "1000",
         "What is one half as a decimal?": "1/2",
         "Which option is a prime? (A) 4 (B) 7 (C) 9": "B", "Name the capital of France.": "Paris"}

runner = CliRunner()
app = typer.Typer()


@app.callback()
def main() -> None:
    """A local app: spade_cli/app.py registers `eval` the same way."""


command.register(app)


def answer(messages, tools):
    question = messages[-1]["content"].split("Problem:\n", 1)[1].strip()
    return f"\\boxed{{{RIGHT.get(question, '?')}}}"


@pytest.fixture
def scripted(monkeypatch):
    import stages.backends
    from spade_cli import options

    monkeypatch.setattr(stages.backends, "load_backend",
                        lambda spec: ScriptedBackend(answer, policy=f"scripted:{spec.model}"))
    monkeypatch.setattr(options, "check_model", lambda model: model)  # no model folder to find


@pytest.fixture
def model(tmp_path):
    """A model directory (never loaded: the backend is scripted)."""
    path = tmp_path / "model"
    path.mkdir()
    return str(path)


def test_file_suite_writes_eval_records_and_a_summary(scripted, model):
    result = runner.invoke(app, ["eval", "--suite", "file", "--data", str(QA), "--model", model,
                                 "--round", "4"])
    assert result.exit_code == 0, result.stderr
    records = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 5 + 4 and all(r["kind"] == "eval" for r in records)
    assert all(r["suite"] == "qa" and r["round"] == 4 and r["policy"] == f"scripted:{model}"
               for r in records)
    assert records[-1]["category"] == "overall" and records[-1]["score"] == 1.0
    assert records[-1]["samples"] == 5 and records[-1]["ci_low"] == pytest.approx(0.5655, abs=1e-3)
    assert "spade eval" in result.stderr and "95% CI" in result.stderr
    assert "overall" in result.stderr and "eval: qa: 5 items, overall 1.000" in result.stderr


def test_directory_output_resumes(scripted, tmp_path, model):
    args = ["eval", "--suite", "file", "--data", str(QA), "--model", model, "-o", str(tmp_path)]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.stderr
    written = (tmp_path / "eval-00000.jsonl").read_bytes()
    assert len(written.splitlines()) == 9 and (tmp_path / "_manifest.json").exists()
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "already done" in again.stderr
    assert "overall" in again.stderr  # the table comes from the shard already written
    assert (tmp_path / "eval-00000.jsonl").read_bytes() == written


@pytest.mark.parametrize("args, message", [
    (["--suite", "nope"], "--suite must be one of"),
    ([], "--suite is required (or --compare BASE TRAINED)"),
    (["--suite", "file"], "needs --data"),
    (["--suite", "aime"], "--suite aime needs --data PATH"),
    (["--suite", "lcb"], "--suite lcb needs --data PATH"),
    (["--suite", "rg-quick", "--data", "x.jsonl"], "belong to --suite aime, gpqa, lcb, file"),
    (["--compare", "a", "b", "--suite", "rg-quick"], "--compare reads two finished evals"),
    (["--suite", "rg-quick", "envs.jsonl"], "positional inputs"),
    (["--suite", "rg-quick", "--model", ""], "--model is required"),
    (["--suite", "rg-quick", "--sample", "2"], "--sample draws env records for --suite envs"),
])
def test_usage_errors_exit_2(args, message, scripted, model):
    result = runner.invoke(app, ["eval", "--model", model, *args])
    assert result.exit_code == 2 and message in result.stderr


@pytest.mark.parametrize("suite, package, hint", [
    (["bfcl-mt"], "bfcl_eval", "--no-deps bfcl-eval"),
    (["rg-hard"], "reasoning_gym", "reasoning-gym"),
    (["aime", "--data", str(FIXTURES / "aime.jsonl")], "math_verify", "math-verify")])
def test_missing_package_exits_69_with_the_install_hint(suite, package, hint, scripted,
                                                        monkeypatch, model):
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)
    result = runner.invoke(app, ["eval", "--suite", *suite, "--model", model])
    assert result.exit_code == 69 and hint in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("suite", ["file", "aime", "gpqa", "lcb"])
def test_missing_data_file_exits_66(suite, scripted, tmp_path, model):
    result = runner.invoke(app, ["eval", "--suite", suite, "--data", str(tmp_path / "no.jsonl"),
                                 "--model", model])
    assert result.exit_code == 66 and "no.jsonl: no such file" in result.stderr


def test_a_category_with_markup_and_escapes_prints_as_text_on_every_rerun(scripted, tmp_path):
    category = "[/] [bold]x $\\undefinedmacro{x}^$ \x1b]0;owned\x07\x1b[2J"
    data = tmp_path / "qa.jsonl"
    data.write_bytes(orjson.dumps({"question": "What is 2 + 3?", "answer": "5",
                                   "category": category}) + b"\n")
    args = ["eval", "--suite", "file", "--data", str(data), "--model", str(tmp_path), "-o",
            str(tmp_path / "out")]
    for attempt in ("first", "rerun"):
        result = runner.invoke(app, args, env={"COLUMNS": "300"})
        assert result.exit_code == 0, f"{attempt}: {result.stderr}"
        assert "[/] [bold]x $\\undefinedmacro{x}^$ \\x1b]0;owned\\x07\\x1b[2J" in result.stderr
        assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_each_suite_runs_under_its_protocol_unless_told_otherwise(scripted, tmp_path, model):
    pytest.importorskip("math_verify")
    base = ["eval", "--suite", "aime", "--data", str(FIXTURES / "aime.jsonl"), "-m", model]
    runs = {"protocol": [], "told": ["--temperature", "0.3", "-n", "2"]}
    for label, extra in runs.items():
        result = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / label)])
        assert result.exit_code == 0, result.stderr
    protocol, told = (orjson.loads((tmp_path / label / "_manifest.json").read_bytes())["config"]
                      for label in runs)
    assert {k: protocol[k] for k in ("episodes", "temperature", "top_p", "top_k", "max_tokens")
            } == {"episodes": 64, "temperature": 1.0, "top_p": 0.95, "top_k": 20,
                  "max_tokens": 32768}
    assert (told["episodes"], told["temperature"], told["top_k"]) == (2, 0.3, 20)


def test_compare_prints_the_papers_table_with_paired_intervals(tmp_path, monkeypatch, model):
    import stages.backends

    replies = {"base": lambda m, t: "\\boxed{5}", "trained": answer}
    for label, reply in replies.items():
        monkeypatch.setattr(stages.backends, "load_backend",
                            lambda spec, reply=reply: ScriptedBackend(reply))
        result = runner.invoke(app, ["eval", "--suite", "file", "--data", str(QA), "-m", model,
                                     "-o", str(tmp_path / label)])
        assert result.exit_code == 0, result.stderr
    result = runner.invoke(app, ["eval", "--compare", str(tmp_path / "base"),
                                 str(tmp_path / "trained")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("qa" in line and "average" in line for line in lines)
    # base answers "5" everywhere: right on 1 of 5 questions; trained: all 5
    assert any("base:" in line and "20.0" in line for line in lines)
    assert any("trained:" in line and "100.0" in line for line in lines)
    assert any("difference" in line and "+80.0" in line for line in lines)
    assert any("95% CI" in line and "[+40.0, +100.0]" in line for line in lines)
    missing = runner.invoke(app, ["eval", "--compare", str(tmp_path / "nope"),
                                  str(tmp_path / "trained")])
    assert missing.exit_code == 66


def test_an_evaluated_checkpoint_is_marked_so_pruning_keeps_it(tmp_path):
    from spade_cli.eval import keep_evaluated
    from stages import train

    ckpt = tmp_path / "ckpt"
    for step in (1, 2, 3):
        (ckpt / f"step-{step:06d}").mkdir(parents=True)
        (ckpt / f"step-{step:06d}" / train.STATE_FILE).write_text("{}")
    keep_evaluated(str(ckpt / "step-000001"), "runs/x/r00/eval-rg-hard", "rg-hard")
    keep_evaluated(str(tmp_path / "plain-model"), "out", "rg-hard")  # not a checkpoint: no mark
    assert not (tmp_path / "plain-model").exists()
    train.prune_checkpoints(str(ckpt), 1)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-000001", "step-000003"]


def test_envs_sample_plays_the_same_seeded_envs_in_any_input_order(monkeypatch, tmp_path, model,
                                                                    nsjail_ok):
    import stages.backends
    from spade_cli import options
    from stages import seed_library
    from stages.records import seeded_sample
    from stages.shards import read

    monkeypatch.setattr(stages.backends, "load_backend", lambda spec: ScriptedBackend(
        lambda messages, tools: "\\boxed{a}", policy="scripted"))
    monkeypatch.setattr(options, "check_model", lambda model: model)
    envs = list(read([str(seed_library.ENV_SHARD)], {"env"}))[:4]
    chosen = []
    for name, order in (("forward", envs), ("backward", envs[::-1])):
        shard = tmp_path / f"{name}.jsonl"
        shard.write_bytes(b"".join(orjson.dumps(env.to_dict()) + b"\n" for env in order))
        result = runner.invoke(app, ["eval", "--suite", "envs", "--sample", "2", "--seed", "5",
                                     "--episodes", "1", "--model", model, str(shard)])
        assert result.exit_code == 0, result.stderr
        items = [orjson.loads(line) for line in result.stdout.splitlines()]
        chosen.append([item["task"] for item in items if item["task"]])
    assert chosen[0] == chosen[1] == [env.id for env in seeded_sample(envs, 2, 5)]
