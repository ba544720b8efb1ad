"""rollout's hint and reward handling at its limits, without a jail: the hint reaches a hinted
play's first observation and never a no-hint play, the episode reward is the clipped last step
reward of a terminated play only, the turn cap and the observation cap on both sides, the env
budget's message, the blacklist's threshold and the static pool's slices. The env runs in this
process behind a stand-in for the jailed worker, so every reply is exactly what a test says."""

from __future__ import annotations

import random
import threading
import time

import pytest

from sandbox import budget
from sandbox.jail import Limits, Reply, Sandbox, SandboxUnavailable
from stages import rollout as stage
from stages.backends import Completion
from stages.records import Env, Rollout, derive_seed

HINT = "knock three times"
# A door that opens after three knocks; `step` replies what the test's env table says.
SOURCE = "class KnockEnv:\n    max_turns = 6\n"


class Worker:
    """In-process stand-in for a jailed worker: replies come from `script(op, fields, n)`."""

    def __init__(self, script, call_timeout=2.0):
        self.script, self.calls = script, []
        self.limits = Limits(call_timeout=call_timeout)

    def call(self, op, within=None, **fields):
        self.calls.append((op, within, fields))
        return self.script(op, fields, sum(1 for c in self.calls if c[0] == op))


class Pool:
    def __init__(self, script, call_timeout=2.0):
        self.script, self.call_timeout = script, call_timeout
        self.taken, self.retired = [], []

    def take(self):
        worker = Worker(self.script, self.call_timeout)
        self.taken.append(worker)
        return worker

    def retire(self, worker):
        self.retired.append(worker)


class Backend:
    """A turn-batched backend: replies with `text` (a callable of the turn index, or a string)
    and `finish` as its finish_reason; records every conversation and sampling it got."""

    name, policy = "fake", "fake-policy"

    def __init__(self, text="\\boxed{knock}", finish="stop", logprob=0.0):
        self.text, self.finish, self.logprob = text, finish, logprob
        self.conversations, self.samplings = [], []

    def chat(self, conversations, sampling, tools=None):
        self.samplings.append(sampling)
        self.tools = getattr(self, "tools", []) + list(tools or [])
        out = []
        for messages in conversations:
            self.conversations.append([dict(m) for m in messages])
            turn = sum(1 for m in messages if m["role"] == "assistant")
            text = self.text(turn) if callable(self.text) else self.text
            finish = self.finish(turn) if callable(self.finish) else self.finish
            out.append(Completion(text, [1], [2], [self.logprob], finish_reason=finish))
        return out


def game(rewards, obs="The door.", terminal_at=None, truncated_at=None, reset_obs="Knock."):
    """A script: step n replies (obs, rewards[n-1], n == terminal_at, n == truncated_at, {})."""

    def script(op, fields, n):
        if op == "load":
            return Reply("ok", result=None)
        if op == "reset":
            return Reply("ok", result=[reset_obs, {}])
        return Reply("ok", result=[obs, rewards[min(n, len(rewards)) - 1], n == terminal_at,
                                   n == truncated_at, {}])
    return script


def env(hint=None, max_turns=6, domain="game", source=SOURCE):
    return Env(domain=domain, class_name="KnockEnv", source=source, source_hash=source,
               max_turns=max_turns, hint=hint)


def play(script, cfg=None, backend=None, envs=None, call_timeout=2.0, **kw):
    cfg = cfg or stage.Config(plays=1, concurrency=1, **kw)
    backend = backend or Backend()
    pool = Pool(script, call_timeout)
    plays = list(stage.run(envs or [env(hint=HINT)], backend, cfg, pool=pool))
    return plays, backend, pool


def one(script, **kw):
    plays, backend, pool = play(script, **kw)
    assert len(plays) == 1
    return plays[0], backend, pool


def every_text(backend):
    return [m["content"] for conv in backend.conversations for m in conv]


# -- the hint ------------------------------------------------------------------------------------

