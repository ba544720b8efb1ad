"""`spade validate` and `spade seeds` from the command line: exit codes, exact JSONL, messages."""

import os
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from stages import seed_library

runner = CliRunner()


def seeds_jsonl():
    result = runner.invoke(app, ["seeds"])
    assert result.exit_code == 0
    return result.stdout


def test_seeds_prints_one_design_per_file():
    lines = seeds_jsonl().splitlines()
    assert len(lines) == len(seed_library.files())
    assert all(orjson.loads(line)["kind"] == "design" for line in lines)


def test_seeds_examples_prints_the_examples_tier_and_one_tier_at_a_time():
    result = runner.invoke(app, ["seeds", "--examples", "--domain", "tool_use"])
    assert result.exit_code == 0, result.stderr
    records = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [r["meta"]["source_file"] for r in records] == \
        [str(p.relative_to(seed_library.HERE)) for p in seed_library.example_files("tool_use")]
    assert len(records) == 6 and {r["domain"] for r in records} == {"tool_use"}
    both = runner.invoke(app, ["seeds", "--examples", "--starter"])
    assert both.exit_code == 2 and both.stdout == ""
    assert "--starter and --examples" in both.stderr and both.stderr.count("\n") == 1


def test_validate_stdin_to_stdout_matches_shipped_shard(nsjail_ok):
    result = runner.invoke(app, ["validate", "--seed", "0", "-"], input=seeds_jsonl())
    assert result.exit_code == 0, result.stderr
    assert result.stdout.encode() == seed_library.ENV_SHARD.read_bytes()
    assert "validate: " in result.stderr and "rejected" in result.stderr


def test_validate_a_py_file_prints_the_env(nsjail_ok):
    path = seed_library.files("game")[0]
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.stderr
    record = orjson.loads(result.stdout)
    assert record["kind"] == "env" and record["source"] == path.read_text()


BROKEN = ("class BrokenEnv:\n    def reset(self, seed=None):\n        return 'x'\n"
          "    def step(self, action):\n        return 'x', 0.0, False, False, {}\n"
          "    def solution(self):\n        return ['a']\n")


def test_validate_a_broken_py_file_prints_the_reject(tmp_path, nsjail_ok):
    path = tmp_path / "broken_env.py"
    path.write_text(BROKEN)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 65
    record = orjson.loads(result.stdout)
    assert record["kind"] == "validation" and record["check"] == "reset"
    assert record["meta"]["source_file"] == str(path)
    assert f"{path}: rejected by reset: " in result.stderr
    assert "(reset 1)" in result.stderr
    assert "every design was rejected (1)" in result.stderr


def test_each_file_gets_a_verdict_line_and_its_records_name_it(tmp_path, nsjail_ok):
    good = seed_library.files("game")[0]
    broken = tmp_path / "broken_env.py"
    broken.write_text(BROKEN)
    result = runner.invoke(app, ["validate", str(good), str(broken)])
    assert result.exit_code == 0, result.stderr  # one env accepted
    env, reject = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert env["kind"] == "env" and env["meta"]["source_file"] == str(good)
    assert reject["kind"] == "validation" and reject["meta"]["source_file"] == str(broken)
    lines = result.stderr.splitlines()
    assert f"{good}: accepted ({env['id']})" in lines
    assert any(line.startswith(f"{broken}: rejected by reset: ") for line in lines)


def test_all_rejected_exits_65_on_reruns_too_unless_allowed(tmp_path, nsjail_ok):
    broken = tmp_path / "broken_env.py"
    broken.write_text(BROKEN)
    out = tmp_path / "checked"
    for _ in range(2):  # the second run finds the shard done and still knows the verdict
        result = runner.invoke(app, ["validate", str(broken), "-o", str(out)])
        assert result.exit_code == 65, result.stderr
    allowed = runner.invoke(app, ["validate", str(broken), "-o", str(out),
                                  "--allow-all-rejected"])
    assert allowed.exit_code == 0, allowed.stderr


def test_a_directory_of_another_kind_says_what_it_skipped(tmp_path):
    plays = tmp_path / "rollout-dir"
    plays.mkdir()
    (plays / "rollout-00000.jsonl").write_text(
        "".join(f'{{"kind":"rollout","v":1,"env_id":"env_x","seed":{i}}}\n' for i in range(3)))
    result = runner.invoke(app, ["validate", str(plays)])
    assert result.exit_code == 65 and result.stdout == ""
    assert (f"spade validate: error: {plays}: skipped 3 rollout records: validate reads design "
            "records and .py files") in result.stderr


def test_directory_output_resumes(tmp_path, nsjail_ok):
    shard = tmp_path / "designs.jsonl"
    shard.write_text(seeds_jsonl())
    out = tmp_path / "envs"
    first = runner.invoke(app, ["validate", str(shard), "-o", str(out)])
    assert first.exit_code == 0, first.stderr
    assert sorted(os.listdir(out)) == ["_manifest.json", "env-00000.jsonl"]
    again = runner.invoke(app, ["validate", str(shard), "-o", str(out)])
    assert again.exit_code == 0 and "1 shards already done" in again.stderr


