"""The registry: a run dir written with the project's shard writer is indexed, every lineage
edge of an env matches the records, re-indexing is a no-op, an incomplete shard waits, and an
export round-trips into read_shard."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from sandbox.contract import CHECKS
from stages.provenance import stamp
from stages.records import Design, Env, Eval, RecordError, Regret, Rollout, Train, Validation
from stages.records import program_hash
from stages.registry import connect, content_digest, row_counts
from stages.registry.export import Filters, export_envs
from stages.registry.index import index_runs
from stages.registry.lineage import UnknownId, checkpoint_lineage, lineage, resolve
from stages.registry.runs import run_provenance
from stages.shards import Stats, emit, read_shard

SOURCE = '''class PickEnv:
    def reset(self, seed=None):
        return "pick a", {}

    def step(self, action):
        return "", 1.0, True, False, {}

    def solution(self):
        return ["\\\\boxed{a}"]
'''
OTHER = SOURCE.replace("pick a", "pick b")
CKPT = "runs/t/ckpt/step-000002"


def write(out: Path, records: list, stage: str = "test") -> None:
    emit(stage, str(out), lambda _journal: iter(records), {"stage": stage}, Stats(), overwrite=True)


def env(source: str, design: str, hint: str | None = None) -> Env:
    return Env(domain="game", skill="logic", class_name="PickEnv", source=source,
               source_hash=program_hash(source), max_turns=1, parents=[design], hint=hint,
               policy="runs/t/model",
               meta={"validation": {"seed": 0, "seeds": [1, 2]}, "trivial": {"chance": 0.25}})


def plays(env_id: str, hint: bool, rewards: list[float], policy: str, round_: int = 0):
    return [Rollout(env_id=env_id, hint=hint, seed=i, round=round_, reward=r,
                    terminated=True, parents=[env_id], policy=policy, meta={"play": i})
            for i, r in enumerate(rewards)]


def make_run(root: Path, name: str = "t") -> dict:
    """A one-round run dir as `spade run` lays it out, every file written by stages.shards."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / "recipe.json").write_text(orjson.dumps({"name": name, "run_dir": "runs/t"}).decode())
    good = Design(round=0, slot=0, attempt=0, skill="logic", prompt="design a game",
                  completion=f"```python\n{SOURCE}```", corpus_doc="doc_1", policy="runs/t/model",
                  meta={"doc_title": "Logic"})
    bad = Design(round=0, slot=1, attempt=0, skill="logic", prompt="design another",
                 completion=f"```python\n{SOURCE}```", policy="runs/t/model")
    write(run / "r00" / "design-a0", [good, bad])
    accepted = env(SOURCE, good.id)
    reject = Validation(check="trivial", parents=[bad.id], round=0, slot=1, skill="logic",
                        source_hash=program_hash(SOURCE), error={"type": "trivial", "msg": "won"})
    write(run / "r00" / "validate-a0", [accepted, reject], stage="validate")
    hinted = [env(SOURCE, good.id, hint="press a"), env(OTHER, "des_0000000000000000", "b")]
    write(run / "r00" / "hint", hinted)
    model = "runs/t/model"
    hint_plays = plays(accepted.id, True, [1.0, 1.0, 0.0], model) + \
        plays(hinted[1].id, True, [1.0], model)
    blind = plays(accepted.id, False, [0.0, -1.0, 1.0, 0.0], model) + \
        plays(hinted[1].id, False, [0.0, 0.0], model)
    write(run / "r00" / "rollout-hint", hint_plays)
    write(run / "r00" / "rollout", blind)
    regrets = [Regret(env_id=accepted.id, design_id=good.id, round=0, regret=0.5,
                      designer_reward=0.7, parents=[accepted.id, good.id]),
               Regret(env_id=hinted[1].id, round=0, regret=0.1, parents=[hinted[1].id]),
               Regret(design_id=bad.id, round=0, designer_reward=-1.0, rejected_by="trivial",
                      parents=[bad.id])]
    write(run / "r00" / "score-regret", regrets, stage="score-regret")
    trains = [Train(step=1, parents=sorted(r.id for r in blind[:3]), policy=CKPT),
              Train(step=2, role="agent+designer", policy=CKPT,
                    parents=sorted([r.id for r in blind[3:]] + [good.id]))]
    write(run / "r00" / "train-grpo", trains)
    step = run / "ckpt" / "step-000002"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(orjson.dumps(
        {"step": 2, "round": 0, "inputs": "f" * 64, "parent": "runs/t/model",
         "train": [t.to_dict() for t in trains]}).decode())
    evals = [Eval(suite="rg-quick", task="", score=0.25, round=0, policy=CKPT),
             Eval(suite="rg-quick", task="chain_sum", score=0.5, round=0, policy=CKPT)]
    write(run / "r00" / "eval-rg-quick", evals)
    return {"run": run, "good": good, "bad": bad, "env": accepted, "other": hinted[1],
            "reject": reject, "hint_plays": hint_plays, "blind": blind, "regrets": regrets,
            "trains": trains, "evals": evals}


