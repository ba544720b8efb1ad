"""score-regret at its boundaries: the window exactly as wide as configured, an env with exactly
half its plays broken, older hinted rounds left out, internal errors counted as broken, records
for envs the stage has never seen, and the round diagnostics."""

import logging

import pytest

from stages import score_regret as stage
from stages.isolation import INTERNAL
from stages.records import Design, Env, Regret, Rollout, Validation
from stages.rewards import RewardConfig

LP = RewardConfig(variant="learning_potential")


def env(name, skill="spatial", parents=None, policy=None, **kw):
    return Env(id=f"env_{name}", domain="game", skill=skill, class_name="XEnv", source=name,
               source_hash=name, max_turns=5,
               parents=[f"des_{name}"] if parents is None else parents, policy=policy, **kw)


def plays(env_id, rewards, hint=False, round=0, outcome="ok"):
    return [Rollout(env_id=env_id, hint=hint, round=round, reward=r, seed=i, outcome=outcome,
                    ok=outcome == "ok") for i, r in enumerate(rewards)]


def score(records, **cfg):
    return stage.run(records, stage.Config(**cfg))


def by_env(regrets):
    return {r.env_id: r for r in regrets}


def test_the_window_is_exactly_as_wide_as_configured():
    # round 5, window 4: rounds 2..5 count, round 1 (one too old) and round 6 (future) do not
    records = [env("a")] + plays("env_a", [0, 0], round=1) + plays("env_a", [1], round=2) \
        + plays("env_a", [0.5], round=5) + plays("env_a", [0, 0, 0], round=6)
    (regret,), _ = score(records, round=5, window=4)
    assert regret.n_no_hint == 2 and regret.win == pytest.approx(0.75)
    (one,), _ = score(records, round=5, window=1)
    assert one.n_no_hint == 1 and one.win == 0.5


@pytest.mark.parametrize("broken_plays,total,broken", [(2, 4, False), (3, 5, True), (2, 5, False),
                                                       (3, 4, True), (1, 3, False)])
def test_an_env_is_broken_only_when_more_than_half_its_plays_broke(broken_plays, total, broken):
    records = [env("a"), env("b")] + plays("env_a", [1] * (total - broken_plays)) \
        + plays("env_a", [0] * broken_plays, outcome="timeout") + plays("env_b", [1, 0])
    regrets, diag = score(records, rewards=RewardConfig(invalid_penalty=-0.25))
    a = by_env(regrets)["env_a"]
    assert a.broken is broken and (a.designer_reward == -0.25) is broken
    assert diag.invalid == int(broken) and diag.envs == 2 - int(broken)


def test_internal_error_plays_count_as_broken():
    records = [env("a")] + plays("env_a", [1]) + plays("env_a", [0, 0], outcome=INTERNAL)
    (regret,), diag = score(records, rewards=RewardConfig(invalid_penalty=-0.25))
    assert regret.broken and regret.designer_reward == -0.25 and diag.invalid == 1


def test_hinted_plays_of_older_rounds_are_not_counted():
    records = [env("a")] + plays("env_a", [0, 0, 0], hint=True, round=0) \
        + plays("env_a", [1, 1], hint=True, round=1) \
        + plays("env_a", [1, 1], round=0) + plays("env_a", [0.5, 0], round=1)
    (regret,), _ = score(records, round=1)
    assert regret.hint_reward == 1.0 and regret.n_hint == 2
    assert regret.no_hint_reward == 0.25  # the hinted round's no-hint plays, not round 0's
    assert regret.regret == pytest.approx(0.75)


def test_an_env_with_hinted_plays_only_wins_nothing_and_keeps_its_hint_reward():
    (regret,), _ = score([env("a")] + plays("env_a", [1, 0.5], hint=True))
    assert regret.ok and not regret.broken
    assert regret.no_hint_reward is None and regret.hint_reward == 0.75
    assert regret.regret == 0.75 and regret.win == 0.0 and regret.solve_rate == 0.0
    assert regret.n_no_hint == 0


def test_the_record_carries_round_variant_policy_and_lineage():
    records = [env("a", policy="pol_1"), env("b", parents=[])] + plays("env_a", [1, 0], round=3) \
        + plays("env_a", [1], hint=True, round=3) + plays("env_b", [1], round=3)
    regrets, _ = score(records, round=3, rewards=RewardConfig(variant="solve_rate"))
    a, b = by_env(regrets)["env_a"], by_env(regrets)["env_b"]
    assert a.round == b.round == 3 and a.variant == b.variant == "solve_rate"
    assert a.policy == "pol_1" and a.n_hint == 1 and a.design_id == "des_a"
    assert b.ok and b.design_id is None and b.parents == ["env_b"] and b.policy is None