def test_a_hinted_play_sees_the_hint_once_after_the_first_observation():
    rec, backend, _ = one(game([0.0, 0.0, 1.0], terminal_at=3), hint=True)
    first = backend.conversations[0]
    assert len(first) == 1 and first[0]["role"] == "user"
    assert first[0]["content"].endswith(f"Observation:\nKnock.\n\nHINT: {HINT}")
    later = backend.conversations[-1]
    assert sum(HINT in m["content"] for m in later) == 1  # only in the first message
    assert rec.hint is True and rec.meta["hint_text"] == HINT


def test_a_no_hint_play_never_sees_the_hint_of_an_env_that_has_one():
    rec, backend, _ = one(game([0.0, 0.0, 1.0], terminal_at=3), hint=False)
    assert len(backend.conversations) == 3
    assert not any(HINT in text or "HINT" in text for text in every_text(backend))
    assert rec.hint is False and rec.meta["hint_text"] is None


def test_a_tool_use_hinted_play_gets_the_hint_in_its_user_message_not_the_system_prompt():
    rec, backend, _ = one(game([1.0], terminal_at=1),
                          cfg=stage.Config(plays=1, concurrency=1, hint=True),
                          envs=[env(hint=HINT, domain="tool_use")])
    system, user = backend.conversations[0]
    assert system["role"] == "system" and HINT not in system["content"]
    assert user == {"role": "user", "content": f"Knock.\n\nHINT: {HINT}"}
    _, backend, _ = one(game([1.0], terminal_at=1),
                        cfg=stage.Config(plays=1, concurrency=1, hint=False),
                        envs=[env(hint=HINT, domain="tool_use")])
    assert backend.conversations[0][1] == {"role": "user", "content": "Knock."}


def test_the_hint_is_added_after_the_observation_cap_so_it_is_never_cut():
    cfg = stage.Config(plays=1, concurrency=1, hint=True, max_observation_chars=5)
    rec, backend, _ = one(game([1.0], terminal_at=1, reset_obs="0123456789"), cfg=cfg)
    assert backend.conversations[0][0]["content"].endswith(
        f"01234... [truncated 5 chars]\n\nHINT: {HINT}")


def test_a_hinted_stage_plays_only_envs_with_a_non_empty_hint():
    envs = [env(), env(hint=""), env(hint=HINT, max_turns=5)]
    assert stage.hinted_only(envs, stage.Config(hint=True)) == [envs[2]]
    assert stage.hinted_only(envs, stage.Config(hint=False)) == envs
    plays, _, _ = play(game([1.0], terminal_at=1), envs=envs,
                       cfg=stage.Config(plays=2, concurrency=2, hint=True))
    assert [p.env_id for p in plays] == [envs[2].id] * 2


def test_hinted_and_no_hint_plays_of_an_env_have_different_seeds():
    seeds = {(h, p): stage.play_seed("env_a", h, p, 0, 0) for h in (False, True) for p in (0, 1)}
    assert len(set(seeds.values())) == 4
    assert stage.play_seed("env_a", True, 0, 0, 0) == stage.play_seed("env_a", True, 0, 0, 0)
    assert len({stage.play_seed("env_a", False, 0, r, s) for r in (0, 1) for s in (0, 1)} |
               {stage.play_seed("env_b", False, 0, 0, 0)}) == 5
    rec_h, _, _ = one(game([1.0], terminal_at=1), hint=True, round=2, seed=3)
    rec_n, _, _ = one(game([1.0], terminal_at=1), hint=False, round=2, seed=3)
    assert rec_h.seed == stage.play_seed(env(hint=HINT).id, True, 0, 2, 3)
    assert rec_n.seed == stage.play_seed(env(hint=HINT).id, False, 0, 2, 3)
    assert (rec_h.round, rec_n.round) == (2, 2)


# -- the episode reward --------------------------------------------------------------------------

@pytest.mark.parametrize("last,reward", [(1.0, 1.0), (5.0, 1.0), (-1.0, -1.0), (-3.0, -1.0),
                                         (0.5, 0.5), (-0.25, -0.25), (0.0, 0.0)])
