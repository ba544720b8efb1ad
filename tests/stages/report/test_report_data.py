"""stages.report.data: reading a run directory: rounds, deduplication, where each env came from."""

import pytest

from stages.records import Design, Env, RecordError, Validation, dumps
from stages.report.data import final_memory, load_run
from stages.shards import InputMissing, write_atomic


def test_records_are_grouped_by_kind_and_round_and_counted_once(fixture, run_dir):
    run = load_run(run_dir)
    assert run.rounds == [1, 2, 3]
    assert {n: dict(c) for n, c in run.counts.items()} == fixture.EXPECTED["counts"]
    assert len(run.memory) == 5
    assert run.checkpoints == ["step-000002", "step-000006"]
    assert run.recipe["rounds"] == 3


def test_envs_are_designed_rejected_by_the_audit_or_from_the_start_pool(run_dir):
    run = load_run(run_dir)
    by_class = {env.text.split("class ")[1].split("Env")[0]: run.origins()[env_id]
                for envs in run.envs.values() for env_id, env in envs.items()}
    assert by_class == {"Ledger": "designed", "PrimeSieve": "designed", "Suspects": "designed",
                        "Orbit": "designed", "Maze0": "designed", "Maze1": "designed",
                        "Maze2": "designed", "Tower": "rejected", "Beacon": "pool",
                        "Recall": "pool"}
    assert {n: len(envs) for n, envs in run.envs_of("designed").items()} == {1: 4, 2: 3}
    assert {n: len(envs) for n, envs in run.envs_of("pool").items()} == {1: 2}


def test_an_env_without_a_design_in_the_run_is_start_pool(tmp_path):
    design = Design(skill="spatial", round=0, completion="code")
    ours = Env(domain="game", skill="spatial", class_name="A", source="a", source_hash="a",
               max_turns=1, parents=[design.id])
    seed = Env(domain="game", skill="memory", class_name="B", source="b", source_hash="b",
               max_turns=1, parents=["des_not_in_this_run"])
    (tmp_path / "r00" / "hint").mkdir(parents=True)
    write_atomic(tmp_path / "r00" / "hint" / "env-00000.jsonl", [dumps(ours), dumps(seed)])
    write_atomic(tmp_path / "r00" / "hint" / "design-00000.jsonl", [dumps(design)])
    assert load_run(tmp_path).origins() == {ours.id: "designed", seed.id: "pool"}


def test_a_reject_names_its_design_or_stands_for_one(tmp_path):
    design = Design(round=1, completion="x")
    named = Validation(check="oracle", round=1, parents=[design.id])
    orphan = Validation(check="trivial", round=1)
    (tmp_path / "r01" / "v").mkdir(parents=True)
    write_atomic(tmp_path / "r01" / "v" / "validation-00000.jsonl", [dumps(named), dumps(orphan)])
    rejected = load_run(tmp_path).rejected_designs()
    assert {key: reject.check for key, (_, reject) in rejected.items()} == {
        design.id: "oracle", orphan.id: "trivial"}


def test_missing_and_non_run_directories(tmp_path):
    with pytest.raises(InputMissing):
        load_run(tmp_path / "nope")
    with pytest.raises(InputMissing, match="not a run directory"):
        load_run(tmp_path)


def test_a_bad_shard_line_names_the_file_and_line(tmp_path):
    (tmp_path / "r00" / "x").mkdir(parents=True)
    (tmp_path / "r00" / "x" / "env-00000.jsonl").write_text('{"kind": "env", "v": 1}\n')
    with pytest.raises(RecordError, match=r"env-00000.jsonl:1: field"):
        load_run(tmp_path)


def test_an_infinity_regret_is_refused_at_read_naming_the_field(tmp_path):
    (tmp_path / "r01" / "score").mkdir(parents=True)
    (tmp_path / "r01" / "score" / "regret-00000.jsonl").write_text(
        '{"kind": "regret", "env_id": "env_a", "regret": "Infinity"}\n')
    with pytest.raises(RecordError, match=r"regret-00000.jsonl:1: field 'regret': expected a "
                                          r"finite JSON number"):
        load_run(tmp_path)


def test_final_memory_is_memory_jsonl_else_the_newest_snapshot(tmp_path):
    assert final_memory(tmp_path) is None
    (tmp_path / "memory").mkdir()
    for name in ("seed.jsonl", "r00.jsonl", "r02.jsonl", "r10.jsonl.gz", "notes.txt"):
        (tmp_path / "memory" / name).write_text("")
    assert final_memory(tmp_path) == tmp_path / "memory" / "r10.jsonl.gz"
    (tmp_path / "memory.jsonl").write_text("")
    assert final_memory(tmp_path) == tmp_path / "memory.jsonl"
