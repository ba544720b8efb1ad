"""stages/train/samples.py, without a model: which records become which samples with what
advantage: one sequence per play or a sample per turn, hinted and broken plays, groups per env
and round, masks, designer samples from regret and design records, skips counted, and
non-finite inputs refused."""

import math
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from stages.records import Design, Regret, Rollout, Turn  # noqa: E402
from stages.train.config import Config  # noqa: E402
from stages.train.samples import (Sample, build_samples, crashed_step,  # noqa: E402
                                  malformed_tool_call, play_samples, trained_reward,
                                  turns_extend)
from tests.stages.train.common import (crashed, env_fault_group, multi_turn_play,  # noqa: E402
                                       per_turn)

CFG = Config()


def test_a_sample_of_one_turn():
    s = Sample.of_turn("designer", [1, 2, 3], [4, 5], [-0.1, -0.2, -9.0], 0.5, 0.7, "des_x",
                       per_turn=True)
    assert s.ids == [1, 2, 3, 4, 5] and s.loss_positions == [3, 4]
    assert s.sampled_logprobs == [-0.1, -0.2] and s.advantage == 0.5 and s.temperature == 0.7
    assert s.source == "des_x" and s.per_turn and s.role == "designer"
    default = Sample.of_turn("agent", [1], [2], [0.0], 1.0)
    assert default.temperature == 1.0 and default.source == "" and not default.per_turn


def play(env_id="env_a", reward=1.0, hint=False, round=0, seed=0, ok=True, outcome="ok",
         turns=None, **kw):
    turns = [Turn(action="a", prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2])] \
        if turns is None else turns
    return Rollout(env_id=env_id, reward=reward, hint=hint, round=round, seed=seed, ok=ok,
                   outcome=outcome, turns=turns, **kw)


def test_a_no_hint_group_per_env_and_round_gets_its_own_advantages():
    plays = [play("env_a", 1.0, seed=0), play("env_a", 0.0, seed=1),
             play("env_a", 1.0, round=1, seed=2), play("env_a", 1.0, round=1, seed=3),
             play("env_b", 0.0, seed=4), play("env_b", 0.0, seed=5)]
    samples, skipped = build_samples(plays, CFG)
    assert skipped == {}
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    assert [s.source for s in samples] == [p.id for p in plays]


def test_hinted_plays_train_only_when_asked_and_apart_from_no_hint_plays():
    plays = [play(reward=1.0, seed=0), play(reward=0.0, seed=1),
             play(reward=1.0, hint=True, seed=2), play(reward=1.0, hint=True, seed=3)]
    samples, _ = build_samples(plays, CFG)
    assert [s.source for s in samples] == [plays[0].id, plays[1].id]
    both, _ = build_samples(plays, Config(train_on_hinted=True))
    assert [s.advantage for s in both] == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_roles_choose_what_trains():
    design = Design(completion="x", prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.5, -0.5])
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=1.5)
    records = [play(seed=0), play(reward=0.0, seed=1), design, regret]
    agent, _ = build_samples(records, Config(roles=("agent",)))
    designer, _ = build_samples(records, Config(roles=("designer",)))
    assert {s.role for s in agent} == {"agent"} and len(agent) == 2
    assert [(s.role, s.advantage, s.ids, s.loss_positions, s.temperature, s.source)
            for s in designer] == [("designer", 1.5, [1, 2, 3], [1, 2], 1.0, design.id)]


def test_designs_without_token_ids_are_skipped_and_counted():
    for fields in ({"prompt_ids": None, "completion_ids": [2], "logprobs": [0.0]},
                   {"prompt_ids": [1], "completion_ids": [], "logprobs": [0.0]},
                   {"prompt_ids": [1], "completion_ids": [2], "logprobs": []}):
        design = Design(completion="x", **fields)
        regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=1.0)
        samples, skipped = build_samples([design, regret], CFG)
        assert samples == [] and skipped == {"designer_no_token_ids": 1}
    design = Design(completion="x", prompt_ids=[], completion_ids=[2], logprobs=[0.0])
    samples, _ = build_samples(
        [design, Regret(env_id="e", design_id=design.id, designer_advantage=1.0)], CFG)
    assert len(samples) == 1  # an empty prompt is still a prompt
    samples, skipped = build_samples([Regret(env_id="e", designer_advantage=1.0)], CFG)
    assert skipped == {"designer_without_design_record": 1}


