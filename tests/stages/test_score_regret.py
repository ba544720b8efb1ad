"""score-regret: matched timing, window, penalties, diagnostics, lineage."""

import math

import pytest

from stages import score_regret as stage
from stages.records import Env, Regret, Rollout, Turn, Validation
from stages.rewards import RewardConfig


def env(name, skill="spatial"):
    return Env(id=f"env_{name}", domain="game", skill=skill, class_name="XEnv", source=name,
               source_hash=name, max_turns=5, parents=[f"des_{name}"])


def plays(env_id, rewards, hint=False, round=0, outcome="ok"):
    return [Rollout(env_id=env_id, hint=hint, round=round, reward=r, seed=i, outcome=outcome,
                    ok=outcome == "ok") for i, r in enumerate(rewards)]


def score(records, **cfg):
    return stage.run(records, stage.Config(**cfg))


def test_regret_uses_no_hint_plays_of_the_hinted_round():
    records = [env("a")] + plays("env_a", [1, 1, 1, 0], hint=True, round=0) \
        + plays("env_a", [1, 0, 0, 0], round=0) + plays("env_a", [1, 1, 1, 1], round=1)
    (regret,), diag = score(records, round=1)
    assert regret.hint_reward == 0.75 and regret.no_hint_reward == 0.25
    assert regret.regret == pytest.approx(0.5) and regret.regret_n == 1.0
    assert regret.win == pytest.approx(5 / 8)  # all no-hint plays of the window
    assert regret.plateau == pytest.approx((0.85 - 0.625) / 0.25)
    assert regret.designer_reward == pytest.approx(0.4 + 0.6 * (0.85 - 0.625) / 0.25)
    assert regret.design_id == "des_a" and regret.parents == ["env_a", "des_a"]


def test_window_excludes_old_rounds():
    records = [env("a")] + plays("env_a", [0, 0], round=0) + plays("env_a", [1, 1], round=5)
    (regret,), _ = score(records, round=5, window=4)
    assert regret.win == 1.0 and regret.n_no_hint == 2


def test_rejected_designs_are_discarded_by_default():
    """The paper: rejects earn nothing. A reject must not be trained, nor drag its skill's
    mean (and so every valid env's advantage of that skill) down."""
    valid = [env("a"), env("b")] + plays("env_a", [1, 0]) + plays("env_b", [1, 1])
    reject = [Validation(check="oracle", skill="spatial", parents=["des_c"])]
    alone, _ = score(valid)
    with_reject, diag = score(valid + reject)
    assert [r.env_id for r in with_reject] == ["env_a", "env_b"]
    assert [r.designer_advantage for r in with_reject] == [r.designer_advantage for r in alone]
    assert diag.invalid == 0


def test_rejected_designs_and_broken_envs_get_the_penalty():
    records = [env("a"), env("b")] + plays("env_a", [1, 0]) \
        + plays("env_b", [0, 0, 0], outcome="timeout") \
        + [Validation(check="oracle", skill="spatial", parents=["des_c"])]
    regrets, diag = score(records, rewards=RewardConfig(invalid_penalty=-0.5,
                                                        reject_penalty=-0.5))
    by_env = {r.env_id or r.design_id: r for r in regrets}
    assert by_env["env_b"].broken and by_env["env_b"].designer_reward == -0.5
    assert by_env["des_c"].rejected_by == "oracle" and by_env["des_c"].designer_reward == -0.5
    assert diag.invalid == 2 and diag.envs == 1


@pytest.mark.parametrize("stalled", ["env_budget", "timeout"])
def test_an_env_that_held_the_stage_hostage_pays_its_designer_nothing(stalled):
    records = [env("a"), env("b")] + plays("env_a", [0], hint=True, outcome=stalled) \
        + plays("env_a", [0, 0, 0], hint=True, outcome="blacklisted") \
        + plays("env_a", [0, 0, 0, 0], outcome="blacklisted") \
        + plays("env_b", [1, 1], hint=True) + plays("env_b", [0, 1])
    regrets, diag = score(records, rewards=RewardConfig(invalid_penalty=-0.5))
    by_env = {r.env_id: r for r in regrets}
    assert by_env["env_a"].broken and by_env["env_a"].designer_reward == -0.5
    assert not by_env["env_b"].broken and diag.invalid == 1