@pytest.fixture
def built(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = make_run(tmp_path)
    con = connect(tmp_path / "registry.db")
    made["report"] = index_runs(con, [str(made["run"])])
    made["con"] = con
    yield made
    con.close()


def test_every_lineage_edge_of_an_env_matches_its_records(built):
    accepted, good, run = built["env"], built["good"], built["run"]
    found = lineage(built["con"], accepted.id)
    assert found["kind"] == "env" and found["runs"] == ["t"]
    assert found["env"]["source_hash"] == program_hash(SOURCE)
    # the design that produced it: its prompt, attempt and corpus doc
    [design] = found["designs"]
    assert (design["id"], design["prompt"], design["attempt"], design["corpus_doc"],
            design["doc_title"]) == (good.id, "design a game", 0, "doc_1", "Logic")
    # its verdict and checks, and the rejected attempt of the same program
    verdict, rejected = found["validation"]
    assert verdict == {"verdict": "accepted", "oracle": "solution", **accepted.meta,
                       "checks_passed": [c for c in CHECKS if c != "reset_gate"],
                       "validator": stamp("validate", {"stage": "validate"})["validator"]}
    assert (rejected["verdict"], rejected["id"], rejected["check_name"], rejected["message"]) \
        == ("rejected", built["reject"].id, "trivial", "won")
    assert found["hints"] == ["press a"]
    # plays: per round, policy and hint, as the records give them
    model = str(run / "model")
    groups = {(g["hint"], g["policy"]): g for g in found["plays"]}
    assert set(groups) == {(1, model), (0, model)}
    assert (groups[1, model]["plays"], groups[1, model]["win_rate"]) == (3, 2 / 3)
    blind = groups[0, model]
    assert (blind["plays"], blind["min_reward"], blind["max_reward"], blind["mean_reward"]) \
        == (4, -1.0, 1.0, 0.0)
    assert [r["id"] for r in found["regrets"]] == [built["regrets"][0].id]
    assert found["regrets"][0]["designer_reward"] == 0.7
    assert found["regrets"][0]["reward"] == stamp("score-regret",
                                                  {"stage": "score-regret"})["reward"]
    # train steps whose inputs include its plays, and how many of them
    own = {r.id for r in built["blind"] + built["hint_plays"] if r.env_id == accepted.id}
    expected = {t.id: len(own & set(t.parents)) for t in built["trains"] if own & set(t.parents)}
    assert {t["id"]: t["plays_of_this_env"] for t in found["train_steps"]} == expected
    [ckpt] = found["checkpoints"]
    assert ckpt["id"] == str(run / "ckpt" / "step-000002") and ckpt["inputs"] == "f" * 64
    assert [e["id"] for e in ckpt["evals"]] == [built["evals"][0].id]


def test_a_checkpoint_knows_the_envs_rounds_and_designs_that_trained_it(built):
    found = lineage(built["con"], "step-000002")
    assert found["kind"] == "checkpoint"
    assert {t["id"] for t in found["train_steps"]} == {t.id for t in built["trains"]}
    counts = {(e["env_id"], e["round"]): e["plays"] for e in found["trained_on_envs"]}
    assert counts == {(built["env"].id, 0): 4, (built["other"].id, 0): 2}
    assert [d["id"] for d in found["trained_on_designs"]] == [built["good"].id]
    assert found["checkpoint"]["parent"] == str(built["run"] / "model")
    assert lineage(built["con"], CKPT)["id"] == found["id"]  # its path as records name it


def test_design_and_eval_ids_resolve_and_unknown_ids_are_refused(built):
    con = built["con"]
    bad = lineage(con, built["bad"].id)
    assert [r["check_name"] for r in bad["rejected"]] == ["trivial"]
    assert [r["rejected_by"] for r in bad["regrets"]] == ["trivial"]
    good = lineage(con, built["good"].id)
    assert [e["id"] for e in good["envs"]] == [built["env"].id]
    assert [t["id"] for t in good["train_steps"]] == [built["trains"][1].id]
    ev = lineage(con, built["evals"][1].id)
    assert ev["checkpoint"]["kind"] == "checkpoint"
    with pytest.raises(UnknownId):
        resolve(con, "env_ffffffffffffffff")


def test_reindexing_changes_nothing(built):
    con, run = built["con"], built["run"]
    assert built["report"].indexed == 10 and built["report"].pending == 0
    counts, digest = row_counts(con), content_digest(con)
    again = index_runs(con, [str(run)])
    assert (again.indexed, again.unchanged) == (0, 10)
    assert (row_counts(con), content_digest(con)) == (counts, digest)
    shard = run / "r00" / "rollout" / "rollout-00000.jsonl"
    os.utime(shard, ns=(1, 1))  # touched, same bytes
    index_runs(con, [str(run)])
    assert row_counts(con) == counts


def test_an_incomplete_shard_is_skipped_then_picked_up(built, tmp_path):
    con, run = built["con"], built["run"]
    more = plays(built["env"].id, False, [1.0, 1.0], CKPT, round_=1)
    write(tmp_path / "staging", more)
    target = run / "r01" / "rollout"
    target.mkdir(parents=True)
    shutil.copy(tmp_path / "staging" / "rollout-00000.jsonl", target)  # no manifest yet
    report = index_runs(con, [str(run)])
    assert report.pending == 1 and report.indexed == 0
    assert con.execute("SELECT count(*) FROM plays WHERE round = 1").fetchone()[0] == 0
    shutil.copy(tmp_path / "staging" / "_manifest.json", target)  # the stage finished
    report = index_runs(con, [str(run)])
    assert (report.pending, report.indexed) == (0, 1)
    assert con.execute("SELECT count(*) FROM plays WHERE round = 1").fetchone()[0] == 2
    rounds = {g["round"] for g in lineage(con, built["env"].id)["plays"]}
    assert rounds == {0, 1}


def test_a_shard_that_changed_has_its_rows_replaced(built):
    con, run = built["con"], built["run"]
    write(run / "r00" / "rollout", plays(built["env"].id, False, [1.0], "runs/t/model"))
    index_runs(con, [str(run)])
    [blind] = [g for g in lineage(con, built["env"].id)["plays"] if g["hint"] == 0]
    assert (blind["plays"], blind["win_rate"]) == (1, 1.0)
    assert con.execute("SELECT count(*) FROM plays").fetchone()[0] == 5  # 4 hinted + 1


def test_export_round_trips_into_read_shard_and_dedups_programs(built, tmp_path):
    con = built["con"]
    copy = make_run(tmp_path / "second", name="t2")  # the same programs in another run
    index_runs(con, [str(copy["run"])])
    out = tmp_path / "export"
    records = list(export_envs(con, Filters()))
    write(out, records, stage="registry-export")
    read = list(read_shard(str(out / "env-00000.jsonl")))
    assert sorted(e.id for e in read) == sorted({built["env"].id, built["other"].id})
    first = next(e for e in read if e.id == built["env"].id)
    assert first.source == SOURCE and first.hint == "press a"
    stats = first.meta["registry"]
    assert stats["runs"] == ["t", "t2"] and stats["rounds"] == [0]
    assert stats["mean_regret"] == 0.5 and stats["hint_win_rate"] == pytest.approx(2 / 3)
    assert orjson.loads((out / "_manifest.json").read_bytes())["complete"] is True
    assert [e.id for e in export_envs(con, Filters(min_regret=0.3))] == [built["env"].id]
    assert list(export_envs(con, Filters(skill="nope"))) == []
    assert len(list(export_envs(con, Filters(limit=1)))) == 1


def test_a_bad_line_in_a_complete_shard_names_its_place(built):
    con, run = built["con"], built["run"]
    shard = run / "r00" / "score-regret" / "regret-00000.jsonl"
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(b"".join(lines[:-1]) + b'{"kind": "regret", "v": 99}\n')
    with pytest.raises(RecordError, match=r"regret-00000.jsonl:3: .*newer spade"):
        index_runs(con, [str(run)])


@pytest.mark.slow
@pytest.mark.e2e
def test_a_real_one_round_quickstart_run_indexes_and_traces(tmp_path, nsjail_ok):
    """The quickstart recipe for one round, then every env it played has a lineage."""
    repo = Path(__file__).parents[2]
    shutil.copytree(repo / "recipes", tmp_path / "recipes")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(repo)}
    subprocess.run([sys.executable, "-m", "spade_cli", "run", "recipes/quickstart.toml",
                    "--rounds", "1"], cwd=tmp_path, env=env, check=True, timeout=900,
                   capture_output=True)
    con = connect(tmp_path / "registry.db")
    report = index_runs(con, [str(tmp_path / "runs" / "quickstart")])
    assert report.pending == 0 and report.records["rollout"] > 0
    env_ids = [r[0] for r in con.execute("SELECT DISTINCT env_id FROM play_stats")]
    for env_id in env_ids:
        found = lineage(con, env_id)
        assert found["plays"] and found["regrets"] and found["train_steps"]
        assert found["checkpoints"][0]["name"].startswith("step-")
    ckpt = checkpoint_lineage(con, found["checkpoints"][0]["id"])
    assert {e["env_id"] for e in ckpt["trained_on_envs"]} == set(env_ids)
    [run] = run_provenance(con)  # its validate and score-regret shards are stamped
    assert len(run["validators"]) == len(run["rewards"]) == 1 and run["mixed"] == []