def test_a_terminated_play_gets_its_last_step_reward_clipped_to_plus_minus_one(last, reward):
    rec, _, _ = one(game([0.3, last], terminal_at=2))
    assert rec.reward == reward and rec.terminated and not rec.truncated
    assert rec.outcome == "ok" and rec.ok and rec.error is None
    assert [t.reward for t in rec.turns] == [0.3, last]


def test_a_play_cut_at_the_turn_cap_scores_zero_whatever_its_step_rewards():
    rec, _, _ = one(game([0.9] * 10), max_turns=3)
    assert rec.reward == 0.0 and rec.truncated and not rec.terminated
    assert len(rec.turns) == 3 and rec.outcome == "ok" and rec.ok


def test_an_env_error_after_a_winning_step_scores_zero():
    def script(op, fields, n):
        if op == "step" and n == 2:
            return Reply("program_error", error={"type": "ValueError", "msg": "boom " * 200})
        return game([1.0])(op, fields, n)

    rec, _, pool = one(script)
    assert rec.reward == 0.0 and rec.outcome == "program_error" and rec.ok is False
    assert rec.error.type == "env.program_error" and rec.error.msg == ("boom " * 200)[:500]
    assert len(rec.turns) == 2 and rec.turns[0].reward == 1.0
    assert (rec.turns[1].observation, rec.turns[1].reward) == ("", 0.0)  # nothing came back
    assert pool.retired == pool.taken and len(pool.taken) == 1


def test_a_won_play_whose_record_cannot_be_written_is_an_internal_error_scoring_zero():
    rec, _, pool = one(game([1.0], terminal_at=1), backend=Backend(logprob=float("nan")))
    assert rec.outcome == "internal_error" and rec.ok is False and rec.terminated
    assert rec.reward == 0.0 and rec.turns == []
    assert rec.error.type.startswith("internal.")
    assert pool.retired == pool.taken


def test_an_internal_error_is_logged_naming_the_env_and_the_play(caplog):
    _, _, _ = play(game([1.0], terminal_at=1), backend=Backend(logprob=float("nan")),
                   cfg=stage.Config(plays=2, concurrency=1))
    logged = [r.getMessage() for r in caplog.records]
    for index in (0, 1):
        assert any(m.startswith(f"rollout: env {env(hint=HINT).id} play {index}: internal error")
                   for m in logged), logged


def test_an_env_error_without_a_message_is_recorded_with_an_empty_one():
    def script(op, fields, n):
        return Reply("program_error") if op == "reset" else game([1.0])(op, fields, n)

    rec, _, _ = one(script)
    assert rec.outcome == "program_error" and rec.error.msg == "" and rec.turns == []


def test_a_load_failure_ends_the_play_before_reset():
    def script(op, fields, n):
        return Reply("import_error", error={"msg": "no"}) if op == "load" else 1 / 0

    rec, backend, pool = one(script)
    assert rec.outcome == "import_error" and rec.error.type == "env.import_error"
    assert not rec.terminated and not rec.truncated and rec.meta["cut_at_max_tokens"] is False
    assert [c[0] for c in pool.taken[0].calls] == ["load"] and backend.conversations == []


def test_a_jail_that_cannot_start_stops_the_stage_with_its_message():
    def script(op, fields, n):
        return Reply("sandbox_failure", error={"msg": "nsjail: no"})

    with pytest.raises(SandboxUnavailable, match="nsjail: no"):
        play(script)
    with pytest.raises(SandboxUnavailable, match="^sandbox failure$"):
        play(lambda op, fields, n: Reply("sandbox_failure"))


# -- the turn cap and truncation -----------------------------------------------------------------

@pytest.mark.parametrize("env_turns,cfg_turns,played", [(3, 25, 3), (6, 4, 4), (30, 40, 25),
                                                        (30, 25, 25), (26, 30, 25)])
def test_turns_stop_at_the_least_of_the_env_the_config_and_25(env_turns, cfg_turns, played):
    rec, backend, _ = one(game([0.0] * 40), envs=[env(max_turns=env_turns)],
                          cfg=stage.Config(plays=1, concurrency=1, max_turns=cfg_turns))
    assert len(rec.turns) == played and rec.truncated and rec.reward == 0.0
    assert len(backend.conversations) == played


