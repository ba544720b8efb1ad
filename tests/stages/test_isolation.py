"""Per-record isolation: a record spade cannot build or write costs that record, not the stage.

The jail boundary (sandbox/replies.py) hands stages well-typed replies, so these tests reach the
last-resort guard the only way left: by making spade itself fail on one record (a patched
function that raises for one env, a backend that returns NaN logprobs, rewards whose mean
overflows). Each stage must turn that into the one record's failure and finish the rest.
"""

from __future__ import annotations

import logging
import math

import pytest

from sandbox.jail import Limits, Sandbox, SandboxUnavailable
from stages import hint, isolation, rollout, score_regret, seed_library, validate
from stages.backends import BackendUnavailable, Completion
from stages.backends.scripted import ScriptedBackend
from stages.evaluate import Config as EvalConfig
from stages.evaluate.envs import run_envs
from stages.records import Env, Failure, Rollout, Validation, dumps
from stages.shards import Stats, read

INTERNAL = isolation.INTERNAL


POISON = "poison this play"


def seed_envs(count: int) -> list[Env]:
    return [e for e in read([str(seed_library.ENV_SHARD)]) if e.domain == "game"][:count]


def poisoned_first(envs: list[Env]) -> list[Env]:
    """The envs, the first carrying a hint that marks its plays' prompts, the others a plain
    one (played with hints: a hinted stage plays only envs that have one)."""
    return [envs[0].model_copy(update={"hint": POISON})] + [
        env.model_copy(update={"hint": "Think before you act."}) for env in envs[1:]]


class NaNLogprobs(ScriptedBackend):
    """A scripted backend whose completions for prompts holding `poison` carry NaN logprobs."""

    def __init__(self, respond, poison: str):
        super().__init__(respond)
        self.poison = poison

    def submit(self, messages, sampling, tools=None):
        future = super().submit(messages, sampling, tools)
        if any(self.poison in (m.get("content") or "") for m in messages):
            done = future.result()
            done.logprobs = [math.nan] * len(done.logprobs)
        return future


# -- the guard itself --------------------------------------------------------------------------

def failed_validation(failure: Failure) -> Validation:
    return Validation(check="internal", outcome=INTERNAL, error=failure)


def test_a_built_record_passes_through():
    record = Validation(check="reset")
    assert isolation.isolated("x", lambda: record, failed_validation) is record


def test_an_exception_becomes_the_records_failure_logged_in_one_line(caplog):
    def build():
        raise KeyError("line one\nline two \udcff")

    with caplog.at_level(logging.DEBUG, logger="spade.isolation"):
        record = isolation.isolated("validate: design des_1", build, failed_validation)
    assert record.check == "internal" and record.outcome == INTERNAL
    assert record.error.type == "internal.KeyError"
    assert "\n" not in record.error.msg and "line two" in record.error.msg
    dumps(record)  # the surrogate in the message became valid text
    warning, trace = caplog.records
    assert warning.levelno == logging.WARNING and "des_1" in warning.getMessage()
    assert trace.levelno == logging.DEBUG and trace.exc_info


def test_a_record_the_shard_writer_refuses_becomes_the_failure():
    unwritable = Env(domain="game", class_name="XEnv", source="x", source_hash="x", max_turns=5,
                     tools=[{"type": "function", "function": {"name": "f", "max": 2**70}}])
    record = isolation.isolated("x", lambda: unwritable, failed_validation)
    assert isinstance(record, Validation) and record.error.type.startswith("internal.")


@pytest.mark.parametrize("error", [SandboxUnavailable("no jail"), BackendUnavailable("no model"),
                                   KeyboardInterrupt()])
def test_infrastructure_and_interrupts_pass_through(error):
    def build():
        raise error

    with pytest.raises(type(error)):
        isolation.isolated("x", build, failed_validation)


def test_an_unwritable_failure_record_is_a_bug_and_raises():
    def build():
        raise ValueError("boom")

    with pytest.raises(Exception):
        isolation.isolated("x", build, lambda failure: {"reward": math.nan})


# -- the stages --------------------------------------------------------------------------------

SANDBOX = Sandbox(limits=Limits(call_timeout=5))


def test_validate_turns_an_internal_error_into_that_designs_reject(monkeypatch, nsjail_ok):
    files = seed_library.files("game")[:3]
    designs = validate.designs_from_files(files)
    real = validate.runtime_checks

    def flaky(sandbox, source, seeds):
        if source == files[1].read_text():
            raise AttributeError("'NoneType' object has no attribute 'get'")
        return real(sandbox, source, seeds)

    monkeypatch.setattr(validate, "runtime_checks", flaky)
    stats = Stats()
    records = list(validate.run(designs, validate.Config(sandbox=SANDBOX, seed=1), stats))
    assert [type(r).__name__ for r in records] == ["Env", "Validation", "Env"]
    reject = records[1]
    assert reject.check == "internal" and reject.outcome == INTERNAL and not reject.ok
    assert reject.parents == [designs[1].id] and reject.meta["source_file"] == str(files[1])
    assert reject.error.type == "internal.AttributeError"
    assert stats.reasons["internal"] == 1