def test_an_env_whose_hint_leaks_earns_its_designer_nothing():
    leaky = env("a").model_copy(update={"meta": {"hint": {"leak": {"leaks": True}}}})
    records = [leaky, env("b")] + plays("env_a", [1, 1], hint=True) + plays("env_a", [0, 1]) \
        + plays("env_b", [1, 1], hint=True) + plays("env_b", [0, 1])
    regrets, diag = score(records, rewards=RewardConfig(invalid_penalty=-0.5))
    by_env = {r.env_id: r for r in regrets}
    assert by_env["env_a"].hint_leaks and by_env["env_a"].designer_reward == -0.5
    assert by_env["env_a"].regret == by_env["env_b"].regret  # still measured, not paid
    assert not by_env["env_b"].hint_leaks and by_env["env_b"].designer_reward > 0
    assert diag.hint_leaks == 1 and diag.invalid == 0


def with_chance(record, chance):
    return record.model_copy(update={"meta": {"trivial": {"chance": chance}}})


def test_a_coin_flip_is_flagged_at_chance_and_chance_adjusted_pays_no_plateau():
    records = [with_chance(env("a"), 0.5), with_chance(env("b"), 0.0)] \
        + plays("env_a", [1, 0, 1, 0, 1, 0, 1, 0]) + plays("env_b", [1, 0, 1, 0, 1, 0, 1, 0])
    paper, _ = score(records, rewards=RewardConfig(variant="solve_rate"))
    adjusted, diag = score(records, rewards=RewardConfig(variant="solve_rate",
                                                         chance_adjusted=True))
    coin, puzzle = paper
    assert coin.chance == 0.5 and coin.at_chance and not puzzle.at_chance
    assert coin.designer_reward == puzzle.designer_reward == 1.0  # the paper pays both
    assert adjusted[0].plateau == adjusted[0].designer_reward == 0.0  # luck earns nothing
    assert adjusted[1].designer_reward == 1.0 and diag.at_chance == 1


def test_at_chance_is_two_standard_errors_wide():
    assert stage.at_chance(0.5 + 0.35, 0.5, 8)  # 2 * sqrt(0.25 / 8) = 0.354
    assert not stage.at_chance(0.5 + 0.36, 0.5, 8)
    assert not stage.at_chance(0.0, 0.0, 8) and not stage.at_chance(0.5, None, 8)


def test_designer_advantage_is_centred_per_skill():
    records = [env("a"), env("b"), env("c", skill="memory")] + plays("env_a", [1, 0]) \
        + plays("env_b", [1, 1]) + plays("env_c", [0, 1])
    regrets, _ = score(records)
    by_env = {r.env_id: r for r in regrets}
    scale = by_env["env_a"].meta["scale"]
    assert scale == pytest.approx(6 / 3 * 4)
    expected_a = (by_env["env_a"].designer_reward
                  - (by_env["env_a"].designer_reward + by_env["env_b"].designer_reward) / 2) * scale
    assert by_env["env_a"].designer_advantage == pytest.approx(expected_a)
    assert by_env["env_c"].designer_advantage == 0.0


def test_diagnostics():
    records = [env("a"), env("b")] + plays("env_a", [1, 0, 1, 0]) + plays("env_b", [1, 1])
    _, diag = score(records)
    assert diag.learnable_share == 0.5 and diag.mean_win == 0.75
    assert diag.zero_variance_share == 0.5


def crashed(env_id, hint=False, round=0):
    """A play whose env step raised after the agent acted: the reference scores it -1."""
    return Rollout(env_id=env_id, hint=hint, round=round, seed=99, outcome="program_error",
                   ok=False, turns=[Turn(action="\\boxed{1}", completion="\\boxed{1}")])


def test_a_step_that_raised_counts_minus_one_and_a_hang_is_left_out():
    """As the reference: the raised step's play completes with -1; a hung play, or one whose
    reset failed, never completes, so no mean sees it."""
    records = [env("a")] + plays("env_a", [1, 0.5, 0]) + [crashed("env_a")] \
        + plays("env_a", [0], outcome="timeout") + plays("env_a", [0], outcome="program_error")
    (regret,), _ = score(records)
    assert regret.win == pytest.approx((1 + 0.5 + 0 - 1) / 4)
    assert regret.solve_rate == pytest.approx(2 / 4)


def test_regret_counts_a_crashed_hinted_play_minus_one():
    records = [env("a")] + plays("env_a", [1, 1, 1], hint=True) + [crashed("env_a", hint=True)] \
        + plays("env_a", [0, 0, 1, 1])
    (regret,), _ = score(records)
    assert regret.hint_reward == pytest.approx(0.5) and regret.regret == pytest.approx(0.0)