def test_winning_on_the_last_allowed_turn_is_a_win_not_a_truncation():
    rec, _, _ = one(game([0.0, 0.0, 1.0], terminal_at=3), max_turns=3)
    assert rec.terminated and not rec.truncated and rec.reward == 1.0


def test_an_env_that_truncates_ends_the_play_with_reward_zero():
    rec, _, _ = one(game([0.5, 0.5, 0.5], truncated_at=2))
    assert len(rec.turns) == 2 and rec.truncated and rec.reward == 0.0
    assert rec.outcome == "ok" and rec.meta["cut_at_max_tokens"] is False


def test_a_completion_at_max_tokens_truncates_and_is_marked_unless_the_turns_ran_out():
    rec, _, _ = one(game([0.5] * 5), backend=Backend(finish="length"))
    assert len(rec.turns) == 1 and rec.truncated and rec.meta["cut_at_max_tokens"] is True
    assert rec.turns[0].finish_reason == "length" and rec.reward == 0.0 and rec.outcome == "ok"
    # on the last allowed turn, the cap cut the play, not max_tokens
    last = Backend(finish=lambda turn: "length" if turn == 2 else "stop")
    rec, _, _ = one(game([0.5] * 5), backend=last, max_turns=3)
    assert len(rec.turns) == 3 and rec.truncated and rec.meta["cut_at_max_tokens"] is False
    # the env truncating on that step: not marked either
    rec, _, _ = one(game([0.5] * 5, truncated_at=1), backend=Backend(finish="length"))
    assert rec.truncated and rec.meta["cut_at_max_tokens"] is False


def test_a_completion_at_max_tokens_that_wins_is_a_win():
    rec, _, _ = one(game([1.0], terminal_at=1), backend=Backend(finish="length"))
    assert rec.terminated and not rec.truncated and rec.reward == 1.0
    assert rec.meta["cut_at_max_tokens"] is False


@pytest.mark.parametrize("finish,outcome", [("context_limit", "context_limit"),
                                            ("timeout", "episode_timeout")])
def test_a_completion_that_never_reached_the_env_ends_the_play_ok_with_reward_zero(finish,
                                                                                    outcome):
    backend = Backend(finish=lambda turn: finish if turn == 1 else "stop")
    rec, _, pool = one(game([1.0, 1.0], terminal_at=2), backend=backend)
    assert rec.outcome == outcome and rec.ok and rec.error is None
    assert rec.truncated and not rec.terminated and rec.reward == 0.0
    assert len(rec.turns) == 1  # the second completion is not a turn
    assert [c[0] for c in pool.taken[0].calls] == ["load", "reset", "step"]


def test_a_play_past_its_episode_time_is_an_episode_timeout_unless_it_won():
    rec, _, _ = one(game([0.5] * 5), episode_timeout=-1.0)
    assert rec.outcome == "episode_timeout" and rec.truncated and len(rec.turns) == 1
    assert rec.ok and rec.reward == 0.0
    rec, _, _ = one(game([1.0], terminal_at=1), episode_timeout=-1.0)
    assert rec.outcome == "ok" and rec.terminated and rec.reward == 1.0


# -- what the agent is shown ---------------------------------------------------------------------

def test_the_conversation_grows_by_the_raw_completion_and_the_capped_observation():
    text = "I think so. \\boxed{a} no, \\boxed{knock}"
    cfg = stage.Config(plays=1, concurrency=1, max_observation_chars=4)
    rec, backend, pool = one(game([0.0, 1.0], obs="abcdef", terminal_at=2), cfg=cfg,
                             backend=Backend(text=text))
    second = backend.conversations[1]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == text
    assert second[2]["content"] == "abcd... [truncated 2 chars]"
    assert rec.turns[0].action == "\\boxed{knock}" and rec.turns[0].completion == text
    assert (rec.turns[0].prompt_ids, rec.turns[0].completion_ids, rec.turns[0].logprobs) == (
        [1], [2], [0.0])
    assert rec.turns[0].observation == "abcd... [truncated 2 chars]"
    steps = [c for c in pool.taken[0].calls if c[0] == "step"]
    assert steps[0][2] == {"action": "\\boxed{knock}"}