def test_broken_plays_are_not_trained_as_ordinary_samples():
    crash_turn = Turn(action="a", prompt_ids=[1], completion_ids=[2], logprobs=[0.0])
    crashed = play(reward=0.7, ok=False, outcome="program_error", seed=2, turns=[crash_turn])
    assert crashed_step(crashed) and trained_reward(crashed, CFG) == -1.0
    no_tokens = play(ok=False, outcome="program_error", seed=3,
                     turns=[Turn(action="a", prompt_ids=[1], completion_ids=[], logprobs=[])])
    assert not crashed_step(no_tokens) and trained_reward(no_tokens, CFG) is None
    ok_named_error = play(reward=0.5, ok=True, outcome="program_error", seed=4)
    assert not crashed_step(ok_named_error)
    assert trained_reward(ok_named_error, CFG) == 0.5
    hung = play(ok=False, outcome="timeout", seed=5)
    assert not crashed_step(hung) and trained_reward(hung, CFG) is None
    assert trained_reward(crashed, Config(drop_env_errors=True)) is None
    samples, skipped = build_samples([play(reward=1.0), crashed, hung], CFG)
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0])
    assert skipped == {"agent_timeout_dropped": 1}


def test_a_play_whose_template_rewrites_history_trains_turn_by_turn():
    first = Turn(action="a", prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.3])
    second = Turn(action="b", prompt_ids=[1, 2, 9, 5], completion_ids=[6, 7],
                  logprobs=[-0.6, -0.7, -5.0])
    assert not turns_extend([first, second])
    assert turns_extend([first, second.model_copy(update={"prompt_ids": [1, 2, 3, 5]})])
    samples = play_samples(play(turns=[first, second]), 0.5, CFG, {})
    assert [(s.ids, s.loss_positions, s.sampled_logprobs, s.per_turn) for s in samples] == [
        ([1, 2, 3], [2], [-0.3], True), ([1, 2, 9, 5, 6, 7], [4, 5], [-0.6, -0.7], True)]
    (single,) = play_samples(play(turns=[first]), 0.5, CFG, {})
    assert not single.per_turn


def test_one_sequence_play_keeps_loss_only_on_turns_that_carry_it():
    first = Turn(action="a", completion="<tool_call>oops", prompt_ids=[1], completion_ids=[2, 3],
                 logprobs=[-0.2, -0.3, -9.0])
    second = Turn(action="b", prompt_ids=[1, 2, 3, 8], completion_ids=[4], logprobs=[-0.4])
    skipped = defaultdict(int)
    (s,) = play_samples(play(turns=[first, second]), 1.0,
                        Config(mask_malformed_tool_calls=True), skipped)
    assert s.ids == [1, 2, 3, 8, 4] and s.loss_positions == [4] and s.sampled_logprobs == [-0.4]
    assert skipped == {"agent_malformed_tool_call_masked": 1}
    (whole,) = play_samples(play(turns=[first, second]), 1.0, CFG, defaultdict(int))
    assert whole.loss_positions == [1, 2, 4] and whole.sampled_logprobs == [-0.2, -0.3, -0.4]
    assert whole.temperature == 1.0 and whole.role == "agent"
    hot = play(turns=[first, second], meta={"temperature": 0.6})
    assert play_samples(hot, 1.0, CFG, {})[0].temperature == 0.6


def test_a_play_with_a_turn_without_token_ids_trains_its_other_turns_apart():
    blank = Turn(action="a", prompt_ids=None, completion_ids=[2], logprobs=[0.0])
    good = Turn(action="b", prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1])
    skipped = defaultdict(int)
    (s,) = play_samples(play(turns=[blank, good]), 1.0, CFG, skipped)
    assert s.per_turn and s.ids == [1, 2, 3] and skipped == {"agent_no_token_ids": 1}
    assert play_samples(play(turns=[blank]), 1.0, CFG, defaultdict(int)) == []


@pytest.mark.parametrize("completion,malformed", [
    ('<tool_call>\n {"name": "f", "arguments": {}} \n</tool_call>', False),
    ('<tool_call>{"name": "f"}</tool_call>', False),  # no arguments: an empty object
    ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', True),
    ('<tool_call>["f"]</tool_call>', True),
    ('<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>', True),
    ('<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>', True),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call> '
     '<tool_call>{"name": "g", "arguments": 1}</tool_call>', True),  # the second is bad
])
def test_malformed_tool_call_edges(completion, malformed):
    assert malformed_tool_call(completion) is malformed


