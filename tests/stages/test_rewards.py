"""Reward formulas against hand-computed values, edge cases included."""

import math

import pytest

from stages import rewards
from stages.rewards import RewardConfig

CFG = RewardConfig()


@pytest.mark.parametrize("win,expected", [(0.0, 0.0), (0.15, 0.0), (0.275, 0.5), (0.4, 1.0),
                                          (0.5, 1.0), (0.6, 1.0), (0.725, 0.5), (0.85, 0.0),
                                          (1.0, 0.0)])
def test_plateau_band_and_ramps(win, expected):
    assert rewards.plateau(win, CFG) == pytest.approx(expected)


def test_regret_and_its_normalisation():
    assert rewards.regret([1, 1, 0, 0], [0, 0, 0, 1]) == pytest.approx(0.25)
    assert rewards.regret_n(0.075, CFG) == pytest.approx(0.5)
    assert rewards.regret_n(0.3, CFG) == 1.0 and rewards.regret_n(-0.2, CFG) == 0.0
    assert rewards.regret([], [0.5]) == -0.5 and rewards.regret([1.0], []) == 1.0  # ref: 0 default


def test_blend_and_ablation_variants():
    # win 0.5 -> plateau 1; regret 0.075 -> regret_n 0.5; blend = 0.4*0.5 + 0.6*1 = 0.8
    assert rewards.designer_raw(0.5, 0.075, CFG) == pytest.approx(0.8)
    assert rewards.designer_raw(0.5, 0.075, RewardConfig(variant="solve_rate")) == 1.0
    assert rewards.designer_raw(0.5, 0.075, RewardConfig(variant="regret")) == 0.5
    lp = RewardConfig(variant="learning_potential")
    assert rewards.designer_raw(0.7, 0.0, lp, skill_ema=0.4) == pytest.approx(0.3)
    assert rewards.designer_raw(0.7, 0.0, lp, skill_ema=None) == 0.0
    with pytest.raises(ValueError, match="unknown reward variant"):
        rewards.designer_raw(0.5, 0.0, RewardConfig(variant="nope"))


def test_designer_advantage_centres_per_skill_without_std():
    advantages = rewards.designer_advantages([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], 2.0, CFG)
    assert advantages == [1.0, -1.0, 0.0, 0.0]


def test_designer_scale_is_capped():
    assert rewards.designer_scale(192, 24, 4, CFG) == 32.0
    assert rewards.designer_scale(10_000, 1, 4, CFG) == 50.0
    assert rewards.designer_scale(5, 0, 4, CFG) == 1.0  # ref compute_env_reward_scale
    assert rewards.designer_scale(0, 24, 4, CFG) == 1.0


def test_agent_advantage_zscore_and_degenerate_groups():
    advantages = rewards.agent_advantages([1.0, 0.0, 0.0, 1.0], CFG)
    assert advantages == pytest.approx([1.0, -1.0, -1.0, 1.0])
    assert rewards.agent_advantages([0.7, 0.7, 0.7], CFG) == [0.0, 0.0, 0.0]
    assert rewards.agent_advantages([0.3], CFG) == [0.0]
    assert all(math.isfinite(a) for a in rewards.agent_advantages([1e-12, 0.0], CFG))


def test_ema():
    assert rewards.ema(None, 0.5, 0.85) == 0.5
    assert rewards.ema(0.5, 1.0, 0.85) == pytest.approx(0.925)  # gamma weights the new value


def test_variance_term_peaks_at_a_fair_coin():
    assert rewards.variance_term([0.0, 1.0]) == pytest.approx(1.0)
    assert rewards.variance_term([1.0, 1.0, 1.0]) == pytest.approx(math.exp(-0.0625 / 0.02))
    with_term = RewardConfig(variant="solve_rate", variance_term=True)
    assert rewards.designer_raw(0.5, 0.0, with_term, plays=[0.0, 1.0]) == pytest.approx(2.0)
    assert rewards.designer_raw(0.5, 0.0, with_term, plays=[1.0]) == pytest.approx(1.0)


def test_the_win_above_chance_is_zero_at_chance_and_one_at_a_sure_win():
    assert rewards.above_chance(0.5, 0.5) == 0.0 and rewards.above_chance(1.0, 0.5) == 1.0
    assert rewards.above_chance(0.25, 0.5) == -0.5 and rewards.above_chance(1.0, 1.0) == 0.0
    paper, ablation = RewardConfig(), RewardConfig(chance_adjusted=True)
    assert rewards.plateau_win(0.5, 0.5, paper) == 0.5
    assert rewards.plateau_win(0.75, 0.5, ablation) == 0.5
    assert rewards.plateau_win(0.75, None, ablation) == 0.75  # no chance level: the win
