"""rollout: episode rewards, turn caps, hints, misbehaving envs, token bookkeeping."""


import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox.jail import Limits, Sandbox
from stages import rollout as stage
from stages import seed_library
from stages.backends.scripted import ScriptedBackend
from stages.records import Env, Rollout
from stages.shards import read
from stages.validate import source_hash

# A door that opens after three knocks; the observation says how many are left.
KNOCK = '''
import re
class KnockEnv:
    max_turns = 6
    def reset(self, seed=None):
        self.left = 3
        return f"Knock 3 times with \\\\boxed{{knock}}. {self.left} left.", {}
    def step(self, action):
        m = re.search(r"\\\\boxed\\{(.*?)\\}", action)
        if m and m.group(1).strip() == "knock":
            self.left -= 1
        if m and m.group(1).strip() == "CRASH":
            raise ValueError("boom")
        if m and m.group(1).strip() == "HANG":
            while True:
                pass
        if self.left == 0:
            return "The door opens.", 1.0, True, False, {}
        return f"{self.left} left.", 0.25, False, False, {}
    def solution(self):
        return ["\\\\boxed{knock}"] * 3
'''


def env(source=KNOCK, max_turns=6, hint=None, domain="game", tools=()):
    return Env(domain=domain, class_name="KnockEnv", source=source, source_hash=source_hash(source),
               max_turns=max_turns, hint=hint, tools=list(tools))


def scripted(action):
    return ScriptedBackend(lambda messages, tools: f"Let me think. \\boxed{{{action}}}")


CFG = stage.Config(plays=2, concurrency=2, sandbox=Sandbox(limits=Limits(call_timeout=2)))


def test_winning_play_gets_the_last_step_reward(nsjail_ok):
    plays = list(stage.run([env()], scripted("knock"), CFG))
    assert len(plays) == 2
    for play in plays:
        assert play.reward == 1.0 and play.terminated and not play.truncated
        assert [t.action for t in play.turns] == ["\\boxed{knock}"] * 3
        assert [t.reward for t in play.turns] == [0.25, 0.25, 1.0]
        assert play.outcome == "ok" and play.ok and play.parents == [env().id]
    assert plays[0].seed != plays[1].seed


def test_partial_rewards_without_termination_score_zero(nsjail_ok):
    play = next(stage.run([env(max_turns=4)], scripted("wait"), CFG))
    assert play.truncated and not play.terminated
    assert len(play.turns) == 4 and play.reward == 0.0


def test_turn_cap_under_the_env_max_turns(nsjail_ok):
    cfg = stage.Config(plays=1, max_turns=2, sandbox=CFG.sandbox)
    play = next(stage.run([env()], scripted("wait"), cfg))
    assert len(play.turns) == 2 and play.truncated


def test_hint_goes_into_the_first_observation_only(nsjail_ok):
    seen = []

    def respond(messages, tools):
        seen.append([m["content"] for m in messages if m["role"] == "user"])
        return "\\boxed{knock}"

    cfg = stage.Config(plays=1, hint=True, sandbox=CFG.sandbox)
    play = next(stage.run([env(hint="knock, knock, knock")], ScriptedBackend(respond), cfg))
    assert seen[0][0].endswith("HINT: knock, knock, knock")
    assert all("HINT" not in later for later in seen[-1][1:])
    assert play.hint is True and play.meta["hint_text"] == "knock, knock, knock"


def test_a_hinted_stage_does_not_play_an_env_without_a_hint(nsjail_ok):
    cfg = stage.Config(plays=1, hint=True, sandbox=CFG.sandbox)
    plays = list(stage.run([env(), env(hint="knock, knock, knock", max_turns=5)],
                           scripted("knock"), cfg))
    assert [p.meta["hint_text"] for p in plays] == ["knock, knock, knock"]