def test_skips_are_counted_each_and_later_records_still_train():
    no_ids = Turn(action="a", prompt_ids=None, completion_ids=[2], logprobs=[0.0])
    truncated = dict(truncated=True)
    records = [play(ok=False, outcome="timeout", seed=0), play(ok=False, outcome="timeout", seed=1),
               play(seed=2, turns=[no_ids]), play(seed=3, turns=[no_ids]),
               play(seed=4, **truncated), play(seed=5, **truncated),
               Regret(env_id="e", design_id="des_none", designer_advantage=1.0),
               Regret(env_id="e", design_id="des_none2", designer_advantage=1.0)]
    bare = [Design(completion=f"x{i}", prompt_ids=[1], completion_ids=[], logprobs=[0.0])
            for i in range(2)]
    records += bare + [Regret(env_id="e", design_id=d.id, designer_advantage=1.0) for d in bare]
    design = Design(completion="y", prompt_ids=[1], completion_ids=[2], logprobs=[-0.5])
    good = [play(reward=1.0, seed=6), play(reward=0.0, seed=7), design,
            Regret(env_id="e", design_id=design.id, designer_advantage=0.5)]
    samples, skipped = build_samples(records + good, Config(mask_truncated=True))
    assert skipped == {"agent_timeout_dropped": 2, "agent_no_token_ids": 2,
                       "agent_truncated_masked": 2, "designer_without_design_record": 2,
                       "designer_no_token_ids": 2}
    assert [s.source for s in samples] == [good[0].id, good[1].id, design.id]
    malformed = Turn(action="a", completion="<tool_call>x", prompt_ids=[1], completion_ids=[2],
                     logprobs=[0.0])
    skipped = defaultdict(int)
    play_samples(play(turns=[malformed, malformed]), 1.0,
                 Config(mask_malformed_tool_calls=True), skipped)
    assert skipped == {"agent_malformed_tool_call_masked": 2}


def test_per_turn_samples_carry_the_plays_role_advantage_temperature_and_source():
    first = Turn(action="a", prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.3])
    second = Turn(action="b", prompt_ids=[1, 2, 9, 5], completion_ids=[6], logprobs=[-0.6])
    rewritten = play(turns=[first, second], meta={"temperature": 0.6})
    samples = play_samples(rewritten, -0.75, CFG, defaultdict(int))
    assert [(s.role, s.advantage, s.temperature, s.source) for s in samples] == \
        [("agent", -0.75, 0.6, rewritten.id)] * 2


@pytest.mark.parametrize("records,field,where", [
    (lambda: [play(reward=1.0), play(reward=float("nan"), seed=1)], "reward", 1),
    (lambda: [play(turns=[Turn(action="a", prompt_ids=[1], completion_ids=[2],
                               logprobs=[float("-inf")])])], "turns.0.logprobs", 0),
])
def test_non_finite_agent_inputs_name_the_record_and_field(records, field, where):
    from stages.records import RecordError

    records = records()
    with pytest.raises(RecordError, match=rf"field '{field}'") as caught:
        build_samples(records, CFG)
    assert caught.value.where == records[where].id


@pytest.mark.parametrize("advantage,logprobs,field", [
    (float("inf"), [-0.5], "designer_advantage"), (1.0, [float("nan")], "logprobs")])
def test_non_finite_designer_inputs_name_the_record_and_field(advantage, logprobs, field):
    from stages.records import RecordError

    design = Design(completion="z", prompt_ids=[1], completion_ids=[2], logprobs=logprobs)
    regret = Regret(env_id="e", design_id=design.id, designer_advantage=advantage) \
        if math.isfinite(advantage) else Regret.model_construct(
            **{**Regret(env_id="e", design_id=design.id).model_dump(),
               "designer_advantage": advantage})
    with pytest.raises(RecordError, match=rf"field '{field}'") as caught:
        build_samples([design, regret], CFG)
    assert caught.value.where == (regret.id if field == "designer_advantage" else design.id)


def test_every_masked_turn_of_a_truncated_play_is_counted():
    turn = Turn(action="a", prompt_ids=[1], completion_ids=[2], logprobs=[0.0])
    skipped = defaultdict(int)
    assert play_samples(play(turns=[turn, turn, turn], truncated=True), 1.0,
                        Config(mask_truncated=True), skipped) == []
    assert skipped == {"agent_truncated_masked": 3}