def test_bad_line_exits_65_with_path_and_line(tmp_path):
    shard = tmp_path / "designs.jsonl"
    shard.write_text(seeds_jsonl().splitlines()[0] + "\n{\"kind\": \"design\", \"slot\": []}\n")
    result = runner.invoke(app, ["validate", str(shard)])
    assert result.exit_code == 65
    assert f"spade validate: error: {shard}:2: field 'slot'" in result.stderr


def test_newer_version_exits_65(tmp_path):
    shard = tmp_path / "designs.jsonl"
    shard.write_text('{"kind":"design","v":99}\n')
    result = runner.invoke(app, ["validate", str(shard)])
    assert result.exit_code == 65 and "written by a newer spade" in result.stderr


def test_wrong_kind_exits_65():
    result = runner.invoke(app, ["validate", "-"], input=seed_library.ENV_SHARD.read_text())
    assert result.exit_code == 65 and "<stdin>: no design records, only 16 env" in result.stderr


def test_missing_input_exits_66(tmp_path):
    result = runner.invoke(app, ["validate", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 66 and "no such file or directory" in result.stderr


def test_unreadable_jail_interpreter_exits_69(tmp_path, monkeypatch):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.write_text("")
    os.chmod(private, 0o700)
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("SPADE_JAIL_PYTHON", str(python))
    result = runner.invoke(app, ["validate", str(seed_library.files("game")[0])])
    assert result.exit_code == 69 and "not readable by uid nobody" in result.stderr


def test_bad_sandbox_option_exits_2():
    result = runner.invoke(app, ["validate", "--sandbox", "docker", "-"], input="")
    assert result.exit_code == 2 and "--sandbox must be nsjail or none" in result.stderr


def test_empty_input_is_nothing_to_do():
    result = runner.invoke(app, ["validate", "-"], input="")
    assert result.exit_code == 0 and result.stdout == ""


def test_a_stage_reads_its_own_kind_from_a_mixed_stream(tmp_path):
    """A pipe carries env and validation records; the next stage reads its own kind."""
    from stages.shards import Stats, find_shards, run_stage

    mixed = tmp_path / "checked.jsonl"
    env_line = seed_library.ENV_SHARD.read_text().splitlines()[0]
    reject = '{"kind":"validation","v":1,"check":"parse","error":{"type":"parse","msg":"x"}}'
    mixed.write_text(f"{reject}\n{env_line}\n")
    seen = []
    run_stage("hint", find_shards([str(mixed)]), str(tmp_path / "out.jsonl"),
              lambda records: (seen.append(r.kind) or r for r in records), {}, Stats(),
              kinds={"env"})
    assert seen == ["env"]


def test_budget_bounds_an_env_whose_every_call_is_slow_but_legal(tmp_path, nsjail_ok):
    slow = tmp_path / "slow_env.py"
    slow.write_text("class SlowEnv:\n    def reset(self, seed=None):\n"
                    "        sum(range(40_000_000))\n        return 'obs', {}\n"
                    "    def step(self, action):\n        sum(range(40_000_000))\n"
                    "        return 'obs', 0.0, False, False, {}\n"
                    "    def solution(self):\n        return ['\\\\boxed{a}']\n")
    result = runner.invoke(app, ["validate", str(slow), "--budget", "2"])
    record = orjson.loads(result.stdout)
    assert record["check"] == "resources" and record["outcome"] == "timeout"


REFERENCE = Path(__file__).parents[1] / "fixtures" / "validate" / "reference"


@pytest.mark.slow
def test_envs_without_an_oracle_are_named_in_their_verdict_and_the_summary(nsjail_ok):
    result = runner.invoke(app, ["validate", str(REFERENCE / "code_lock.py"),
                                 str(REFERENCE / "clock_arithmetic.py")])
    assert result.exit_code == 0, result.stderr
    code_lock, clock = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert code_lock["meta"]["oracle"] == "none" and "oracle" not in clock["meta"]
    lines = result.stderr.splitlines()
    assert f"{REFERENCE / 'code_lock.py'}: accepted ({code_lock['id']}; oracle: none, it has no " \
        "solution())" in lines
    assert f"{REFERENCE / 'clock_arithmetic.py'}: accepted ({clock['id']})" in lines
    assert any(line.startswith("validate: 2 designs -> 2 envs (1 with oracle: none), 0 rejected")
               for line in lines)


def test_a_file_that_is_not_utf8_is_bad_input(tmp_path):
    env = tmp_path / "latin.py"
    env.write_bytes(b"# caf\xe9\nclass XEnv: pass\n")
    result = runner.invoke(app, ["validate", str(env)])
    assert result.exit_code == 65
    assert f"{env}: not UTF-8 text (byte 5)" in result.stderr
