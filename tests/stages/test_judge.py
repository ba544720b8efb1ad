"""judge: winners' actions replayed on other seeds, as plays, tell a trick from a skill."""

import pytest

from stages import judge
from stages import rollout as stage
from stages.backends.scripted import ScriptedBackend
from stages.records import Env, Judgement, Rollout, Turn
from stages.validate import source_hash

# A guessing game whose secret depends on the seed; `door` says what else wins, seed aside.
GAME = '''
import random, re, time
class GuessEnv:
    max_turns = 3
    episodes = 0
    def reset(self, seed=None):
        GuessEnv.episodes += 1
        self.secret = str(random.Random(seed).randint(10**5, 10**6))
        self.since = time.monotonic()
        return "Guess the six-digit number as \\\\boxed{N}.", {}
    def step(self, action):
        m = re.search(r"\\\\boxed\\{(.*?)\\}", action)
        guess = m.group(1).strip() if m else ""
        if guess == self.secret or DOOR:
            return "Right.", 1.0, True, False, {}
        return "Wrong.", 0.0, False, False, {}
    def solution(self):
        return ["\\\\boxed{" + self.secret + "}"]
'''
DOORS = {
    "fair": "False",
    "backdoor": 'guess[::-1] == "emases nepo"',  # "open sesame", spelled so no literal wins
    "after_a_pause": 'guess == "x" and time.monotonic() - self.since > 0.4',
    "first_episode_only": 'guess == "x" and GuessEnv.episodes == 1',
    "any_digit": 'any(c.isdigit() for c in guess)',
    "long_reply": "len(guess) > 40",
    "one_sided_tolerance": "guess.isdigit() and int(guess) >= int(self.secret)",
}
SEEDS = [11, 22, 33, 44, 55]


def env(door: str, chance: float = 0.0) -> Env:
    source = GAME.replace("DOOR", DOORS[door])
    return Env(domain="game", class_name="GuessEnv", source=source,
               source_hash=source_hash(source), max_turns=3,
               meta={"validation": {"seeds": SEEDS}, "trivial": {"chance": chance}})


def won_play(made: Env, action: str, hint: bool = False, seed: int = 7,
             waits: list[float] = ()) -> Rollout:
    return Rollout(env_id=made.id, hint=hint, seed=seed, reward=1.0, terminated=True,
                   turns=[Turn(action=action, reward=1.0)], meta={"waits": list(waits)})


def secret(seed: int) -> str:
    import random
    return str(random.Random(seed).randint(10**5, 10**6))


CFG = judge.Config(winners=2, seeds=3, env_budget=5.0)


def test_a_no_hint_winner_that_wins_other_seeds_is_a_shortcut(nsjail_ok):
    trick, fair = env("backdoor"), env("fair")
    plays = [won_play(trick, "\\boxed{open sesame}"), won_play(fair, f"\\boxed{{{secret(7)}}}")]
    verdicts = {j.env_id: j for j in judge.judge([trick, fair], plays, CFG)}
    assert (verdicts[trick.id].verdict, verdicts[trick.id].wins) == ("shortcut", 3)
    assert (verdicts[fair.id].verdict, verdicts[fair.id].wins) == ("fair", 0)
    assert verdicts[trick.id].meta["seeds"] == SEEDS[:3]  # the env's validation seeds
    assert verdicts[trick.id].meta["jail_seconds"] > 0


@pytest.mark.parametrize("door,action", [("any_digit", "\\boxed{5}"),
                                         ("long_reply", "\\boxed{" + "a" * 41 + "}"),
                                         ("one_sided_tolerance", "\\boxed{9999999}")])
def test_whatever_a_literal_check_misses_a_winner_that_transfers_is_a_shortcut(door, action,
                                                                               nsjail_ok):
    """No blind policy plays these, and no hint need name them: the agent's own win shows
    them, because the same actions win seeds they were not chosen for."""
    trick = env(door)
    (found,) = judge.judge([trick], [won_play(trick, action)], CFG)
    assert (found.verdict, found.wins) == ("shortcut", 3)