def test_crashing_env_is_a_recorded_outcome(nsjail_ok):
    play = next(stage.run([env()], scripted("CRASH"), CFG))
    assert play.outcome == "program_error" and play.ok is False and play.reward == 0.0
    assert "ValueError" in play.error.msg or "boom" in play.error.msg
    assert len(play.turns) == 1


def test_hanging_env_times_out_without_hanging_the_stage(nsjail_ok):
    play = next(stage.run([env()], scripted("HANG"), CFG))
    assert play.outcome == "timeout" and play.error.type == "env.timeout"


# Instant on the validator's action, slow on anything else: an env that holds a stage hostage.
STALLING = KNOCK.replace('''        if m and m.group(1).strip() == "CRASH":''', '''        if not (m and m.group(1).strip() == "knock"):
            import time
            time.sleep(0.4)
        if m and m.group(1).strip() == "CRASH":''')
BUDGET = stage.Config(plays=4, concurrency=1, env_budget=1.0,
                      sandbox=Sandbox(limits=Limits(call_timeout=2)))


def test_a_play_past_its_env_budget_ends_with_that_outcome(nsjail_ok):
    play = next(stage.run([env(STALLING)], scripted("wait"), replace(BUDGET, plays=1)))
    assert play.outcome == "env_budget" and play.ok is False and play.reward == 0.0
    assert "1s budget" in play.error.msg
    assert 0.9 <= play.meta["seconds"] <= 1.5  # cut at the budget, not at the next step
    assert len(play.turns) == 3  # two slow steps fit, the third ran out of budget


def test_the_budget_counts_the_env_time_only(nsjail_ok):
    slow_agent = ScriptedBackend(lambda messages, tools: time.sleep(0.4) or "\\boxed{knock}")
    play = next(stage.run([env()], slow_agent, replace(BUDGET, plays=1, env_budget=0.5)))
    assert play.outcome == "ok" and play.reward == 1.0
    assert play.meta["seconds"] > 1.0  # three turns of a slow agent, well past the budget


def test_an_env_that_ran_out_the_clock_is_not_played_again(nsjail_ok):
    started = time.monotonic()
    plays = list(stage.run([env(STALLING), env()], scripted("wait"), BUDGET))
    assert [p.outcome for p in plays[:4]] == ["env_budget"] + ["blacklisted"] * 3
    assert all(p.turns == [] and p.error.type == "env.blacklisted" for p in plays[1:4])
    assert [p.outcome for p in plays[4:]] == ["ok"] * 4  # the other env plays on
    assert time.monotonic() - started < 4 * BUDGET.env_budget  # one budget, not four


def test_blacklist_after_counts_stalled_plays(nsjail_ok):
    plays = list(stage.run([env(STALLING)], scripted("wait"), replace(BUDGET, blacklist_after=2)))
    assert [p.outcome for p in plays] == ["env_budget", "env_budget", "blacklisted", "blacklisted"]


def test_earlier_rounds_blacklist_an_env_for_the_rest_of_its_set(nsjail_ok):
    knock = env()
    earlier = [Rollout(env_id=knock.id, hint=True, seed=1, outcome="timeout", ok=False)]
    plays = list(stage.run([knock], scripted("knock"), BUDGET,
                           blacklist=stage.Blacklist(1, earlier)))
    assert [p.outcome for p in plays] == ["blacklisted"] * 4
    later = stage.Blacklist(1, plays)  # a blacklisted round keeps the env blacklisted
    assert knock.id in later and env(STALLING).id not in later


HOG = Path(__file__).parents[1] / "adversarial" / "programs" / "budget_hog_first_episode.py"