def test_rollout_ends_only_the_play_that_breaks_spade(monkeypatch, nsjail_ok):
    envs = poisoned_first(seed_envs(2))
    real = rollout.game_action

    def flaky(completion):
        if "POISON" in completion:
            raise IndexError("a case rollout does not handle")
        return real(completion)

    def respond(messages, tools):
        poisoned = POISON in messages[0]["content"] and len(messages) > 2
        return "\\boxed{POISON}" if poisoned else "\\boxed{1}"

    monkeypatch.setattr(rollout, "game_action", flaky)
    cfg = rollout.Config(plays=2, hint=True, concurrency=4, max_turns=4, sandbox=SANDBOX)
    plays = list(rollout.run(envs, ScriptedBackend(respond), cfg))
    assert [(p.env_id, p.meta["play"]) for p in plays] == [(e.id, i) for e in envs
                                                           for i in range(2)]
    for play in plays[:2]:  # the second turn broke spade: the first is kept
        assert play.outcome == INTERNAL and not play.ok and len(play.turns) == 1
        assert play.error.type == "internal.IndexError"
    for play in plays[2:]:
        assert play.outcome == "ok" and play.ok and len(play.turns) == 4
    for play in plays:
        dumps(play)


def test_rollout_keeps_a_play_whose_record_cannot_be_written(nsjail_ok):
    envs = poisoned_first(seed_envs(2))
    backend = NaNLogprobs(lambda messages, tools: "\\boxed{1}", poison=POISON)
    cfg = rollout.Config(plays=1, hint=True, concurrency=2, max_turns=3, sandbox=SANDBOX)
    first, second = rollout.run(envs, backend, cfg)
    assert first.outcome == INTERNAL and first.turns == [] and first.seed
    assert first.error.type == "internal.RecordError" and "logprobs" in first.error.msg
    assert second.outcome != INTERNAL and second.turns
    dumps(first), dumps(second)


def test_hint_leaves_out_the_hint_it_cannot_make_and_hints_the_rest(monkeypatch):
    envs = seed_envs(3)
    real = hint.clean

    def flaky(text, max_chars):
        if text == POISON:
            raise UnicodeError("a case hint does not handle")
        return real(text, max_chars)

    def respond(messages, tools):
        return POISON if f"class {envs[1].class_name}" in messages[0]["content"] \
            else "Start from the corner."

    monkeypatch.setattr(hint, "clean", flaky)
    hinted = list(hint.run(envs, ScriptedBackend(respond), hint.Config()))
    assert [e.id for e in hinted] == [e.id for e in envs]
    assert hinted[1].hint is None and hinted[1].meta["hint"]["error"]["type"].startswith(
        "internal.")
    assert hinted[0].hint == hinted[2].hint == "Start from the corner."
    for env in hinted:
        dumps(env)


def test_hint_text_with_lone_surrogates_becomes_valid_text():
    assert hint.clean("go \udcff left", 100) == "go \ufffd left"


def test_score_regret_marks_only_the_env_it_cannot_score(monkeypatch):
    good, bad = (Env(id=f"env_{name}", domain="game", class_name="XEnv", source=name,
                     source_hash=name, max_turns=5) for name in ("good", "bad"))
    plays = [Rollout(env_id=env.id, hint=hinted, reward=reward, seed=seed)
             for env, reward in ((good, 0.5), (bad, 0.25))
             for seed, hinted in enumerate((True, False))]
    real = score_regret.rewards.regret

    def flaky(hinted, no_hint):
        if 0.25 in hinted:
            raise OverflowError("a case score-regret does not handle")
        return real(hinted, no_hint)

    monkeypatch.setattr(score_regret.rewards, "regret", flaky)
    regrets, diagnostics = score_regret.run([good, bad] + plays, score_regret.Config())
    by_id = {r.env_id: r for r in regrets}
    assert by_id["env_good"].ok and not by_id["env_good"].broken
    assert not by_id["env_bad"].ok and by_id["env_bad"].broken
    assert by_id["env_bad"].error.type == "internal.OverflowError"
    assert diagnostics.internal == 1
    for regret in regrets:
        dumps(regret)


def test_eval_envs_fails_only_the_item_it_cannot_build(monkeypatch, nsjail_ok):
    from stages.evaluate import envs as suite

    envs = seed_envs(2)
    real = suite.item

    def flaky(cfg, task, *args, **kwargs):
        if task == envs[0].id:
            raise TypeError("a case the suite does not handle")
        return real(cfg, task, *args, **kwargs)

    monkeypatch.setattr(suite, "item", flaky)
    cfg = EvalConfig(suite="envs", episodes=1, batch_size=2,
                     rollout=rollout.Config(max_turns=2, sandbox=SANDBOX))
    stats = Stats()
    items = list(run_envs(envs, ScriptedBackend(lambda m, t: "\\boxed{1}"), cfg, stats))
    assert [i.task for i in items] == [e.id for e in envs]
    assert not items[0].ok and items[0].error.type == "internal.TypeError"
    assert items[1].ok
    assert stats.reasons[f"env.{INTERNAL}"] == 1