def test_a_hinted_winner_whose_actions_transfer_shows_a_leaking_hint(nsjail_ok):
    trick = env("backdoor")
    (found,) = judge.judge([trick], [won_play(trick, "\\boxed{open sesame}", hint=True)], CFG)
    assert (found.hint, found.verdict) == (True, "leak")


@pytest.mark.parametrize("door,waits", [("after_a_pause", [0.5]), ("first_episode_only", [])])
def test_a_replay_looks_like_a_play_to_the_env(door, waits, nsjail_ok):
    """A fresh worker and one reset for each replay, the recorded pause before each step: an
    env that pays only in a worker's first episode, or only after a pause, cannot tell."""
    trick = env(door)
    (found,) = judge.judge([trick], [won_play(trick, "\\boxed{x}", waits=waits)], CFG)
    assert found.verdict == "shortcut"


def test_beyond_chance_needs_two_wins_that_chance_reaches_under_one_time_in_a_hundred():
    assert not judge.transfers(1, 6, 0.0) and judge.transfers(2, 6, 0.0)
    assert not judge.transfers(5, 6, 1 / 3) and judge.transfers(6, 6, 1 / 3)   # 1.8% vs 0.14%
    assert not judge.transfers(3, 3, 1 / 3)   # one winner's three replays: 1 in 27 by luck
    assert judge.transfers(2, 3, 0.05) and not judge.transfers(2, 3, 0.2)


def test_the_chance_level_is_the_best_seed_blind_player_of_validation():
    made = env("fair", chance=0.2).model_copy(update={"meta": {
        "validation": {"seeds": SEEDS},
        "trivial": {"chance": 0.2, "wins": {"\\boxed{b}": "3/5", "echoing": "1/4", "odd": "x"}}}})
    assert judge.chance_of(made) == 0.6
    assert judge.chance_of(env("fair", chance=0.25)) == 0.25
    assert judge.chance_of(env("fair").model_copy(update={"meta": {}})) == 0.0


def test_a_fixed_answer_to_a_three_option_game_is_chance_not_a_shortcut():
    """The starter tier's games: any one letter wins about a third of the seeds, and validation's
    blind policies saw as much (`\\boxed{a}` 2/5), so a winner whose answer also wins two of its
    three replays is luck (the old mean-plus-two-deviations rule at chance 0.2 condemned it, and
    the quickstart lost two of its three games from round 1 on)."""
    assert not judge.transfers(2, 3, judge.chance_of(env("fair").model_copy(update={"meta": {
        "trivial": {"chance": 0.2, "wins": {"\\boxed{a}": "2/5"}}}})))


def test_an_env_without_winners_is_not_judged_and_winners_are_capped():
    made = env("fair")
    lost = won_play(made, "\\boxed{1}").model_copy(update={"reward": 0.0})
    assert judge.winners([lost], CFG) == {}
    many = [won_play(made, "\\boxed{1}", seed=s) for s in range(5)]
    assert len(judge.winners(many, CFG)[(made.id, False)]) == CFG.winners


def test_a_rollout_records_the_agents_pace_and_a_shortcut_blacklists_the_env(nsjail_ok):
    trick = env("backdoor")
    slow = ScriptedBackend(lambda messages, tools: __import__("time").sleep(0.2)
                           or "\\boxed{open sesame}")
    (play,) = stage.run([trick], slow, stage.Config(plays=1, concurrency=1))
    assert play.reward == 1.0 and play.meta["waits"][0] >= 0.2
    (found,) = judge.judge([trick], [play], CFG)
    blacklist = stage.Blacklist(plays=[found])
    assert trick.id in blacklist
    (skipped,) = stage.run([trick], slow, stage.Config(plays=1), blacklist=blacklist)
    assert skipped.outcome == stage.BLACKLISTED


def test_condemned_names_the_envs_of_one_verdict():
    shortcut = Judgement(env_id="env_a", verdict="shortcut")
    leak = Judgement(env_id="env_b", hint=True, verdict="leak")
    assert judge.condemned([shortcut, leak]) == {"env_a"}
    assert judge.condemned([shortcut, leak], ("leak",)) == {"env_b"}