def test_an_env_that_uses_most_of_its_budget_on_every_play_is_blacklisted(nsjail_ok):
    """A second a step of a 1.6 s budget, never past it: the fourth play is cut at its load
    (the four have used more than a quarter of their budgets on average), the rest skipped."""
    hog = env(HOG.read_text(), max_turns=1)
    cfg = replace(BUDGET, plays=6, env_budget=1.6)
    plays = list(stage.run([hog], scripted("wait"), cfg))
    assert [p.outcome for p in plays] == ["ok"] * 3 + ["env_budget"] + ["blacklisted"] * 2
    assert all(p.meta["env_seconds"] >= 1.0 for p in plays[:3])
    assert "more than the 25% an env may use over many plays" in plays[3].error.msg


def test_game_actions_are_normalised_to_the_last_box():
    assert stage.game_action("try \\boxed{a} then \\boxed{b {c}}") == "\\boxed{b {c}}"
    assert stage.game_action("no box here") == "no box here"


def test_output_is_in_env_then_play_order(nsjail_ok):
    envs = [env(), env(source=KNOCK.replace("3 times", "three times"))]
    plays = list(stage.run(envs, scripted("knock"), stage.Config(plays=3, concurrency=4,
                                                                  sandbox=CFG.sandbox)))
    assert [(p.env_id, p.meta["play"]) for p in plays] == [
        (e.id, i) for e in envs for i in range(3)]


def test_tool_use_format_error_costs_and_continues(nsjail_ok):
    tool_env = next(e for e in read([str(seed_library.ENV_SHARD)]) if e.domain == "tool_use")
    replies = iter(["I will just talk."] + ["<answer>done</answer>"] * 30)
    backend = ScriptedBackend(lambda messages, tools: next(replies))
    play = next(stage.run([tool_env], backend, stage.Config(plays=1, sandbox=CFG.sandbox)))
    assert play.turns[0].reward == pytest.approx(-0.1)
    assert len(play.turns) > 1 and play.reward == 0.0


def test_tiny_model_turns_keep_token_bookkeeping(tiny_backend, nsjail_ok):
    cfg = stage.Config(plays=2, max_turns=3, sandbox=CFG.sandbox,
                       sampling=stage.Sampling(max_tokens=12))
    plays = list(stage.run([env()], tiny_backend, cfg))
    tokenizer = tiny_backend.tokenizer
    for play in plays:
        assert play.policy == tiny_backend.policy
        for turn in play.turns:
            assert tokenizer.decode(turn.completion_ids, skip_special_tokens=True) == turn.completion
            assert turn.action == stage.game_action(turn.completion)
            assert len(turn.logprobs) == len(turn.completion_ids)
            prompt = tokenizer.decode(turn.prompt_ids)
            assert prompt.endswith("<|im_start|>assistant\n")
        # turn k's prompt holds every earlier completion and observation: nothing unsampled
        for earlier, later in zip(play.turns, play.turns[1:]):
            assert later.prompt_ids[:len(earlier.prompt_ids)] == earlier.prompt_ids
            assert earlier.completion in tokenizer.decode(later.prompt_ids)


def test_step_returning_the_wrong_shape_is_a_recorded_outcome(nsjail_ok):
    broken = KNOCK.replace('return f"{self.left} left.", 0.25, False, False, {}',
                           'return f"{self.left} left.", 0.25, False')
    play = next(stage.run([env(source=broken)], scripted("wait"), CFG))
    assert play.outcome == "program_error" and play.error.type == "env.program_error"
    assert play.error.msg.startswith("step: must return (observation, reward, terminated"), \
        play.error.msg  # the reply check in sandbox/replies.py names what is wrong


def test_a_static_pool_is_played_a_slice_per_round_every_env_once_per_pass():
    """The fixed-env baseline: 24 of the pool per round without replacement (reference:
    --spade-no-replacement), reproducible from the seed."""
    envs_for_round = stage.envs_for_round
    pool = [f"env_{i:02d}" for i in range(10)]
    slices = [envs_for_round(pool, 3, r, seed=1) for r in range(6)]
    assert all(len(chosen) == 3 for chosen in slices)
    assert len(set().union(*slices[:3])) == 9 and len(set().union(*slices[3:])) == 9
    assert slices == [envs_for_round(reversed(pool), 3, r, seed=1) for r in range(6)]
    assert slices != [envs_for_round(pool, 3, r, seed=2) for r in range(6)]
    assert envs_for_round(pool, 24, 7, seed=1) == set(pool)