def test_a_tool_call_reply_is_answered_as_a_tool_message_in_tool_use_only():
    call = '<tool_call>{"name": "knock", "arguments": {}}</tool_call>'
    _, backend, pool = one(game([0.0, 1.0], terminal_at=2), envs=[env(domain="tool_use")],
                           backend=Backend(text=call))
    assert [m["role"] for m in backend.conversations[1]] == ["system", "user", "assistant",
                                                             "tool"]
    assert pool.taken[0].calls[2][2] == {"action": call}  # verbatim, not boxed
    _, backend, _ = one(game([0.0, 1.0], terminal_at=2), envs=[env(domain="tool_use")],
                        backend=Backend(text="no call"))
    assert backend.conversations[1][-1]["role"] == "user"
    _, backend, _ = one(game([0.0, 1.0], terminal_at=2), backend=Backend(text=call))
    assert backend.conversations[1][-1]["role"] == "user"  # a game answers as the user


@pytest.mark.parametrize("text,out", [("abcd", "abcd"), ("abcde", "abcd... [truncated 1 chars]"),
                                      ("", ""), ("abc", "abc")])
def test_cap_keeps_text_at_the_limit_and_marks_a_longer_cut(text, out):
    assert stage.cap(text, 4) == out


def test_the_reset_gets_the_play_seed_and_the_load_the_source():
    rec, _, pool = one(game([1.0], terminal_at=1))
    (load, _, lf), (reset, _, rf) = pool.taken[0].calls[:2]
    assert (load, lf) == ("load", {"source": SOURCE})
    assert (reset, rf) == ("reset", {"seed": rec.seed})


def test_each_turn_samples_with_a_seed_from_the_play_seed_and_the_turn():
    cfg = stage.Config(plays=2, concurrency=2)
    plays, backend, _ = play(game([0.0, 0.0, 1.0], terminal_at=3), cfg=cfg)
    for turn, sampling in enumerate(backend.samplings):
        assert sampling.seeds == tuple(derive_seed(p.seed, "turn", turn) for p in plays)
        assert len(sampling.deadlines) == 2
        # each play's generation must end within its episode_timeout (600 s) of its start
        assert all(time.monotonic() < d <= time.monotonic() + 600 for d in sampling.deadlines)
    assert backend.samplings[0].temperature == 0.6 and backend.samplings[0].max_tokens == 512


def test_a_record_names_its_env_play_policy_and_settings():
    plays, _, pool = play(game([1.0], terminal_at=1),
                          cfg=stage.Config(plays=2, concurrency=1, round=4))
    assert [p.meta["play"] for p in plays] == [0, 1]
    for p in plays:
        assert p.parents == [env(hint=HINT).id] and p.env_id == env(hint=HINT).id
        assert p.policy == "fake-policy" and p.round == 4
        assert p.meta["temperature"] == 0.6 and p.meta["seconds"] >= 0
    assert len(pool.taken) == 2 and pool.retired == pool.taken  # every worker retired once


# -- the env budget and the blacklist ------------------------------------------------------------

def timeout_at(op_name, n_at=1):
    def script(op, fields, n):
        if op == op_name and n == n_at:
            return Reply("timeout", error={"type": "timeout", "msg": "slow"})
        return game([0.0] * 10)(op, fields, n)
    return script


def test_the_first_env_call_gets_the_whole_budget():
    _, _, pool = one(game([1.0], terminal_at=1), env_budget=7.0)
    (_, within, _), *rest = pool.taken[0].calls
    assert within == 7.0 and all(w <= 7.0 for _, w, _ in rest)


