"""Records: ids from content, kind/v first, versions, NaN refusal, field-named errors."""

import math

import orjson
import pytest

from stages.records import VERSION, Design, Env, Rollout, RecordError, dumps, parse


def make_env(**overrides):
    fields = dict(domain="game", skill="spatial", class_name="GridEnv", source="class GridEnv: ...",
                  source_hash="abc", max_turns=10)
    return Env(**{**fields, **overrides})


def test_id_derives_from_content_and_reruns_reproduce_it():
    assert make_env().id == make_env().id
    assert make_env().id.startswith("env_") and len(make_env().id) == 4 + 16


def test_env_id_depends_on_program_not_on_hint_or_lineage():
    base = make_env()
    assert make_env(hint="try corners", parents=["des_1"]).id == base.id
    assert make_env(source_hash="other").id != base.id


def test_meta_is_not_hashed():
    assert Design(completion="x", meta={"host": "a"}).id == Design(completion="x", meta={"host": "b"}).id


def test_line_starts_with_kind_and_version():
    line = dumps(make_env())
    assert line.endswith(b"\n")
    assert list(orjson.loads(line))[:3] == ["kind", "v", "id"]
    assert line.startswith(b'{"kind":"env","v":1,')


def test_round_trip_keeps_extra_fields():
    data = orjson.loads(dumps(make_env()))
    data["note"] = "added by jq"
    record = parse(data)
    assert record == parse(orjson.loads(dumps(record)))
    assert orjson.loads(dumps(record))["note"] == "added by jq"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_at_write(bad):
    record = Rollout(env_id="env_x", reward=bad)
    with pytest.raises(RecordError, match="field 'reward': refusing to write a non-finite number"):
        dumps(record)


def test_nested_non_finite_is_found_by_path():
    with pytest.raises(RecordError, match=r"field 'turns\.1\.reward'"):
        dumps(Rollout(env_id="env_x", turns=[{"action": "a"}, {"action": "b", "reward": math.nan}]))


def test_newer_version_is_refused():
    with pytest.raises(RecordError, match="written by a newer spade"):
        parse({"kind": "env", "v": VERSION + 1})


def test_unknown_kind_and_wrong_kind():
    with pytest.raises(RecordError, match="unknown kind 'bogus'"):
        parse({"kind": "bogus"})
    with pytest.raises(RecordError, match="expected design, got 'env'"):
        parse(orjson.loads(dumps(make_env())), kinds={"design"})


def test_field_error_names_the_field():
    data = orjson.loads(dumps(make_env()))
    data["max_turns"] = "many"
    with pytest.raises(RecordError, match="^field 'max_turns': "):
        parse(data)
