"""stages/memory.py at its limits: both edges of the learnable band and of the negative
thresholds, the positive pool's size, the snippet and store caps, refresh order, and the exact
text blocks the designer prompt shows."""

from __future__ import annotations

import random

import pytest

from stages import memory
from stages.memory import CAP, SNIPPET_CHARS, Selection
from stages.records import Env, Memory, Regret


def env(name: str, source: str | None = None, skill: str = "spatial") -> Env:
    return Env(id=name, domain="game", skill=skill, class_name=f"{name.title()}Env",
               source=source if source is not None else f"src {name}", source_hash=name,
               max_turns=5)


def entry(env_id, skill="spatial", win=0.5, regret=0.0, class_name=None):
    meta = {"class_name": class_name} if class_name else {}
    return Memory(env_id=env_id, skill=skill, win_rate=win, regret=regret, snippet=env_id,
                  meta=meta)


def ever_picked(store, skill="spatial", selection=Selection(), seeds=200):
    pos, neg = set(), set()
    for s in range(seeds):
        p, n = memory.examples(store, skill, random.Random(s), selection)
        pos |= {m.env_id for m in p}
        neg |= {m.env_id for m in n}
    return pos, neg


def test_default_selection_is_the_papers_band_thresholds_and_counts():
    s = Selection()
    assert s.positive_band == (0.15, 0.85)
    assert (s.negative_low, s.negative_high) == (0.1, 0.9)
    assert (s.positives, s.negatives) == (2, 1)
    assert (CAP, SNIPPET_CHARS) == (200, 2000)


@pytest.mark.parametrize("win,positive", [(0.15, True), (0.1499, False), (0.85, True),
                                          (0.8501, False), (0.5, True)])
def test_both_edges_of_the_learnable_band_are_inclusive(win, positive):
    store = [entry("a", win=win, regret=0.3)]
    positives, _ = memory.examples(store, "spatial", random.Random(0))
    assert [m.env_id for m in positives] == (["a"] if positive else [])


@pytest.mark.parametrize("win,negative", [(0.1, False), (0.0999, True), (0.9, False),
                                          (0.9001, True), (0.0, True), (1.0, True),
                                          (0.5, False)])
def test_negatives_lie_strictly_outside_the_thresholds(win, negative):
    store = [entry("a", win=win)]
    _, negatives = memory.examples(store, "spatial", random.Random(0))
    assert [m.env_id for m in negatives] == (["a"] if negative else [])


def test_custom_thresholds_are_the_ones_applied():
    store = [entry("lo", win=0.25), entry("mid", win=0.5), entry("hi", win=0.75)]
    sel = Selection(positive_band=(0.4, 0.6), negative_low=0.3, negative_high=0.7,
                    positives=3, negatives=3)
    positives, negatives = memory.examples(store, "spatial", random.Random(0), sel)
    assert [m.env_id for m in positives] == ["mid"]
    assert sorted(m.env_id for m in negatives) == ["hi", "lo"]


def test_examples_give_at_most_the_asked_counts_and_all_when_fewer_exist():
    store = [entry(f"p{i}", win=0.5, regret=i) for i in range(5)]
    store += [entry(f"n{i}", win=0.0) for i in range(4)]
    positives, negatives = memory.examples(store, "spatial", random.Random(0))
    assert len(positives) == 2 and len(negatives) == 1
    sel = Selection(positives=7, negatives=6)
    positives, negatives = memory.examples(store, "spatial", random.Random(0), sel)
    assert len(positives) == 5 and len(negatives) == 4
    assert len({m.env_id for m in positives}) == 5  # sampled without repeats


def test_examples_of_a_seed_are_reproducible():
    store = [entry(f"p{i}", win=0.5, regret=i / 10) for i in range(8)]
    store += [entry(f"n{i}", win=0.99) for i in range(5)]
    runs = {str(memory.examples(store, "spatial", random.Random(7))) for _ in range(3)}
    assert len(runs) == 1


def test_the_positive_pool_is_the_ten_highest_regrets_by_default():
    # twelve learnable entries, regrets 0..11: only the top ten (2..11) are ever picked
    store = [entry(f"e{i:02d}", win=0.5, regret=float(i)) for i in range(12)]
    positives, _ = ever_picked(store)
    assert positives == {f"e{i:02d}" for i in range(2, 12)}


def test_the_positive_pool_grows_to_three_times_the_positives_asked():
    # positives=4: the pool is max(12, 10) = 12 of fourteen
    store = [entry(f"e{i:02d}", win=0.5, regret=float(i)) for i in range(14)]
    positives, _ = ever_picked(store, selection=Selection(positives=4))
    assert positives == {f"e{i:02d}" for i in range(2, 14)}