def test_a_play_whose_turns_extend_each_other_is_one_sequence():
    play = multi_turn_play()
    (episode,) = play_samples(play, 1.0, CFG, {})
    last = play.turns[-1]
    assert episode.ids == last.prompt_ids + last.completion_ids and not episode.per_turn
    # loss on the completions only: the observations between them are context
    assert [episode.ids[p] for p in episode.loss_positions] == \
        [tok for t in play.turns for tok in t.completion_ids]
    assert episode.sampled_logprobs == [lp for t in play.turns for lp in t.logprobs]
    assert len(episode.ids) < sum(len(s.ids) for s in per_turn(play, 1.0))


def test_designer_samples_come_from_regret_and_design_records():
    design = Design(completion="```python\n...```", prompt_ids=[1, 2], completion_ids=[3, 4],
                    logprobs=[-0.5, -0.5], meta={"temperature": 0.6})
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=2.5)
    orphan = Regret(env_id="env_b", design_id="des_missing", designer_advantage=1.0)
    hinted = Rollout(env_id="env_a", hint=True, turns=[Turn(action="a", prompt_ids=[1],
                                                            completion_ids=[2], logprobs=[0.0])])
    samples, skipped = build_samples([design, regret, orphan, hinted], CFG)
    assert [(s.role, s.advantage, s.temperature) for s in samples] == [("designer", 2.5, 0.6)]
    assert skipped == {"designer_without_design_record": 1}


def repair_conversation(repair_temperature=0.6):
    """A turn-1 design and its repair whose prompt holds turn 1 token for token."""
    first = Design(completion="broken", prompt_ids=[1, 2], completion_ids=[3, 4],
                   logprobs=[-0.1, -0.2], meta={"temperature": 0.6})
    repair = Design(completion="fixed", prompt_ids=[1, 2, 3, 4, 9], completion_ids=[5, 6],
                    logprobs=[-0.3, -0.4], turn=2, repairs=first.id, first_turn=first.id,
                    meta={"temperature": repair_temperature})
    return first, repair


def test_train_repairs_trains_every_designer_turn_of_the_conversation_as_one_sample():
    first, repair = repair_conversation()
    turn_one = Regret(env_id="env_a", design_id=first.id, designer_advantage=1.0)
    (sample,), _ = build_samples([first, repair, turn_one], CFG)
    assert sample.ids == [1, 2, 3, 4] and sample.loss_positions == [2, 3]  # the default
    whole = Regret(env_id="env_a", design_id=repair.id, designer_advantage=1.0,
                   designer_sample="conversation")
    (sample,), _ = build_samples([first, repair, whole], CFG)
    assert sample.ids == [1, 2, 3, 4, 9, 5, 6] and sample.loss_positions == [2, 3, 5, 6]
    assert sample.sampled_logprobs == [-0.1, -0.2, -0.3, -0.4] and sample.source == repair.id
    hotter = repair_conversation(repair_temperature=1.0)
    regret = whole.model_copy(update={"design_id": hotter[1].id})
    samples, _ = build_samples([*hotter, regret], CFG)  # two temperatures: per turn
    assert [(s.temperature, s.per_turn, s.source) for s in samples] == [
        (0.6, True, hotter[1].id), (1.0, True, hotter[1].id)]
    _, skipped = build_samples([repair, whole], CFG)  # turn 1 not among the inputs
    assert skipped == {"designer_without_design_record": 1}


def test_the_agent_role_alone_trains_no_designer_sample_whatever_the_inputs():
    """What `spade run` gives train-grpo with a separate, frozen designer: `--roles agent`."""
    design = Design(completion="x", prompt_ids=[1, 2], completion_ids=[3, 4],
                    logprobs=[-0.5, -0.5])
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=2.5)
    samples, skipped = build_samples([design, regret],
                                     Config(roles=("agent",)))
    assert samples == [] and skipped == {}


def test_the_plays_of_an_env_judged_a_shortcut_do_not_train():
    from stages.records import Judgement

    def play(env_id, reward):
        return Rollout(env_id=env_id, reward=reward, turns=[Turn(
            action="a", prompt_ids=[1], completion_ids=[2], logprobs=[0.0])])

    records = [play("env_a", 1.0), play("env_a", 0.0), play("env_b", 1.0), play("env_b", 0.0),
               Judgement(env_id="env_a", verdict="shortcut")]
    samples, skipped = build_samples(records, CFG)
    assert len(samples) == 2 and skipped == {"agent_shortcut_env_dropped": 2}


