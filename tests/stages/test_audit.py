"""audit: the model's verdict decides, leniently; rejects free their design's slot."""

import pytest

from stages import audit as stage
from stages.backends.scripted import ScriptedBackend
from stages.records import Design, Env


def env(name, design=None):
    return Env(domain="tool_use", skill="api-orchestration", class_name="XEnv",
               source=f"# {name}\nclass XEnv: ...", source_hash=name, max_turns=5,
               parents=[design.id] if design else [])


def answering(**by_name):
    return ScriptedBackend(lambda messages, tools: next(
        text for name, text in by_name.items() if f"# {name}\n" in messages[-1]["content"]))


@pytest.mark.parametrize("text,expected", [
    ("criteria reachable \\boxed{yes}", "yes"), ("\\boxed{ No }", "no"),
    ("first \\boxed{no} then \\boxed{yes}", "yes"), ("no box at all", "unclear"),
    ("\\boxed{maybe}", "unclear"), ("", "unclear")])
def test_verdict_is_the_last_box(text, expected):
    assert stage.verdict(text) == expected


def test_only_an_explicit_no_rejects_and_the_reject_names_its_slot():
    design = Design(round=4, slot=7, attempt=1, skill="api-orchestration")
    records = [design, env("good"), env("bad", design), env("mumble")]
    backend = answering(good="fine \\boxed{yes}",
                        bad="criterion 2 needs status 'done' that no tool writes. \\boxed{no}",
                        mumble="I am not sure.")
    out = list(stage.run(records, backend, stage.Config()))
    kept = [r for r in out if r.kind == "env"]
    (reject,) = [r for r in out if r.kind == "validation"]
    assert [r.source_hash for r in kept] == ["good", "mumble"]
    assert [r.meta["audit"]["verdict"] for r in kept] == ["yes", "unclear"]
    assert kept[0].id == env("good").id  # the env is its program: id unchanged
    assert (reject.check, reject.round, reject.slot, reject.attempt) == ("audit", 4, 7, 1)
    assert "no tool writes" in reject.error.msg and reject.parents == [design.id]
