"""Records: ids from content, kind/v first, versions, NaN refusal, field-named errors."""

import math
import re

import orjson
import pytest

from stages.records import (VERSION, Design, Env, Rollout, RecordError, dumps, parse,
                            program_hash)


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
    assert make_env(source="class OtherEnv: ...").id != base.id
    # the id is the program's: a record's own word for its hash (source_hash) does not move it
    assert make_env(source_hash="other").id == base.id
    assert make_env(source="class GridEnv: ...  \n\n").id == base.id  # trailing space ignored


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


REQUIRED = {"env": dict(domain="game", class_name="A", source="s", source_hash="h", max_turns=1),
            "validation": dict(check="oracle"), "rollout": dict(env_id="env_x"),
            "memory": dict(env_id="env_x"), "train": dict(step=1), "eval": dict(suite="s")}


def float_fields():
    """(kind, field path, value holding the number) for every float field of every kind."""
    from stages.records import MODELS, Turn

    def holder(annotation, number):
        text = str(annotation)
        return [number] if "list[" in text else {"k": number} if "dict[" in text else number

    for kind, model in MODELS.items():
        for name, info in model.model_fields.items():
            if "float" in str(info.annotation):
                yield kind, name, lambda n, a=info.annotation, f=name: {f: holder(a, n)}
    for name, info in Turn.model_fields.items():
        if "float" in str(info.annotation):
            yield "rollout", f"turns.0.{name}", lambda n, a=info.annotation, f=name: {
                "turns": [{"action": "a", f: holder(a, n)}]}


@pytest.mark.parametrize("kind, field, make", list(float_fields()),
                         ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "inf", "1e400"])
def test_every_float_field_refuses_non_finite_strings_at_read(kind, field, make, text):
    data = {"kind": kind, **REQUIRED.get(kind, {}), **make(text)}
    with pytest.raises(RecordError, match=rf"^field '{re.escape(field)}(\.\w+)?': expected a "
                                          r"finite JSON number, got '"):
        parse(data)
    assert parse({**data, **make(0.5)}) and parse({**data, **make(2)})  # numbers still read


def test_the_float_fields_found_cover_every_kind_that_has_one():
    kinds = {kind for kind, _, _ in float_fields()}
    assert kinds == {"design", "rollout", "judgement", "regret", "memory", "train", "eval"}


def test_an_env_whose_id_is_not_its_programs_is_refused_at_read():
    # another env's id on a different program: the play would be credited to the other env
    data = {**orjson.loads(dumps(make_env(source="class OtherEnv: ..."))), "id": make_env().id}
    with pytest.raises(RecordError, match=rf"^id does not match its content \(expected "
                                          rf"{make_env(source='class OtherEnv: ...').id}, "
                                          rf"got {make_env().id}\)$"):
        parse(data)
    # nor does the record's own word for the program's hash let it keep the id
    data["source_hash"] = make_env().source_hash
    with pytest.raises(RecordError, match="id does not match its content"):
        parse(data)


def test_a_design_whose_content_changed_under_its_id_is_refused_at_read():
    data = orjson.loads(dumps(Design(completion="x")))
    assert parse(data).id == data["id"]
    with pytest.raises(RecordError, match="id does not match its content"):
        parse({**data, "completion": "```python\nclass OtherEnv: ...\n```"})


def test_a_record_without_an_id_gets_its_contents_and_annotations_keep_it():
    data = orjson.loads(dumps(make_env()))
    assert parse({k: v for k, v in data.items() if k != "id"}).id == make_env().id
    design = orjson.loads(dumps(Design(completion="x")))
    annotated = parse({**design, "note": "added by jq", "meta": {"by": "hand"}})
    assert annotated.id == design["id"] and annotated.note == "added by jq"
    # other kinds are not checked: a regret's advantage is set after its id (score-regret)
    rollout = orjson.loads(dumps(Rollout(env_id="env_a")))
    assert parse({**rollout, "reward": 1.0}).id == rollout["id"]


@pytest.mark.parametrize("source", [
    "class A:\n    pass\n", "class A:  \n\tpass\t\n\n", "a\r\nb\r\n", "a\x0bb", "a\x1f\nb",
    "\n\nx = 1\n\n\n", "x = 'é'  \ny = 2\u2028z", "a\xa0\nb", "", "\n", " ",
])
def test_program_hash_ignores_trailing_whitespace_as_the_line_by_line_form(source):
    import hashlib

    normal = "\n".join(line.rstrip() for line in source.strip("\n").splitlines())
    assert program_hash(source) == hashlib.sha256(normal.encode()).hexdigest()
