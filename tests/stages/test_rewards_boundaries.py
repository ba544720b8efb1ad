"""Reward formulas at their boundaries: the smallest groups, the variance term in every
variant, the chance adjustment reaching the designer's reward, and partial plateau levels."""

import math

import pytest

from stages import rewards
from stages.rewards import RewardConfig

CFG = RewardConfig()
COIN = [0.0, 1.0, 0.0, 1.0]  # population variance 0.25: the variance term is exactly 1


def test_two_plays_that_differ_get_opposite_unit_advantages():
    # the smallest group that carries a signal: one win, one loss
    assert rewards.agent_advantages([1.0, 0.0], CFG) == pytest.approx([1.0, -1.0])
    assert rewards.agent_advantages([0.0, 0.5, 1.0], CFG) == pytest.approx(
        [-math.sqrt(1.5), 0.0, math.sqrt(1.5)])
    assert rewards.agent_advantages([1.0], CFG) == [0.0]


def test_a_tiny_reward_difference_keeps_its_sign_and_stays_finite():
    # sigma far below adv_eps: the better play must still get the positive advantage
    low, high = rewards.agent_advantages([0.0, 1e-9], CFG)
    assert low < 0 < high and math.isfinite(low) and math.isfinite(high)
    assert abs(high) < 1.0  # eps keeps it bounded: (5e-10) / (5e-10 + 1e-8)


@pytest.mark.parametrize("variant,base", [("blend", 0.8), ("solve_rate", 1.0), ("regret", 0.5),
                                          ("learning_potential", 0.0)])
def test_the_variance_term_is_added_in_every_variant(variant, base):
    on = RewardConfig(variant=variant, variance_term=True)
    off = RewardConfig(variant=variant)
    assert rewards.designer_raw(0.5, 0.075, off, plays=COIN) == pytest.approx(base)
    assert rewards.designer_raw(0.5, 0.075, on, plays=COIN) == pytest.approx(base + 1.0)
    assert rewards.designer_raw(0.5, 0.075, on, plays=[1.0]) == pytest.approx(base)  # one play


def test_blend_weights_a_partial_plateau_level():
    # win 0.275: plateau 0.5; regret 0 -> blend = 0.6 * 0.5
    assert rewards.designer_raw(0.275, 0.0, CFG) == pytest.approx(0.3)
    assert rewards.designer_raw(0.725, 0.15, CFG) == pytest.approx(0.4 + 0.3)


def test_chance_adjustment_reaches_the_designer_reward():
    adjusted = RewardConfig(chance_adjusted=True)
    # a coin flip won at chance earns what a no-win earns, in the raw reward too
    assert rewards.designer_raw(0.5, 0.0, adjusted, chance=0.5) == pytest.approx(0.0)
    assert rewards.designer_raw(0.75, 0.0, adjusted, chance=0.5) == pytest.approx(0.6)
    assert rewards.designer_raw(0.5, 0.0, adjusted, chance=None) == pytest.approx(0.6)
    assert rewards.designer_raw(0.5, 0.0, CFG, chance=0.5) == pytest.approx(0.6)  # off: ignored
    assert rewards.designer_raw(0.5, 0.0, RewardConfig(variant="solve_rate", chance_adjusted=True),
                                chance=0.5) == 0.0


def test_an_unknown_variant_names_the_known_ones():
    with pytest.raises(ValueError, match="blend, solve_rate, regret, learning_potential"):
        rewards.designer_raw(0.5, 0.0, RewardConfig(variant="nope"))


def test_designer_scale_with_a_single_agent_play():
    assert rewards.designer_scale(1, 4, 8, CFG) == pytest.approx(2.0)
    assert rewards.designer_scale(0, 4, 8, CFG) == 1.0
    assert rewards.designer_scale(8, 0, 8, CFG) == 1.0


def test_ema_mixes_the_previous_mean_and_the_new_value():
    assert rewards.ema(0.2, 0.6, 0.25) == pytest.approx(0.75 * 0.2 + 0.25 * 0.6)
    assert rewards.ema(0.5, 2.0, 0.5) == pytest.approx(1.25)
    assert rewards.ema(None, 0.3, 0.85) == 0.3