def test_compressed_shards_and_in_flight_temp_files(built):
    con, run = built["con"], built["run"]
    target = run / "r02" / "rollout"
    emit("rollout", str(target), lambda _journal: iter(plays(built["env"].id, False, [1.0], CKPT, 2)),
         {}, Stats(), suffix=".jsonl.gz")
    (target / ".rollout-00001.jsonl.0123.tmp").write_bytes(b"half a line")  # a write under way
    report = index_runs(con, [str(run)])
    assert (report.indexed, report.pending) == (1, 0)
    assert con.execute("SELECT count(*) FROM plays WHERE round = 2").fetchone()[0] == 1


def test_a_reader_sees_whole_shards_while_another_connection_indexes(built, tmp_path):
    run = built["run"]
    reader = connect(tmp_path / "registry.db", create=False)
    reader.execute("BEGIN")  # a long read: WAL lets the writer go on beside it
    before = reader.execute("SELECT count(*) FROM plays").fetchone()[0]
    write(run / "r01" / "rollout", plays(built["env"].id, False, [1.0] * 3, CKPT, 1))
    assert index_runs(built["con"], [str(run)]).indexed == 1
    assert reader.execute("SELECT count(*) FROM plays").fetchone()[0] == before
    reader.execute("COMMIT")
    assert reader.execute("SELECT count(*) FROM plays").fetchone()[0] == before + 3
    reader.close()


