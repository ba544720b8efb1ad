"""stages.report.tables: the numbers per round, checked against hand-computed values."""

import orjson
import pytest

from stages.report import tables
from stages.report.data import load_run


def test_numbers_match_hand_computed_values(fixture, built):
    expected, numbers = fixture.EXPECTED, built.numbers
    assert numbers["no_hint_reward"] == pytest.approx(expected["no_hint_reward"])
    assert numbers["learnable_share"] == pytest.approx(expected["learnable_share"])
    assert numbers["win_source"] == expected["win_source"]
    assert numbers["skills"] == expected["skills"]
    assert numbers["pool_skills"] == expected["pool_skills"]
    assert numbers["regret"][1]["regret"].mean == pytest.approx(expected["regret_mean"][1])
    assert numbers["eval"].keys() == expected["eval_series"].keys()
    for series, points in expected["eval_series"].items():
        assert [r for r, _ in numbers["eval"][series]] == [r for r, _ in points]
        assert [v for _, v in numbers["eval"][series]] == pytest.approx([v for _, v in points])
    assert numbers["train_steps"] == expected["train_steps"]


def test_acceptance_counts_designs_not_the_start_pool(fixture, built):
    expected, numbers = fixture.EXPECTED, built.numbers
    assert numbers["acceptance"] == pytest.approx(expected["acceptance"])
    for number, attempts in expected["acceptance_attempts"].items():
        assert numbers["acceptance_attempts"][number] == pytest.approx(attempts)
    assert numbers["acceptance_overall"] == pytest.approx(expected["acceptance_overall"])
    assert numbers["reject_reasons"] == expected["reject_reasons"]  # audit rejects included


def test_a_run_whose_designs_were_all_rejected_accepts_none(fixture, built_flat):
    # the quickstart's tiny model: 8 designs rejected, 3 start-pool envs played
    assert built_flat.numbers["acceptance"] == fixture.EXPECTED_FLAT["acceptance"]
    assert built_flat.numbers["acceptance_overall"] == 0.0
    assert built_flat.numbers["skills"] == {}
    assert built_flat.numbers["pool_skills"] == {"spatial": 1, "arithmetic": 1, "memory": 1}


def test_designer_reward_leaves_the_start_pool_out(fixture, built):
    designer = built.numbers["regret"][1]["designer_reward"]
    assert designer.n == 7 and designer.mean == pytest.approx(
        fixture.EXPECTED["designer_reward_mean"][1])


def test_no_hint_reward_is_the_mean_over_plays_with_the_pool_counted_apart(run_dir):
    rewards = tables.no_hint_rewards(load_run(run_dir))
    assert (rewards[1].envs, rewards[1].pool, rewards[1].plays) == (6, 2, 18)
    assert rewards[2].won == pytest.approx(7 / 16)  # one reward is -0.1: not a win


def test_train_lines_split_by_role_only_when_steps_collide(run_dir):
    run = load_run(run_dir)
    assert set(tables.train_series(run)["loss"]) == {"all"}
    assert tables.role_steps(run) == {"agent": (4, 1, 4), "agent+designer": (2, 5, 6)}


def test_training_without_signal_is_recognised_and_said(flat_dir):
    run = load_run(flat_dir)
    signal = tables.training_signal(run, tables.train_series(run))
    assert signal.learned is False
    assert signal.notes == [
        "agent: every advantage was 0 in all 6 steps (all plays of every env got the same "
        "reward)",
        "designer: every advantage was 0 in all 2 steps (all designs got the same designer "
        "reward)"]
    # loss exactly 0, approx_kl ~1e-11, entropy moving in its 5th digit: all flat
    assert {"loss", "approx_kl", "entropy", "grad_norm", "tis_weight"} <= set(signal.flat)


def test_training_with_signal_names_a_role_without_samples(run_dir, tmp_path):
    run = load_run(run_dir)
    signal = tables.training_signal(run, tables.train_series(run))
    assert signal.learned is True and signal.notes == []
    assert set(signal.flat) == {"tis_weight", "lr", "agent_adv_mean", "designer_adv_mean",
                                "designer_adv_std"}  # the fixture's lr is constant: said, not drawn
    run.train = {k: v for k, v in run.train.items() if v.role == "agent"}
    assert tables.training_signal(run, tables.train_series(run)).notes == [
        "no designer samples in any step"]


@pytest.mark.parametrize("values,is_flat", [
    ([0.0, 0.0, 0.0], True), ([0.0, 1.6e-11, 0.0, 2e-11], True),
    ([7.5855, 7.5859, 7.5852], True), ([1.0, 1.0000003], True), ([0.5], True),
    ([0.5, 0.25], False), ([0.0, 1e-6], False), ([2.0, 1.9], False),
    ([1.7e308, -1.7e308], False)])
def test_flat_means_round_off_or_sampling_noise(values, is_flat):
    assert tables.flat(values) is is_flat


def test_mean_of_numbers_whose_sum_overflows():
    assert tables.mean([1.7e308, 1.7e308]) == pytest.approx(1.7e308)


def test_slots_filled_by_designer_turn_count_each_slot_at_its_first_accepted_turn(tmp_path):
    """Two slots; slot 0's repair is accepted at turn 2, slot 1 stays rejected: 0 of 2 filled
    at turn 1, 1 of 2 after one repair. A round without repairs has no such row."""
    from stages.records import Design, Env, Validation

    def shard(folder, records):
        (tmp_path / "r00" / folder).mkdir(parents=True)
        (tmp_path / "r00" / folder / f"{records[0].kind}-0.jsonl").write_bytes(
            b"".join(orjson.dumps(r.to_dict()) + b"\n" for r in records))

    first = [Design(slot=s, skill="spatial", completion=f"c{s}") for s in (0, 1)]
    repairs = [Design(slot=s, attempt=1, skill="spatial", completion=f"r{s}", turn=2,
                      repairs=d.id, first_turn=d.id) for s, d in enumerate(first)]
    shard("design-a0", first)
    shard("design-a1", repairs)
    shard("validate-a0", [Validation(check="oracle", slot=d.slot, parents=[d.id]) for d in first])
    shard("validate-a1", [Env(domain="game", class_name="AEnv", source="x", source_hash="x",
                              max_turns=3, parents=[repairs[0].id])])
    assert tables.turn_yield(load_run(tmp_path)) == {0: [(0, 2), (1, 2)]}


def test_a_run_without_repairs_has_no_turn_yield(built):
    assert built.numbers["slot_yield_by_turn"] == {}