def test_plays_of_an_env_without_its_env_record_are_scored_under_no_skill():
    records = plays("env_x", [1, 1]) + plays("env_y", [0, 0])
    regrets, _ = score(records, rewards=LP)
    x, y = by_env(regrets)["env_x"], by_env(regrets)["env_y"]
    assert x.ok and y.ok and x.skill == y.skill == "" and x.policy is None
    assert x.parents == ["env_x"] and x.design_id is None and x.chance is None
    # learning potential: each against the pooled mean of the no-skill envs (0.5)
    assert x.designer_reward == pytest.approx(0.5) and y.designer_reward == pytest.approx(0.5)


def test_one_env_scale_is_its_plays_times_the_window():
    (regret,), _ = score([env("a")] + plays("env_a", [1, 0]), window=4)
    assert regret.meta["scale"] == pytest.approx(2 / 1 * 4)


def test_records_of_other_kinds_and_the_current_round_are_not_history():
    base = [env("a")] + plays("env_a", [1, 1, 0, 0], round=4)
    (alone,), _ = score(base, round=4, window=2, rewards=LP)
    design = Design(round=1, skill="spatial", completion="x")
    same_round = Regret(env_id="env_z", skill="spatial", round=4, win=0.0, n_no_hint=4)
    (mixed,), _ = score([design, same_round] + base, round=4, window=2, rewards=LP)
    assert mixed.designer_reward == alone.designer_reward == 0.0


def history(*rounds_wins):
    return [Regret(env_id="env_h", skill="spatial", round=r, win=w, n_no_hint=n)
            for r, w, n in rounds_wins]


def test_learning_potential_chains_the_ema_over_every_closed_set():
    # k = 2, scoring round 4: the sets closed at rounds 1 and 3 both update the tracker
    # (0.2, then 0.6 with gamma 0.85), then the current window's mean 0.5
    gamma = 0.85
    expected = (1 - gamma) * ((1 - gamma) * 0.2 + gamma * 0.6) + gamma * 0.5
    records = [env("a")] + history((1, 0.2, 4), (3, 0.6, 4)) + plays("env_a", [1, 0], round=4)
    (regret,), _ = score(records, round=4, window=2, rewards=LP)
    assert regret.designer_reward == pytest.approx(abs(0.5 - expected))


def test_learning_potential_of_a_skill_with_history_but_no_counted_play_this_window():
    records = [env("a")] + history((1, 0.5, 4)) + plays("env_a", [1, 1], hint=True, round=3)
    (regret,), _ = score(records, round=3, window=2, rewards=LP)
    assert regret.win == 0.0 and regret.designer_reward == pytest.approx(0.5)


def test_a_closed_set_without_play_counts_is_averaged_unweighted():
    records = [env("a")] + history((1, 0.2, 0), (1, 0.6, 0)) + plays("env_a", [1, 1], hint=True,
                                                                       round=3)
    (regret,), _ = score(records, round=3, window=2, rewards=LP)
    assert regret.designer_reward == pytest.approx(0.4)


def test_at_chance_both_sides_of_two_standard_errors():
    # chance 0.5 over 4 plays: 2 * sqrt(0.25 / 4) = 0.5 exactly, and the bound is inclusive
    assert stage.at_chance(1.0, 0.5, 4) and stage.at_chance(0.0, 0.5, 4)
    assert stage.at_chance(0.0, 0.5, 1)  # one play: 2 * 0.5 = 1 wide
    assert not stage.at_chance(0.5, 0.5, 0)  # no plays: nothing to compare


def test_a_rejected_design_penalty_record():
    rejects = [Validation(check="oracle", skill="memory", parents=["des_c"], policy="pol_2"),
               Validation(check="size", skill="memory")]
    records = [env("a")] + plays("env_a", [1, 0]) + rejects
    regrets, diag = score(records, round=2, rewards=RewardConfig(reject_penalty=-0.5,
                                                                  variant="solve_rate"))
    c, orphan = regrets[1], regrets[2]
    assert c.env_id == "" and c.skill == "memory" and c.round == 2 and c.policy == "pol_2"
    assert c.regret == 0.0 and c.win == 0.0 and c.broken and c.variant == "solve_rate"
    assert c.parents == ["des_c"] and c.design_id == "des_c" and c.rejected_by == "oracle"
    assert orphan.design_id is None and orphan.parents == [] and orphan.rejected_by == "size"
    assert diag.invalid == 2 and diag.envs == 1