def test_a_timeout_with_less_budget_left_than_a_call_is_the_budget_with_its_message():
    rec, _, _ = one(timeout_at("step", 3), env_budget=1.0, call_timeout=2.0)
    assert rec.outcome == "env_budget" and rec.error.type == "env.env_budget" and not rec.ok
    assert rec.error.msg == "the env used its 1s budget for one play (load, reset and 2 steps)"
    assert rec.reward == 0.0


def test_a_timeout_with_a_whole_call_of_budget_left_is_the_envs_own_timeout():
    # the load's budget left is exactly one call: the call's own clock ran out, not the budget
    rec, _, _ = one(timeout_at("load"), env_budget=2.0, call_timeout=2.0)
    assert rec.outcome == "timeout" and rec.error.type == "env.timeout"
    rec, _, _ = one(timeout_at("load"), env_budget=1.5, call_timeout=2.0)
    assert rec.outcome == "env_budget"


def test_an_env_that_ran_out_the_clock_has_its_other_plays_recorded_as_blacklisted():
    cfg = stage.Config(plays=3, concurrency=1)
    plays, backend, pool = play(timeout_at("step"), cfg=cfg)
    assert [p.outcome for p in plays] == ["timeout", "blacklisted", "blacklisted"]
    for p in plays[1:]:
        assert p.error.type == "env.blacklisted" and p.turns == [] and p.reward == 0.0
        assert p.error.msg == ("not played: earlier plays of this env ran out the clock "
                               "(timeout or env_budget)")
    assert len(pool.taken) == 1  # a blacklisted play takes no worker


def test_blacklist_after_two_lets_a_second_play_run():
    cfg = stage.Config(plays=3, concurrency=1, blacklist_after=2)
    plays, _, _ = play(timeout_at("step"), cfg=cfg)
    assert [p.outcome for p in plays] == ["timeout", "timeout", "blacklisted"]


def rollout(outcome, env_id="env_a"):
    return Rollout(env_id=env_id, outcome=outcome)


@pytest.mark.parametrize("after,stalls,blocked", [(1, 0, False), (1, 1, True), (2, 1, False),
                                                  (2, 2, True), (3, 2, False)])
def test_the_blacklist_blocks_at_exactly_after_stalled_plays(after, stalls, blocked):
    plays = [rollout("timeout"), rollout("env_budget")][:stalls] + [rollout("timeout")] * (
        stalls - 2 if stalls > 2 else 0)
    assert ("env_a" in stage.Blacklist(after, plays)) is blocked


def test_the_blacklist_counts_only_stalls_per_env_and_takes_blacklisted_plays_as_blocked():
    default = stage.Blacklist()
    assert default.after == 1
    default.note(rollout("timeout", "env_x"))
    assert "env_x" in default and "env_a" not in default
    other = stage.Blacklist(1, [rollout(o) for o in ("ok", "program_error", "context_limit",
                                                     "episode_timeout", "internal_error")])
    assert "env_a" not in other
    two = stage.Blacklist(2, [rollout("timeout", "env_x"), rollout("timeout", "env_y")])
    assert "env_x" not in two and "env_y" not in two
    assert "env_a" in stage.Blacklist(5, [rollout("blacklisted")])


# -- an env that uses most of its budget on every play -------------------------------------------

class ThreadClock:
    """A stand-in for time.monotonic, one clock per thread, moved only by the env's own steps:
    plays running at once each measure exactly what their calls took."""

    def __init__(self):
        self.local = threading.local()

    def monotonic(self):
        return getattr(self.local, "t", 1000.0)

    def advance(self, seconds):
        self.local.t = self.monotonic() + seconds


def costly_plays(monkeypatch, step_seconds, plays=8, concurrency=1):
    """`plays` plays of an env that never ends whose every step takes `step_seconds` of a 1 s
    env budget (five turns a play)."""
    clock = ThreadClock()
    monkeypatch.setattr(budget, "time", clock)

    def script(op, fields, n):
        if op == "step":
            clock.advance(step_seconds)
        return game([0.0] * 30)(op, fields, n)

    cfg = stage.Config(plays=plays, concurrency=concurrency, env_budget=1.0, max_turns=5)
    return play(script, cfg=cfg)[0]