def test_a_hint_round_whose_no_hint_plays_were_all_lost_compares_with_the_next_round():
    records = [env("a")] + plays("env_a", [1, 1], hint=True) \
        + plays("env_a", [0, 0], outcome="timeout") + plays("env_a", [1, 0, 0, 0], round=1)
    (regret,), _ = score(records, round=1)
    assert regret.no_hint_reward == 0.25 and regret.regret == 0.75


def test_an_env_whose_hint_could_not_be_written_has_regret_minus_its_no_hint_mean():
    """The reference's r_hint defaults to 0 when no hinted play exists."""
    records = [env("a")] + plays("env_a", [-0.5, -0.5, 0, 0])
    (regret,), _ = score(records)
    assert regret.hint_reward is None and regret.regret == pytest.approx(0.25)


def test_the_regret_variant_pays_minus_half_for_an_env_whose_step_timed_out():
    records = [env("a"), env("b")] + plays("env_a", [1, 1], hint=True) + plays("env_a", [0, 0]) \
        + plays("env_a", [0], outcome="timeout") + plays("env_b", [1, 1], hint=True) \
        + plays("env_b", [0, 1])
    regrets, _ = score(records, rewards=RewardConfig(variant="regret", regret_scale=1.0))
    by_env = {r.env_id: r for r in regrets}
    assert by_env["env_a"].designer_reward == -0.5  # ref STEP_TIMEOUT_PENALTY
    assert by_env["env_b"].designer_reward == 0.5  # max(0, regret), not capped


def test_designer_scale_counts_this_rounds_no_hint_plays():
    """Paper settings: 192 no-hint plays / 24 envs * k 4 = 32, not the cap of 50."""
    records = []
    for i in range(24):
        records += [env(str(i))] + plays(f"env_{i}", [1] * 8, hint=True, round=4) \
            + plays(f"env_{i}", [0, 1] * 4, round=4) + plays(f"env_{i}", [1, 0] * 4, round=7)
    regrets, _ = score(records, round=7)
    assert {r.meta["scale"] for r in regrets} == {32.0}


def test_learning_potential_updates_the_skill_ema_once_per_env_set_with_its_whole_window():
    """k = 2: set 0's last round (1) updates the tracker once, its plays pooled; rounds that
    close no set do not; then the current window. Expected values from the reference's
    LearningPotential(0.98, 0.85) fed the same pooled means: baseline 0.36875."""
    history = [Regret(env_id="env_x", skill="spatial", round=1, win=0.5, n_no_hint=4),
               Regret(env_id="env_y", skill="spatial", round=1, win=0.25, n_no_hint=8),
               Regret(env_id="env_x", skill="spatial", round=0, win=0.9, n_no_hint=2),
               Regret(env_id="env_a", skill="spatial", round=2, win=0.9, n_no_hint=4)]
    records = [env("a"), env("b")] + history \
        + plays("env_a", [1, 1, 0, 0], round=2) + plays("env_a", [1, 1, 1, 0], round=3) \
        + plays("env_b", [0, 0, 0, 0], round=2) + plays("env_b", [1, 0, 0, 0], round=3)
    regrets, _ = score(records, round=3, window=2,
                       rewards=RewardConfig(variant="learning_potential"))
    assert [r.designer_reward for r in regrets] == [pytest.approx(0.25625),
                                                     pytest.approx(0.24375)]


def test_variance_term_adds_the_reference_solver_variance_reward():
    """Regret variant plus exp(-(var - 0.25)^2 / 0.02) of the window's rewards (tool use 4B)."""
    records = [env("a"), env("b")] + plays("env_a", [1, 0], hint=True) \
        + plays("env_a", [1, 0, 1, 0]) + plays("env_b", [1, 1], hint=True) + plays("env_b", [1, 1])
    rewards = RewardConfig(variant="regret", variance_term=True)
    by_env = {r.env_id: r for r in score(records, rewards=rewards)[0]}
    assert by_env["env_a"].designer_reward == pytest.approx(0.0 + 1.0)  # no regret, var 0.25
    assert by_env["env_b"].designer_reward == pytest.approx(math.exp(-0.25 ** 2 / 0.02))
    plain = {r.env_id: r for r in score(records, rewards=RewardConfig(variant="regret"))[0]}
    assert plain["env_a"].designer_reward == 0.0