def test_only_the_same_skill_gives_examples():
    store = [entry("a", skill="memory", win=0.5), entry("b", skill="memory", win=0.0)]
    assert memory.examples(store, "spatial", random.Random(0)) == ([], [])
    positives, negatives = memory.examples(store, "memory", random.Random(0))
    assert [m.env_id for m in positives] == ["a"] and [m.env_id for m in negatives] == ["b"]


def test_an_entry_keeps_exactly_snippet_chars_of_the_source_and_the_envs_names():
    exact = memory.entry(env("exact", source="x" * SNIPPET_CHARS))
    longer = memory.entry(env("longer", source="y" * SNIPPET_CHARS + "z"))
    assert exact.snippet == "x" * SNIPPET_CHARS
    assert longer.snippet == "y" * SNIPPET_CHARS
    e = env("box", skill="logic")
    m = memory.entry(e, win_rate=0.25, regret=0.75, round=4)
    assert (m.env_id, m.skill, m.win_rate, m.regret, m.round) == ("box", "logic", 0.25, 0.75, 4)
    assert m.parents == ["box"]
    assert m.meta == {"domain": "game", "class_name": "BoxEnv"}


def test_seeded_entries_are_neutral_positives_of_no_round():
    store = memory.seed([env("a"), env("b")])
    assert [(m.env_id, m.win_rate, m.regret, m.round) for m in store] == [
        ("a", 0.5, 0.0, -1), ("b", 0.5, 0.0, -1)]
    positives, negatives = memory.examples(store, "spatial", random.Random(0))
    assert len(positives) == 2 and negatives == []


def test_update_stores_the_share_of_plays_won_not_the_mean_reward():
    store = memory.update([], {"a": env("a")},
                          [Regret(env_id="a", win=-0.4, solve_rate=0.3, regret=0.2, round=2)])
    assert [(m.win_rate, m.regret, m.round) for m in store] == [(0.3, 0.2, 2)]


def test_update_skips_regrets_of_unknown_envs_and_keeps_the_rest_in_order():
    store = memory.seed([env("a"), env("b")])
    out = memory.update(store, {"a": env("a"), "b": env("b")},
                        [Regret(env_id="ghost", solve_rate=0.9),
                         Regret(env_id="a", solve_rate=0.75)])
    assert [m.env_id for m in out] == ["b", "a"]  # the regret after the unknown one counts
    assert [m.win_rate for m in out] == [0.5, 0.75]


def test_a_refreshed_entry_moves_to_the_newest_end_and_replaces_the_old_one():
    envs = {n: env(n) for n in "abc"}
    store = memory.seed(envs.values())
    out = memory.update(store, envs, [Regret(env_id="a", solve_rate=0.9, regret=0.1, round=1)])
    assert [m.env_id for m in out] == ["b", "c", "a"]
    assert out[-1].win_rate == 0.9 and len(out) == 3


def test_the_store_keeps_the_newest_cap_entries_at_and_past_the_cap():
    envs = {f"e{i:03d}": env(f"e{i:03d}") for i in range(CAP + 1)}
    regrets = [Regret(env_id=n, solve_rate=0.5) for n in envs]
    full = memory.update([], envs, regrets[:CAP])
    assert len(full) == CAP and full[0].env_id == "e000"
    over = memory.update([], envs, regrets)
    assert len(over) == CAP
    assert over[0].env_id == "e001" and over[-1].env_id == f"e{CAP:03d}"
    assert [m.env_id for m in memory.update([], envs, regrets[:3], cap=3)] == [
        "e000", "e001", "e002"]
    assert [m.env_id for m in memory.update([], envs, regrets[:4], cap=3)] == [
        "e001", "e002", "e003"]


def test_describe_prints_the_exact_blocks_the_designer_reads():
    good, bad = memory.describe(
        [entry("a", win=0.4, regret=0.3), entry("b", skill="logic", win=0.125, regret=1.0)],
        [entry("c", win=0.97, class_name="EasyEnv"), entry("d", win=0.5)])
    assert good == (
        "These worked well: the agent won some plays and the hint helped. Learn from "
        "how they are built and how hard they are, then design a new game of your own: "
        "not one of these again with other names or numbers."
        "\n### Example 1 (skill: spatial, win rate: 0.40, regret: 0.30)\n```python\na\n```\n"
        "\n### Example 2 (skill: logic, win rate: 0.12, regret: 1.00)\n```python\nb\n```\n")
    # a negative at exactly 0.5 is "too hard"; without a class name it is named by its id
    assert bad == ("\nAvoid environments like:"
                   "\n- too easy (win rate 0.97): class EasyEnv"
                   "\n- too hard (win rate 0.50): class d\n")


def test_describe_of_nothing_is_two_empty_blocks():
    assert memory.describe([], []) == ("", "")
    good, bad = memory.describe([], [entry("x", win=0.51, class_name="X")])
    assert good == "" and bad == "\nAvoid environments like:\n- too easy (win rate 0.51): class X\n"
    good, bad = memory.describe([entry("y")], [])
    assert bad == "" and good.startswith("These worked well")
