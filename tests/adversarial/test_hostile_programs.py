"""The adversarial corpus: hostile env programs of our own through every stage that runs envs.

Each file in programs/ attacks spade one way (its docstring's first line says how) and says, in a
header line, what must become of it:

    # expect: validate=<check>[|<check>...] rollout=<outcome>[|<outcome>...]

`validate` lists the checks that may reject it (sandbox/contract.py CHECKS); `may-pass` among
them means validation may accept it, and the file then says why that is harmless on a
`# may pass: ...` line. `rollout` lists the outcomes its plays may end with. Programs validation
rejects are still played, from env records built directly, as a buggy or forged upstream shard
would hand them to rollout.

What is asserted: validate and rollout finish, one record per design and per play, each with
its outcome and reason, in order; the seed envs mixed in come out as usual; every record goes
through the shard writer; score-regret and report take the rollout records; `spade validate`
then `spade rollout` over the corpus exit 0; each program forged under a seed env's id is
refused at read. The corpus runs in nsjail only (it holds a fork
bomb): without a jail the module is skipped.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sandbox.contract import CHECKS
from sandbox.jail import OUTCOMES, Limits, Sandbox
from stages import rollout, score_regret, seed_library, validate
from stages.backends.scripted import ScriptedBackend
from stages.isolation import INTERNAL
from stages.records import Env, RecordError, Rollout, Validation
from stages.shards import Stats, encode, read, write_atomic

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).parent / "programs"
EXPECT_RE = re.compile(r"^# expect: validate=(\S+) rollout=(\S+)$", re.M)
WHY_RE = re.compile(r"^# may pass: (.+)$", re.M)
CLASS_RE = re.compile(r"^class (\w+Env)\b", re.M)
MAY_PASS = "may-pass"
PLAY_OUTCOMES = set(OUTCOMES) | {INTERNAL, "context_limit", "episode_timeout",
                                  *rollout.STALLED, rollout.BLACKLISTED}
# Small limits keep each stage to about a minute on two cores: a hang costs one call timeout.
# Validation gets 30 s of life per jail (`spade validate --budget`); a rollout jail may wait in
# the worker pool before its play, so it keeps the default lifetime.
LIMITS = Limits(call_timeout=2.0, memory_mb=256)
SANDBOX = Sandbox(limits=Limits(**{**LIMITS.__dict__, "lifetime": 30, "cpu_seconds": 30}))
VALIDATE = validate.Config(workers=2, sandbox=SANDBOX, seed=20240611)
ROLLOUT = rollout.Config(plays=1, concurrency=8, max_turns=8, episode_timeout=60.0,
                         sandbox=Sandbox(limits=LIMITS))
SEEDS = [seed_library.files("game")[0], seed_library.files("tool_use")[0]]


@dataclass(frozen=True)
class Program:
    path: Path
    reason: str
    checks: frozenset[str]
    outcomes: frozenset[str]
    why: str | None

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def may_pass(self) -> bool:
        return MAY_PASS in self.checks


def load_program(path: Path) -> Program:
    source = path.read_text()
    expect = EXPECT_RE.search(source)
    assert expect, f"{path}: no '# expect: validate=... rollout=...' line"
    docstring = re.search(r'^"""(.*?)(?:"""|$)', source, re.M)
    assert docstring, f"{path}: no module docstring"
    why = WHY_RE.search(source)
    return Program(path, docstring.group(1).strip(), frozenset(expect.group(1).split("|")),
                   frozenset(expect.group(2).split("|")), why.group(1) if why else None)


CORPUS = [load_program(path) for path in sorted(PROGRAMS.glob("*.py"))]
NAMES = [program.name for program in CORPUS]


def scripted_agent() -> ScriptedBackend:
    """Presses a key in games and calls the counter tool in tool-use envs, every turn."""
    def respond(messages, tools):
        if messages[0]["role"] == "system":
            return '<tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>'
        return "I press \\boxed{A}"

    return ScriptedBackend(respond)


def direct_env(path: Path) -> Env:
    """The env record an upstream stage could have written for this program, valid or not."""
    source = path.read_text()
    match = CLASS_RE.search(source)
    return Env(domain="tool_use" if "ToolUseBaseEnv" in source else "game",
               class_name=match.group(1) if match else "UnknownEnv", source=source,
               source_hash=validate.source_hash(source), max_turns=8)


def round_trip(records: list, path: Path) -> list:
    """Write records with the shard writer and read them back."""
    assert write_atomic(path, encode(records)) == len(records)
    return list(read([str(path)]))


@pytest.fixture(scope="module")
def validated(nsjail_ok):
    assert SANDBOX.mode == ROLLOUT.sandbox.mode == "nsjail"  # never run a fork bomb unjailed
    designs = validate.designs_from_files([p.path for p in CORPUS] + SEEDS)
    records = list(validate.run(designs, VALIDATE, Stats()))
    return dict(zip(NAMES + [p.stem for p in SEEDS], records))


@pytest.fixture(scope="module")
def envs(validated):
    """Each corpus program's env record (validated, else built directly), then the seeds'."""
    out = {}
    for program in CORPUS:
        record = validated[program.name]
        out[program.name] = record if isinstance(record, Env) else direct_env(program.path)
    for path in SEEDS:
        out[path.stem] = validated[path.stem]
    return out


@pytest.fixture(scope="module")
def played(envs):
    return list(rollout.run(list(envs.values()), scripted_agent(), ROLLOUT))


@pytest.fixture(scope="module")
def plays_by_name(envs, played):
    names = {env.id: name for name, env in envs.items()}
    grouped: dict[str, list[Rollout]] = {name: [] for name in envs}
    for play in played:
        grouped[names[play.env_id]].append(play)
    return grouped


# -- the corpus itself -------------------------------------------------------------------------

def test_corpus_has_thirty_documented_attacks():
    assert len(CORPUS) >= 30
    for program in CORPUS:
        assert program.reason and "\n" not in program.reason, program.name
        assert program.checks <= set(CHECKS) | {MAY_PASS}, program.name
        assert program.outcomes <= PLAY_OUTCOMES, program.name
        assert (program.why is not None) == program.may_pass, \
            f"{program.name}: a program that may pass says why (and only then)"


# -- validate ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_validate_gives_each_program_its_own_verdict(validated, name):
    program = next(p for p in CORPUS if p.name == name)
    record = validated[name]
    assert record.meta.get("source_file") == str(program.path)
    if isinstance(record, Env):
        assert program.may_pass, f"{name} was accepted: {program.reason}"
        return
    assert isinstance(record, Validation) and not record.ok
    assert record.check in program.checks, f"{name}: rejected by {record.check}: {record.error}"
    assert record.outcome in OUTCOMES and record.error.msg.strip()


def test_validate_finishes_the_seed_envs_and_every_record_writes(validated, tmp_path):
    for path in SEEDS:
        assert isinstance(validated[path.stem], Env), validated[path.stem]
    records = list(validated.values())
    assert not [r for r in records if isinstance(r, Validation) and r.check == "internal"]
    back = round_trip(records, tmp_path / "validate.jsonl")
    assert [r.id for r in back] == [r.id for r in records]


# -- rollout -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_rollout_records_every_play_with_its_outcome(plays_by_name, name):
    program = next(p for p in CORPUS if p.name == name)
    plays = plays_by_name[name]
    assert [p.meta["play"] for p in plays] == list(range(ROLLOUT.plays))
    for play in plays:
        assert play.outcome in program.outcomes, f"{name}: {play.outcome}: {play.error}"
        assert play.ok == (play.error is None)
        if not play.ok:
            assert play.error.type.startswith("env.") and play.error.msg.strip(), play.error


def test_rollout_finishes_the_seed_envs_and_every_record_writes(plays_by_name, played, tmp_path):
    for path in SEEDS:
        plays = plays_by_name[path.stem]
        assert len(plays) == ROLLOUT.plays
        assert all(p.outcome == "ok" and p.ok and p.turns for p in plays), plays
    assert not [p for p in played if p.outcome == INTERNAL]
    back = round_trip(played, tmp_path / "rollout.jsonl")
    assert [r.id for r in back] == [r.id for r in played]


# -- the stages after rollout ------------------------------------------------------------------

def test_score_regret_and_report_take_the_corpus_records(envs, played, validated, tmp_path):
    pytest.importorskip("matplotlib")
    from stages import report

    records = list(envs.values()) + played
    regrets, diagnostics = score_regret.run(records, score_regret.Config())
    assert sorted(r.env_id for r in regrets) == sorted(env.id for env in envs.values())
    assert diagnostics.internal == 0
    round_dir = tmp_path / "run" / "r00"
    round_dir.mkdir(parents=True)
    rejects = [r for r in validated.values() if isinstance(r, Validation)]
    for kind, kept in (("env", list(envs.values())), ("validation", rejects),
                       ("rollout", played), ("regret", regrets)):
        round_trip(kept, round_dir / f"{kind}-00000.jsonl")
    built = report.build(tmp_path / "run", embedder=None)
    assert built.path.exists()


# -- forged records ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_a_program_under_a_seed_envs_id_is_refused_at_read(name, tmp_path):
    """A shard that hands rollout this program under an accepted env's id (and its source_hash):
    refused at its line, so no play of it is credited to the other env."""
    program = next(p for p in CORPUS if p.name == name)
    seed = next(iter(read([str(seed_library.ENV_SHARD)], kinds={"env"})))
    forged = {**direct_env(program.path).to_dict(), "id": seed.id,
              "source_hash": seed.source_hash}
    path = tmp_path / "env-00000.jsonl"
    path.write_bytes(orjson.dumps(seed.to_dict()) + b"\n" + orjson.dumps(forged) + b"\n")
    with pytest.raises(RecordError, match=re.escape(
            f"{path}:2: id does not match its content (expected "
            f"{direct_env(program.path).id}, got {seed.id})")):
        list(read([str(path)]))


# -- the command line --------------------------------------------------------------------------

def test_validate_then_rollout_commands_exit_0_over_the_corpus(tmp_path, monkeypatch,
                                                               nsjail_ok):
    import stages.backends

    from spade_cli.app import app

    programs = tmp_path / "programs"
    programs.mkdir()
    for path in [p.path for p in CORPUS] + SEEDS:
        shutil.copy(path, programs / path.name)
    monkeypatch.setattr(stages.backends, "load_backend", lambda spec: scripted_agent())
    model = tmp_path / "model"  # --model must name a directory; the scripted agent reads none
    model.mkdir()
    runner = CliRunner()
    checked = runner.invoke(app, ["validate", str(programs), "-o", str(tmp_path / "envs"),
                                  "--workers", "2", "--call-timeout", "2", "--memory-mb", "256",
                                  "--budget", "30", "--seed", "7"])
    assert checked.exit_code == 0, checked.stderr
    envs = list(read([str(tmp_path / "envs")], kinds={"env"}))
    seed_envs = [e for e in envs if Path(e.meta["source_file"]).name in {p.name for p in SEEDS}]
    assert len(seed_envs) == len(SEEDS)
    played = runner.invoke(app, ["rollout", str(tmp_path / "envs"), "-o", str(tmp_path / "plays"),
                                 "--backend", "hf", "--model", str(model), "--plays", "1",
                                 "--concurrency", "4", "--max-turns", "8",
                                 "--turn-timeout", "2"])
    assert played.exit_code == 0, played.stderr
    plays = list(read([str(tmp_path / "plays")], kinds={"rollout"}))
    assert len(plays) == len(envs)
    for env in seed_envs:
        (play,) = [p for p in plays if p.env_id == env.id]
        assert play.outcome == "ok" and play.ok and play.turns
    manifest = orjson.loads((tmp_path / "plays" / "_manifest.json").read_bytes())
    assert manifest["complete"]