def test_solve_rate_is_the_references_memory_win_rate_and_win_the_mean_reward():
    """The audit's case: the reference's memory stores sum(r > 0) / len = 0.5 for these plays;
    the plateau's win is their mean, -0.046."""
    rewards = [0.277, -0.091, 0.507, -0.719, 0.499, -0.431, 0.526, -0.934]
    (regret,), _ = score([env("a")] + plays("env_a", rewards))
    assert regret.solve_rate == 0.5 and regret.win == pytest.approx(-0.04575)


# -- repair turns ----------------------------------------------------------------------------

def repaired(name, turn=2):
    """An env a repair made: design des_<name>_t<turn>, in the conversation of des_<name>."""
    made = env(name)
    return made.model_copy(update={"parents": [f"des_{name}_t{turn}"], "meta": {
        "design": {"turn": turn, "first_turn": f"des_{name}"}}})


def test_a_repaired_env_pays_its_turn_one_design_zero_and_is_still_scored():
    """The reference's rule (turn1_valid): the turn-1 design trains, and earns the env's
    reward only when it was valid itself."""
    records = [env("a"), repaired("b")] + plays("env_a", [1, 0], hint=True) \
        + plays("env_a", [1, 0]) + plays("env_b", [1, 1], hint=True) + plays("env_b", [1, 0])
    by_env = {r.env_id: r for r in score(records)[0]}
    fair = by_env["env_a"].designer_reward
    assert fair > 0 and by_env["env_a"].design_id == "des_a"
    b = by_env["env_b"]
    assert (b.design_id, b.designer_reward, b.designer_sample) == ("des_b", 0.0, "first_turn")
    assert b.regret == pytest.approx(0.5) and b.win == 0.5  # its plays still measured
    trained = {r.env_id: r for r in score(records, train_repairs=True)[0]}["env_b"]
    assert (trained.design_id, trained.designer_sample) == ("des_b_t2", "conversation")
    assert trained.designer_reward == pytest.approx(fair + 0.4)  # regret 0.5 vs 0: +0.4


def test_a_reject_penalty_counts_each_conversation_once_and_none_that_ended_valid():
    turn = lambda name, t, first: Validation(  # noqa: E731
        check="oracle", skill="spatial", parents=[f"des_{name}"],
        meta={} if t == 1 else {"design": {"turn": t, "first_turn": f"des_{first}"}})
    records = [repaired("b")] + plays("env_b", [1, 0]) + [
        turn("b", 1, "b"),                                  # b: rejected, then repaired
        turn("c", 1, "c"), turn("c_t2", 2, "c"), turn("c_t3", 3, "c"),  # c: never valid
        turn("d", 1, "d")]                                  # d: a plain reject
    penalty = RewardConfig(reject_penalty=-0.5)
    rejected = [r for r in score(records, rewards=penalty)[0] if r.rejected_by]
    assert sorted(r.design_id for r in rejected) == ["des_c", "des_d"]
    whole = [r for r in score(records, rewards=penalty, train_repairs=True)[0] if r.rejected_by]
    assert sorted((r.design_id, r.designer_sample) for r in whole) == [
        ("des_c_t3", "conversation"), ("des_d", "first_turn")]


def test_a_shortcut_or_a_leak_judged_on_real_plays_pays_the_invalid_penalty():
    from stages.records import Judgement

    records = [env("a"), env("b"), env("c")] + [
        p for name in "abc" for p in plays(f"env_{name}", [1, 0], hint=True) + plays(
            f"env_{name}", [1, 0])]
    judged = [Judgement(env_id="env_a", verdict="shortcut"),
              Judgement(env_id="env_b", hint=True, verdict="leak"),
              Judgement(env_id="env_c", verdict="fair")]
    by_env = {r.env_id: r for r in score(records + judged,
                                         rewards=RewardConfig(invalid_penalty=-0.5))[0]}
    assert by_env["env_a"].shortcut and by_env["env_a"].designer_reward == -0.5
    assert by_env["env_b"].hint_leaks and by_env["env_b"].designer_reward == -0.5
    assert not by_env["env_c"].shortcut and by_env["env_c"].designer_reward > 0
    later = Judgement(env_id="env_c", verdict="shortcut", round=1)  # judged after this round
    assert not {r.env_id: r for r in score(records + [later])[0]}["env_c"].shortcut