# A room whose description is a flood: 20,000 characters at reset, 9,000 after every step.
FLOOD = '''
class KnockEnv:
    max_turns = 3
    def reset(self, seed=None):
        return "x" * 20000, {}
    def step(self, action):
        return "y" * 9000, 0.0, False, False, {}
    def solution(self):
        return ["\\\\boxed{knock}"]
'''


def test_observations_are_capped_and_the_cut_marked(nsjail_ok):
    seen = []

    def respond(messages, tools):
        seen.append([m["content"] for m in messages if m["role"] == "user"])
        return "\\boxed{knock}"

    cfg = stage.Config(plays=1, max_observation_chars=1000, sandbox=CFG.sandbox)
    play = next(stage.run([env(source=FLOOD, max_turns=3)], ScriptedBackend(respond), cfg))
    assert play.outcome == "ok" and len(play.turns) == 3
    first = seen[0][0]
    assert "x" * 1000 + "... [truncated 19000 chars]" in first and "x" * 1001 not in first
    assert seen[1][1] == "y" * 1000 + "... [truncated 8000 chars]"
    assert all(t.observation == "y" * 1000 + "... [truncated 8000 chars]" for t in play.turns)


def test_a_conversation_past_the_context_ends_the_play_with_context_limit(tiny_backend,
                                                                           tiny_model,
                                                                           nsjail_ok):
    from stages.backends import BackendSpec, load_backend

    seen = []
    list(stage.run([env()], ScriptedBackend(lambda messages, tools: seen.append(messages) or "x"),
                   stage.Config(plays=1, max_turns=1, sandbox=CFG.sandbox)))
    first_prompt = tiny_backend.render(seen[0], None)
    # the first prompt fits; the second holds a completion and an observation more
    backend = load_backend(BackendSpec(name="hf", model=tiny_model,
                                       options={"context_length": len(first_prompt) + 10}))
    # stop strings end the random model's turn early, so the play goes on to a second turn
    sampling = stage.Sampling(max_tokens=8, stop=tuple("abcdefghijklmnopqrstuvwxyz "))
    cfg = stage.Config(plays=1, sandbox=CFG.sandbox, sampling=sampling)
    play = next(stage.run([env()], backend, cfg))
    assert play.turns[0].finish_reason == "stop"
    assert play.outcome == "context_limit" and play.ok and play.error is None
    assert play.truncated and not play.terminated and play.reward == 0.0
    assert len(play.turns) == 1 and play.turns[0].prompt_ids == first_prompt


def test_the_episode_budget_bounds_generation(tiny_backend, nsjail_ok):
    """A budget spent before the model's turn: the model is not called, the play is cut."""
    cfg = stage.Config(plays=1, episode_timeout=0.0, sandbox=CFG.sandbox,
                       sampling=stage.Sampling(max_tokens=4000))
    play = next(stage.run([env()], tiny_backend, cfg))
    assert play.outcome == "episode_timeout" and play.ok and play.truncated
    assert play.turns == [] and play.reward == 0.0


# -- schedules: barrier-free (streaming backends) and turn-batched ----------------------------

def slow_scripted(action, seen):
    """A streaming scripted backend whose latency depends on the request's seed (so plays finish
    out of order), noting (conversation, seed) of every request in `seen`."""
    def latency(sampling):
        seen.append(sampling.seed)
        return (sampling.seed % 7) * 0.01

    def respond(messages, tools):
        return f"Let me think. \\boxed{{{action}}}"
    return ScriptedBackend(respond, latency=latency)