def test_an_env_using_most_of_its_budget_on_every_play_is_cut_and_blacklisted(monkeypatch):
    plays = costly_plays(monkeypatch, 0.19)  # 95% of the budget a play, never past it
    assert [p.outcome for p in plays] == ["ok"] * 3 + ["env_budget"] + ["blacklisted"] * 4
    assert [p.meta["env_seconds"] for p in plays[:3]] == [0.95] * 3
    assert plays[3].error.type == "env.env_budget" and plays[3].turns == []
    assert plays[3].error.msg == ("the env's 4 plays in this stage used 71% of their env "
                                  "budgets on average, more than the 25% an env may use over "
                                  "many plays")


def test_plays_of_a_costly_env_running_at_once_are_cut_together(monkeypatch):
    plays = costly_plays(monkeypatch, 0.19, concurrency=8)
    outcomes = [p.outcome for p in plays]
    assert set(outcomes) == {"env_budget", "blacklisted"}, outcomes
    # each cut at its second step (a quarter budget each on average), not after five
    assert sum(p.meta["env_seconds"] for p in plays) <= 8 * 0.38 + 1e-9


def test_a_costly_env_earns_its_designer_the_invalid_penalty(monkeypatch):
    from stages import score_regret

    plays = costly_plays(monkeypatch, 0.19)
    (scored,), _ = score_regret.run([env(hint=HINT)] + plays, score_regret.Config())
    assert scored.broken and scored.designer_reward == score_regret.Config().rewards.invalid_penalty


def test_a_fair_env_and_one_slow_play_are_never_flagged(monkeypatch):
    assert [p.outcome for p in costly_plays(monkeypatch, 0.01)] == ["ok"] * 8
    blacklist = stage.Blacklist()
    for play_index, share in enumerate([1.0, 0.0, 0.0, 0.0]):  # one play's whole budget
        assert blacklist.charge("env_a", play_index, share) is None
    assert "env_a" not in blacklist
    few = stage.Blacklist()
    for play_index in range(stage.HEAVY_AFTER - 1):  # too few plays to judge
        assert few.charge("env_b", play_index, 0.9) is None


# -- the static pool -----------------------------------------------------------------------------

def test_a_round_plays_the_whole_pool_when_it_asks_for_at_least_as_many():
    pool = [f"env_{i}" for i in range(4)]
    assert stage.envs_for_round(pool, 4, 3, seed=0) == set(pool)
    assert stage.envs_for_round(pool + pool, 4, 3, seed=0) == set(pool)  # duplicates count once
    assert len(stage.envs_for_round(pool, 3, 0, seed=0)) == 3


def test_a_pass_skips_its_remainder_and_the_next_pass_is_a_new_shuffle():
    pool = [f"env_{i}" for i in range(5)]
    rounds = [stage.envs_for_round(pool, 2, r, seed=4) for r in range(6)]
    assert all(len(r) == 2 for r in rounds)
    for start in (0, 2, 4):  # two slices a pass: the fifth env waits for the next pass
        assert len(rounds[start] | rounds[start + 1]) == 4
    order = sorted(pool)
    for passes in range(3):
        shuffled = list(order)
        random.Random(derive_seed("pool", 4, passes)).shuffle(shuffled)
        assert rounds[2 * passes] == set(shuffled[:2])
        assert rounds[2 * passes + 1] == set(shuffled[2:4])


def test_a_play_that_ends_before_its_first_step_is_neither_terminated_nor_truncated_by_the_env():
    backend = Backend(finish="context_limit")
    rec, _, _ = one(game([1.0], terminal_at=1), backend=backend)
    assert rec.outcome == "context_limit" and rec.turns == [] and not rec.terminated
    assert rec.truncated and rec.meta["cut_at_max_tokens"] is False


def test_a_tool_use_reply_reaches_the_env_verbatim_even_with_a_box_in_it():
    text = "I answer \\boxed{no} <tool_call>{}</tool_call>"
    _, _, pool = one(game([1.0], terminal_at=1), envs=[env(domain="tool_use")],
                     backend=Backend(text=text))
    assert pool.taken[0].calls[2] == ("step", pool.taken[0].calls[2][1], {"action": text})