def test_a_play_whose_env_step_raised_trains_with_reward_minus_one():
    """The reference's env wrapper scores a step that raises -1 and completes the episode: it
    trains, in its env's group, and moves the other plays' advantages."""
    from stages import rewards

    plays, broken = env_fault_group()
    samples, skipped = build_samples(plays + [broken], CFG)
    assert skipped == {}
    by_play = {s.source: s for s in samples}
    assert set(by_play) == {p.id for p in plays + [broken]}
    expected = rewards.agent_advantages([1.0, 0.0, 1.0, -1.0], CFG.rewards)
    assert [by_play[p.id].advantage for p in plays + [broken]] == pytest.approx(expected)
    # its last turn, which has no observation, closes one valid sequence with loss on every
    # completion the agent wrote
    sample, last = by_play[broken.id], broken.turns[-1]
    assert sample.ids == last.prompt_ids + last.completion_ids and not sample.per_turn
    assert [sample.ids[p] for p in sample.loss_positions] == \
        [tok for t in broken.turns for tok in t.completion_ids]
    assert sample.sampled_logprobs == [lp for t in broken.turns for lp in t.logprobs]
    # without it the ok plays' advantages differ (the old rule, --drop-env-errors)
    kept, skipped = build_samples(plays + [broken], Config(drop_env_errors=True))
    assert skipped == {"agent_program_error_dropped": 1}
    assert [s.source for s in kept] == [p.id for p in plays]
    assert [s.advantage for s in kept] == pytest.approx(
        rewards.agent_advantages([1.0, 0.0, 1.0], CFG.rewards))
    assert [s.advantage for s in kept] != pytest.approx(expected[:3])


@pytest.mark.parametrize("outcome", ["timeout", "oom", "output_limit", "env_budget",
                                     "blacklisted", "sandbox_failure", "internal_error"])
@pytest.mark.parametrize("drop", [False, True])
def test_plays_that_hung_or_hit_a_limit_are_dropped_either_way(outcome, drop):
    plays, broken = env_fault_group(outcome)
    samples, skipped = build_samples(plays + [broken],
                                     Config(drop_env_errors=drop))
    assert [s.source for s in samples] == [p.id for p in plays]
    assert skipped == {f"agent_{outcome}_dropped": 1}
    assert [s.advantage for s in samples] == pytest.approx([0.7071067, -1.4142135, 0.7071067])


def test_a_program_error_before_the_agent_acted_is_dropped():
    """A load or reset that raised leaves no turn: a FAILED play, never trained."""
    plays, _ = env_fault_group()
    no_turns = crashed(Rollout(env_id="env_m", seed=9))
    samples, skipped = build_samples(plays + [no_turns], CFG)
    assert [s.source for s in samples] == [p.id for p in plays]
    assert skipped == {"agent_program_error_dropped": 1}


def test_samples_without_token_ids_are_skipped_and_counted():
    play = Rollout(env_id="env_a", turns=[Turn(action="a", completion="x")])
    samples, skipped = build_samples([play], CFG)
    assert samples == [] and skipped == {"agent_no_token_ids": 1}


@pytest.mark.parametrize("completion,malformed", [
    ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', False),
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', False),
    ("<answer>done</answer>", False),
    ("\\boxed{up}", False),
    ('<tool_call>{"name": "f", "arguments": {"x": 1}}', True),  # never closed
    ("<tool_call>{name: f}</tool_call>", True),
    ('<tool_call>{"arguments": {}}</tool_call>', True),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', True),
])
def test_malformed_tool_calls_are_recognised_as_the_env_does(completion, malformed):
    assert malformed_tool_call(completion) is malformed


def test_truncated_episodes_and_malformed_calls_can_be_masked():
    def play(seed, reward, truncated, completion):
        return Rollout(env_id="env_t", seed=seed, reward=reward, truncated=truncated,
                       turns=[Turn(action="a", completion=completion, prompt_ids=[1],
                                   completion_ids=[2], logprobs=[0.0])])

    good = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    plays = [play(0, 1.0, False, good), play(1, 0.0, True, good),
             play(2, 0.0, False, "<tool_call>oops")]
    samples, _ = build_samples(plays, CFG)
    assert len(samples) == 3
    cfg = Config(mask_truncated=True, mask_malformed_tool_calls=True)
    samples, skipped = build_samples(plays, cfg)
    assert [s.source for s in samples] == [plays[0].id]
    assert skipped == {"agent_truncated_masked": 1, "agent_malformed_tool_call_masked": 1}
    # masked plays still count in their group: the kept play's advantage is unchanged
    assert samples[0].advantage == pytest.approx(
        build_samples(plays, CFG)[0][0].advantage)
