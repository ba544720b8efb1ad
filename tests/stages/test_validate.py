"""validate: every broken fixture is rejected by its own check; the seed library passes."""

from pathlib import Path

import pytest

from stages import seed_library
from stages import validate as stage
from stages.records import Design, Env, Validation, dumps
from stages.shards import Stats, read

BROKEN = Path(__file__).parent.parent / "fixtures" / "validate" / "broken"


def expected_check(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' line"
    return first.split(":", 1)[1].strip()


def design_for(path: Path) -> Design:
    if path.suffix == ".txt":  # a model answer, not a source file
        return Design(completion=path.read_text())
    return stage.designs_from_files([path])[0]


@pytest.mark.parametrize("path", sorted(BROKEN.iterdir()), ids=lambda p: p.name)
def test_each_broken_fixture_fails_its_own_check(path, jail_available):
    record = stage.validate_one(design_for(path), stage.Config().sandbox)
    assert isinstance(record, Validation), f"{path.name} was accepted"
    assert record.check == expected_check(path), record.error.msg
    assert record.error.type == record.check and record.error.msg
    assert record.ok is False


def test_every_check_has_a_broken_fixture():
    from sandbox.contract import CHECKS

    covered = {expected_check(path) for path in BROKEN.iterdir()}
    assert covered == set(CHECKS)


def test_seed_library_passes_and_covers_every_skill(jail_available):
    from stages.skills import GAME_SKILLS

    designs = seed_library.designs()
    records = list(stage.run(designs, stage.Config(), Stats()))
    rejects = [(r.check, r.error.msg) for r in records if isinstance(r, Validation)]
    assert rejects == []
    games = [r for r in records if r.domain == "game"]
    tools = [r for r in records if r.domain == "tool_use"]
    assert len(games) >= 8 and len(tools) >= 4
    assert {r.skill for r in games} == set(GAME_SKILLS)
    assert all(r.tools for r in tools)
    assert [r.parents for r in records] == [[d.id] for d in designs]


def test_shipped_env_shard_matches_what_validate_produces(jail_available):
    shipped = list(read([str(seed_library.ENV_SHARD)]))
    fresh = list(stage.run(seed_library.designs(), stage.Config(), Stats()))
    assert [dumps(r) for r in shipped] == [dumps(r) for r in fresh], \
        "stages/seed_library/envs.jsonl is stale: run `just seeds`"


def test_answer_with_prose_around_the_code_is_extracted(jail_available):
    source = seed_library.files("game")[0].read_text()
    answer = f"Here is my environment.\n\n```python\n{source}```\nIt is fun."
    record = stage.validate_one(Design(completion=answer, skill="x"), stage.Config().sandbox)
    assert isinstance(record, Env) and record.source.strip() == source.strip()


def test_domain_mismatch_is_a_structure_reject(jail_available):
    source = seed_library.files("game")[0].read_text()
    design = Design(domain="tool_use", completion=f"```python\n{source}```")
    record = stage.validate_one(design, stage.Config().sandbox)
    assert isinstance(record, Validation) and record.check == "structure"
    assert "asked for a tool_use env" in record.error.msg


def test_output_is_in_input_order_with_more_designs_than_workers(jail_available):
    designs = seed_library.designs()[:5]
    records = list(stage.run(designs, stage.Config(workers=2), Stats()))
    assert [r.parents[0] for r in records] == [d.id for d in designs]