def test_an_envs_tools_reach_the_model_and_an_env_without_tools_sends_none():
    tools = [{"type": "function", "function": {"name": "knock"}}]
    with_tools = Env(domain="tool_use", class_name="KnockEnv", source=SOURCE, source_hash="t",
                     max_turns=3, tools=tools)
    _, backend, _ = one(game([1.0], terminal_at=1), envs=[with_tools])
    assert backend.tools == [tools]
    _, backend, _ = one(game([1.0], terminal_at=1))
    assert backend.tools == [None]


def test_a_consumer_that_stops_reading_early_leaves_every_worker_retired_once():
    pool = Pool(game([1.0], terminal_at=1))
    plays = stage.run([env()], Backend(), stage.Config(plays=3, concurrency=3), pool=pool)
    first = next(plays)
    plays.close()
    assert first.meta["play"] == 0
    assert len(pool.taken) == 3 and pool.retired == pool.taken


def test_prompts_come_from_the_configured_prompts_dir(tmp_path):
    (tmp_path / "agent_game.md").write_text("PLAY THIS: {{observation}}")
    (tmp_path / "agent_tool_use.md").write_text("USE THE TOOLS")
    cfg = stage.Config(plays=1, concurrency=1, prompts_dir=str(tmp_path))
    _, backend, _ = one(game([1.0], terminal_at=1), cfg=cfg)
    assert backend.conversations[0][0]["content"] == "PLAY THIS: Knock."
    _, backend, _ = one(game([1.0], terminal_at=1), cfg=cfg, envs=[env(domain="tool_use")])
    assert backend.conversations[0][0] == {"role": "system", "content": "USE THE TOOLS"}


class Clock:
    """A stand-in for time.monotonic that moves only when the env works."""

    def __init__(self):
        self.t = 1000.0

    def monotonic(self):
        return self.t


def test_the_env_budget_adds_up_every_call_of_the_play(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(stage, "time", clock)
    monkeypatch.setattr(budget, "time", clock)

    def script(op, fields, n):
        clock.t += 0.37537  # each call takes 0.37537 s of the play's 1 s
        return game([0.0] * 30)(op, fields, n)

    class BudgetWorker(Worker):
        def call(self, op, within=None, **fields):
            self.calls.append((op, within, fields))
            if within < 0.37537:
                return Reply("timeout", error={"msg": "slow"})
            return script(op, fields, sum(1 for c in self.calls if c[0] == op))

    pool = Pool(script)
    pool.take = lambda: pool.taken.append(BudgetWorker(script)) or pool.taken[-1]
    plays = list(stage.run([env()], Backend(),
                           stage.Config(plays=1, concurrency=1, env_budget=1.0), pool=pool))
    rec = plays[0]
    assert [round(w, 3) for _, w, _ in pool.taken[0].calls] == [1.0, 0.625, 0.249]
    assert rec.outcome == "env_budget" and len(rec.turns) == 1
    assert rec.error.msg == "the env used its 1s budget for one play (load, reset and 0 steps)"
    assert rec.meta["seconds"] == 0.751  # the play's time (0.75074 s), to the millisecond


def test_a_plays_sampling_seed_is_its_own_whatever_the_config_sampling_says():
    class Streaming(Backend):
        def submit(self, messages, sampling, tools=None):
            from concurrent.futures import Future
            self.samplings.append(sampling)
            done = Future()
            done.set_result(Completion("\\boxed{knock}", [1], [2], [0.0]))
            return done

    from stages.backends import Sampling
    cfg = stage.Config(plays=1, concurrency=1,
                       sampling=Sampling(temperature=0.6, max_tokens=512, seeds=(99,)))
    backend = Streaming()
    rec, _, _ = one(game([0.0, 1.0], terminal_at=2), cfg=cfg, backend=backend)
    assert [s.seed_for(0) for s in backend.samplings] == [
        derive_seed(rec.seed, "turn", turn) for turn in range(2)]
