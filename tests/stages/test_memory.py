"""Memory: examples chosen by skill, win band and regret; the store is capped."""

import random

from stages import memory
from stages.records import Env, Memory, Regret


def entry(env_id, skill="spatial", win=0.5, regret=0.0):
    return Memory(env_id=env_id, skill=skill, win_rate=win, regret=regret, snippet=env_id)


def test_positives_are_same_skill_learnable_highest_regret():
    store = [entry("a", win=0.5, regret=0.1), entry("b", win=0.5, regret=0.9),
             entry("c", win=0.95, regret=1.0), entry("d", skill="memory", win=0.5, regret=2.0),
             entry("e", win=0.3, regret=0.5)]
    selection = memory.Selection(positives=2)
    positives, negatives = memory.examples(store, "spatial", random.Random(0),
                                           memory.Selection(positives=2))
    pool = {"a", "b", "e"}
    assert {m.env_id for m in positives} <= pool and len(positives) == 2
    assert [m.env_id for m in negatives] == ["c"]
    assert selection.positive_band == (0.15, 0.85)


def test_no_examples_for_unknown_skill():
    assert memory.examples([entry("a")], "nope", random.Random(0)) == ([], [])


def test_update_refreshes_and_caps():
    envs = {f"env_{i}": Env(id=f"env_{i}", domain="game", skill="spatial", class_name="XEnv",
                            source=f"src {i}", source_hash=str(i), max_turns=5) for i in range(5)}
    store = memory.seed(envs.values())
    assert [m.win_rate for m in store] == [0.5] * 5
    regrets = [Regret(env_id="env_0", win=-0.1, solve_rate=0.2, regret=0.4, round=3)]
    updated = memory.update(store, envs, regrets, cap=3)
    assert len(updated) == 3
    assert updated[-1].env_id == "env_0" and updated[-1].win_rate == 0.2
    assert updated[-1].round == 3


def test_describe_shows_positives_as_code_and_negatives_by_class_name_only():
    negative = entry("b", win=0.97).model_copy(update={"snippet": "class BadEnv: secret code",
                                                       "meta": {"class_name": "BadEnv"}})
    good, bad = memory.describe([entry("a", win=0.4, regret=0.3)], [negative])
    assert "win rate: 0.40, regret: 0.30" in good and "```python\na\n```" in good
    assert "too easy (win rate 0.97): class BadEnv" in bad
    assert "secret code" not in bad and "```" not in bad


def test_an_entrys_win_rate_is_the_share_of_plays_won_and_ties_keep_memory_order():
    """The reference stores the share of plays with reward > 0, and sorts positives by regret
    alone, stably: of twelve equal regrets, the ten oldest entries form the pool."""
    names = [f"env_{c}" for c in "zyxwvutsrqab"]  # the two newest sort first by name
    envs = {n: Env(id=n, domain="game", skill="spatial", class_name="XEnv", source=n,
                   source_hash=n, max_turns=5) for n in names}
    regrets = [Regret(env_id=n, win=-0.046, solve_rate=0.5, regret=0.3, round=0) for n in names]
    store = memory.update([], envs, regrets)
    assert [m.win_rate for m in store] == [0.5] * 12
    picked = {m.env_id for seed in range(50)
              for m in memory.examples(store, "spatial", random.Random(seed))[0]}
    assert picked <= set(names[:10]) and len(picked) > 5