def without_timing(plays):
    return [p.model_dump(exclude={"meta": {"seconds", "waits", "env_seconds"}}) for p in plays]


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_plays_do_not_depend_on_the_schedule(nsjail_ok, concurrency):
    """Barrier-free at any concurrency gives the turn-batched records, and every model call
    gets the seed of its (play, turn), whatever the order calls are made in."""
    envs = [env(), env(KNOCK.replace("self.left = 3", "self.left = 2"))]
    base = stage.Config(plays=3, concurrency=2, barrier=True,
                        sandbox=Sandbox(limits=Limits(call_timeout=2)))
    seen_batched, seen_free = [], []
    batched = list(stage.run(envs, slow_scripted("knock", seen_batched), base))
    free = list(stage.run(envs, slow_scripted("knock", seen_free),
                          stage.Config(**{**base.__dict__, "barrier": False,
                                          "concurrency": concurrency})))
    assert without_timing(free) == without_timing(batched)
    assert sorted(seen_free) == sorted(seen_batched)
    expected = {stage.derive_seed(p.seed, "turn", t) for p in batched for t in range(len(p.turns))}
    assert set(seen_free) == expected and len(seen_free) == len(expected)


def test_barrier_free_plays_finish_out_of_order_and_are_written_in_order(nsjail_ok):
    """Play 0 is slow, play 1 fast: play 1 ends first, the output is still (env, play) order.
    "Slow" is an event, not a latency: the slow play's completion is held until the fast play's
    three turns have come back, so a loaded machine cannot reorder them."""
    slow, fast = env(KNOCK.replace("Knock 3 times", "Knock thrice")), env()
    slow_seeds = {stage.derive_seed(stage.play_seed(slow.id, False, 0, 0, 0), "turn", t)
                  for t in range(3)}
    returned = []

    class FastFirst(ScriptedBackend):
        lock, held, fast_done = threading.Lock(), [], 0

        def submit(self, messages, sampling, tools=None):
            completion = super().submit(messages, sampling, tools).result()
            future, release = Future(), []
            with self.lock:
                if sampling.seed in slow_seeds and self.fast_done < 3:
                    self.held.append((future, completion))  # answered once the fast play ends
                    # ... or after 30 s, should plays wait on each other: the order then fails
                    late = threading.Timer(30, lambda: future.done() or future.set_result(
                        completion))
                    late.daemon = True
                    late.start()
                    return future
                returned.append(sampling.seed in slow_seeds)
                self.fast_done += sampling.seed not in slow_seeds
                if self.fast_done == 3:
                    release, self.held[:] = list(self.held), []
                    returned.extend(True for _ in release)
            future.set_result(completion)
            for held, done in release:
                held.set_result(done)
            return future

    plays = list(stage.run([slow, fast], FastFirst(lambda messages, tools: "\\boxed{knock}"),
                           stage.Config(plays=1, concurrency=2,
                                        sandbox=Sandbox(limits=Limits(call_timeout=2)))))
    assert [p.env_id for p in plays] == [slow.id, fast.id]
    assert all(p.reward == 1.0 for p in plays)
    assert returned == [False] * 3 + [True] * 3  # the fast play's three turns came back first


def test_an_engine_failure_stops_the_stage_and_releases_every_jail(nsjail_ok):
    from concurrent.futures import Future

    from stages.backends import BackendUnavailable

    class Failing(ScriptedBackend):
        def submit(self, messages, sampling, tools=None):
            future = Future()
            future.set_exception(BackendUnavailable("server went away"))
            return future

    pool_cfg = stage.Config(plays=4, concurrency=4, sandbox=Sandbox(limits=Limits(call_timeout=2)))
    from sandbox.pool import WorkerPool

    with WorkerPool(pool_cfg.sandbox, 4, 4) as pool:
        with pytest.raises(BackendUnavailable):
            list(stage.run([env()], Failing(lambda m, t: ""), pool_cfg, pool))
        assert pool.retired  # the opened plays gave their workers back
