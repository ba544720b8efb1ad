"""`spade registry export --rounds A-B` and `--sample N --seed S`: envs by the round they were
first accepted in, a sample that is the same for the same registry and seed, and one-line exit-2
errors for a bad range."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from tests.stages.test_registry import SOURCE, env, make_run, write

runner = CliRunner()


@pytest.fixture
def three_rounds(tmp_path, monkeypatch):
    """The registry tests' one-round run plus r02: a new program, and round 0's env again."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPADE_REGISTRY", raising=False)
    made = make_run(tmp_path)
    later = env(SOURCE.replace("pick a", "pick c"), "des_1111111111111111")
    write(made["run"] / "r02" / "validate-a0", [later, env(SOURCE, made["good"].id)])
    result = runner.invoke(app, ["registry", "index", "runs/t"])
    assert result.exit_code == 0, result.stderr
    return {**made, "later": later}


def exported_ids(*options: str) -> list[str]:
    result = runner.invoke(app, ["registry", "export", *options])
    assert result.exit_code == 0, result.stderr
    return [orjson.loads(line)["id"] for line in result.stdout.splitlines()]


def by_digest(ids: list[str], seed: int) -> list[str]:
    return sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())


def test_envs_by_the_round_they_were_first_accepted_in(three_rounds):
    early = {three_rounds["env"].id, three_rounds["other"].id}
    assert set(exported_ids("--rounds", "0")) == early
    assert exported_ids("--rounds", "1-2") == [three_rounds["later"].id]
    assert exported_ids("--rounds", "2") == [three_rounds["later"].id]  # not the re-accepted one
    assert exported_ids("--rounds", "3-9") == []
    assert set(exported_ids("--rounds", "0-2")) == early | {three_rounds["later"].id}


def test_a_sample_is_the_smallest_digests_of_seed_and_id(three_rounds):
    ids = [three_rounds[k].id for k in ("env", "other", "later")]
    for seed in (0, 7):
        first = exported_ids("--sample", "2", "--seed", str(seed))
        assert first == by_digest(ids, seed)[:2]
        assert exported_ids("--sample", "2", "--seed", str(seed)) == first
    assert exported_ids("--sample", "9") == by_digest(ids, 0)  # fewer than asked: all of them
    assert exported_ids("--rounds", "0", "--sample", "5") == by_digest(ids[:2], 0)


def test_a_sample_does_not_depend_on_the_order_rows_were_indexed_in(three_rounds, tmp_path):
    # a second registry indexing the rounds the other way round: r02 first, then r00
    r00 = three_rounds["run"] / "r00"
    hidden = r00.rename(tmp_path / "aside")
    db = str(tmp_path / "other.db")
    assert runner.invoke(app, ["registry", "index", "runs/t", "--db", db]).exit_code == 0
    hidden.rename(r00)
    assert runner.invoke(app, ["registry", "index", "runs/t", "--db", db]).exit_code == 0
    assert exported_ids("--sample", "2", "--seed", "3", "--db", db) == \
        exported_ids("--sample", "2", "--seed", "3")


@pytest.mark.parametrize("options, says", [
    (["--rounds", "3-1"], "--rounds '3-1': expected A-B with 0 <= A <= B"),
    (["--rounds", "-1"], "--rounds '-1': expected N or A-B"),
    (["--rounds", "a-b"], "--rounds 'a-b': expected N or A-B"),
    (["--limit", "2", "--sample", "2"], "--limit and --sample: give one"),
])
def test_a_bad_range_or_limit_with_sample_is_one_line_and_exit_2(three_rounds, options, says):
    result = runner.invoke(app, ["registry", "export", *options])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and says in result.stderr