def test_an_env_that_cannot_be_scored_gets_a_broken_record(monkeypatch, caplog):
    real = stage.rewards.regret

    def flaky(hinted, no_hint):
        if 0.25 in hinted:
            raise OverflowError("a case score-regret does not handle")
        return real(hinted, no_hint)

    monkeypatch.setattr(stage.rewards, "regret", flaky)
    records = [env("good"), env("bad", skill="memory", policy="pol_3")] \
        + plays("env_good", [0.5], hint=True) + plays("env_good", [0.5]) \
        + plays("env_bad", [0.25], hint=True) + plays("env_bad", [0.5])
    with caplog.at_level(logging.WARNING):
        regrets, diag = score(records, round=1, rewards=RewardConfig(invalid_penalty=-0.75,
                                                                     variant="solve_rate"))
    bad = by_env(regrets)["env_bad"]
    assert "env_bad" in caplog.text
    assert not bad.ok and bad.broken and bad.error.type == "internal.OverflowError"
    assert bad.skill == "memory" and bad.round == 1 and bad.policy == "pol_3"
    assert bad.regret == 0.0 and bad.win == 0.0 and bad.designer_reward == -0.75
    assert bad.parents == ["env_bad", "des_bad"] and bad.design_id == "des_bad"
    assert bad.variant == "solve_rate"
    assert diag.internal == 1 and diag.invalid == 1 and diag.envs == 1


def test_an_unscorable_env_without_its_record_or_lineage(monkeypatch):
    monkeypatch.setattr(stage.rewards, "regret", lambda h, n: 1 / 0)
    regrets, diag = score(plays("env_x", [1], hint=True) + plays("env_x", [0]))
    (x,) = regrets
    assert not x.ok and x.skill == "" and x.policy is None and x.design_id is None
    assert x.parents == ["env_x"]
    assert diag == stage.Diagnostics(invalid=1, internal=1)


def test_diagnostics_when_no_env_is_valid_still_count_leaks_and_breaks():
    leaky = env("a", hint="the answer is 4", meta={"hint": {"leak": {"leaks": ["4"]}}})
    records = [leaky, env("b")] + plays("env_a", [0], outcome="oom") \
        + plays("env_b", [0], outcome="oom")
    _, diag = score(records)
    assert diag.envs == 0 and diag.invalid == 2 and diag.hint_leaks == 1 and diag.internal == 0


def test_diagnostics_over_valid_envs():
    # wins exactly on the learnable band's edges (0.2 and 0.8) count as learnable
    records = [env("a"), env("b"), env("c"), env("d")] \
        + plays("env_a", [1, 0, 0, 0, 0]) + plays("env_b", [1, 1, 1, 1, 0]) \
        + plays("env_c", [1, 1], hint=True) + plays("env_c", [1, 1]) \
        + plays("env_d", [1, 1], round=0) + plays("env_d", [1, 0], hint=True, round=1) \
        + plays("env_d", [0.5, 0.25], round=1)
    regrets, diag = score(records, round=1, learnable_band=(0.2, 0.8))
    wins = {r.env_id: r.win for r in regrets}
    assert wins == pytest.approx({"env_a": 0.2, "env_b": 0.8, "env_c": 1.0, "env_d": 0.6875})
    assert diag.envs == 4 and diag.learnable_share == 0.75
    assert diag.mean_win == pytest.approx((0.2 + 0.8 + 1.0 + 0.6875) / 4)
    # this round's no-hint groups only: env_d's round-1 plays differ -> no zero-variance group
    assert diag.zero_variance_share == 0.0
    regrets_sorted = sorted(r.regret for r in regrets)
    assert diag.regret_mean == pytest.approx(sum(regrets_sorted) / 4)
    assert diag.regret_quartiles == (regrets_sorted[0], regrets_sorted[1], regrets_sorted[2])
    assert diag.as_dict()["envs"] == 4 and diag.as_dict()["regret_quartiles"] == diag.regret_quartiles


def test_zero_variance_share_counts_flat_groups_of_this_round():
    records = [env("a"), env("b"), env("c")] + plays("env_a", [1, 1], round=1) \
        + plays("env_b", [1, 0], round=1) + plays("env_c", [0, 1], round=0) \
        + plays("env_c", [0, 0], hint=True, round=1)
    _, diag = score(records, round=1)
    assert diag.zero_variance_share == 0.5  # env_c has no no-hint group this round


def test_no_no_hint_group_this_round_means_no_zero_variance_share():
    _, diag = score([env("a")] + plays("env_a", [1, 1], round=0), round=1)
    assert diag.envs == 1 and diag.zero_variance_share == 0.0