def test_runs_say_where_the_validator_changed_and_the_reward_did_not(built, tmp_path):
    later = make_run(tmp_path, "u")
    emit("validate", str(later["run"] / "r00" / "validate-a0"), lambda _journal: iter([later["env"]]),
         {"stage": "validate", "call_timeout": 9.0}, Stats(), overwrite=True)
    index_runs(built["con"], [str(later["run"])])
    first, second = run_provenance(built["con"])
    assert (first["run"], second["run"]) == ("t", "u")
    assert first["validators"] == [stamp("validate", {})["validator"]]
    assert second["validators"] == [stamp("validate", {"call_timeout": 9.0})["validator"]]
    assert second["rewards"] == first["rewards"] == [stamp("score-regret", {})["reward"]]
    assert (first["changed"], second["changed"]) == ([], ["validator"])
    assert second["mixed"] == [] and second["spade_versions"] == [stamp("eval", {})[
        "spade_version"]]


def test_a_version_1_registry_gains_provenance_on_the_next_index(built, tmp_path):
    con, path = built["con"], tmp_path / "registry.db"
    for column in ("spade_version", "validator", "reward"):
        con.execute(f"ALTER TABLE shards DROP COLUMN {column}")
    con.execute("UPDATE info SET value = '1' WHERE key = 'schema'")
    con.close()
    upgraded = connect(path)
    try:
        before = content_digest(upgraded)
        report = index_runs(upgraded, [str(built["run"])])
        assert report.indexed == 0  # every shard read again, no row of its changed
        [(validator,)] = upgraded.execute("SELECT DISTINCT validator FROM shards WHERE stage = "
                                          "'validate-a0'").fetchall()
        assert validator == stamp("validate", {})["validator"]
        assert upgraded.execute("SELECT value FROM info WHERE key = 'schema'").fetchone()[0] \
            == "2"
        assert content_digest(upgraded) != before  # the stamps, filled in
    finally:
        upgraded.close()
