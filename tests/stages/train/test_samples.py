"""train-grpo's loss and samples at their boundaries, without a model: PPO clip bounds on both
sides with both advantage signs, importance weights, the loss normalised over the optimizer
batch, hinted and broken plays, groups per env and round."""

import math
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from stages import train_grpo as stage  # noqa: E402
from stages.records import Design, Regret, Rollout, Turn  # noqa: E402

CFG = stage.Config()  # clip_low 0.2 (ratio 0.8), clip_high 0.28 (ratio 1.28)


def loss_and_grad(ratio, advantage, old=0.0, sampled=None, **cfg):
    logp = torch.tensor([math.log(ratio) + old], dtype=torch.float64, requires_grad=True)
    loss, parts = stage.token_loss(
        torch, logp, torch.tensor([old], dtype=torch.float64),
        torch.tensor([old if sampled is None else sampled], dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64), stage.Config(**cfg))
    loss.sum().backward()
    return float(loss.sum()), float(logp.grad[0]), parts


# (ratio, advantage) -> (loss, d loss / d logp, outside the bounds: clip_frac counts it)
@pytest.mark.parametrize("ratio,adv,loss,grad,clipped", [
    (0.7, 1.0, -0.7, -0.7, True),     # below 1 - clip_low, A > 0: pessimistic min keeps ratio
    (0.7, -1.0, 0.8, 0.0, True),      # below 1 - clip_low, A < 0: clipped at 0.8, no gradient
    (0.9, 1.0, -0.9, -0.9, False),    # inside
    (0.9, -1.0, 0.9, 0.9, False),
    (1.2, 1.0, -1.2, -1.2, False),    # inside, above 1 - clip_low + clip_low: not clipped yet
    (1.2, -1.0, 1.2, 1.2, False),
    (1.5, 1.0, -1.28, 0.0, True),     # above 1 + clip_high, A > 0: clipped at 1.28
    (1.5, -1.0, 1.5, 1.5, True),      # above 1 + clip_high, A < 0: ratio kept
])
def test_ppo_clip_bounds_on_both_sides_with_both_advantage_signs(ratio, adv, loss, grad, clipped):
    value, gradient, parts = loss_and_grad(ratio, adv)
    assert value == pytest.approx(loss) and gradient == pytest.approx(grad, abs=1e-12)
    assert parts["clip_frac"] == float(clipped)


def test_the_clip_bounds_follow_the_config():
    assert loss_and_grad(1.2, 1.0, clip_high=0.1)[0] == pytest.approx(-1.1)
    assert loss_and_grad(0.85, -1.0, clip_low=0.1)[0] == pytest.approx(0.9)


def test_importance_weights_scale_the_loss_and_are_capped():
    # exp(old - sampled) = e^0.5 scales the token; past the cap it is the cap
    value, grad, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-1.5)
    assert value == pytest.approx(-math.exp(0.5)) and grad == pytest.approx(-math.exp(0.5))
    assert parts["tis_weight"] == pytest.approx(math.exp(0.5)) and parts["tis_clamped"] == 0.0
    value, _, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-4.0, tis_cap=2.0)
    assert value == pytest.approx(-2.0) and parts["tis_weight"] == pytest.approx(2.0)
    assert parts["tis_clamped"] == 1.0
    _, _, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-1.0 - math.log(2.0) + 1e-9,
                                tis_cap=2.0)
    assert parts["tis_clamped"] == 0.0  # just under the cap is not clamped


def test_approx_kl_is_half_the_squared_log_ratio():
    _, _, parts = loss_and_grad(math.exp(0.4), 1.0)
    assert parts["approx_kl"] == pytest.approx(0.5 * 0.4 ** 2)


def test_k3_kl_values():
    logp = torch.tensor([0.0, -1.0], dtype=torch.float64)
    anchored = torch.tensor([0.5, -1.0], dtype=torch.float64)
    kl = stage.kl_k3(torch, logp, anchored)
    assert kl.tolist() == pytest.approx([math.exp(0.5) - 0.5 - 1, 0.0])
    # k3(-30) = 29 + e^-30: clamped to 10, as slime's low_var_kl is
    assert float(stage.kl_k3(torch, torch.tensor([0.0]), torch.tensor([-30.0]))) == 10.0
    assert float(stage.kl_k3(torch, torch.tensor([0.0]), torch.tensor([-5.0]))) == \
        pytest.approx(4.0 + math.exp(-5.0))


def sample(source, tokens, role="agent"):
    return stage.Sample(role, [0] * (tokens + 1), list(range(1, tokens + 1)), [0.0] * tokens,
                        1.0, source=source)


def test_the_loss_is_normalised_over_the_optimizer_batch_not_a_micro_batch():
    batch = [sample("a", 3), sample("b", 1), sample("c", 4)]
    token = stage.loss_weights(batch, "token")
    assert token == [1 / 8] * 3  # every token of the whole batch, whichever micro-batch
    assert sum(w * len(s.loss_positions) for s, w in zip(batch, token)) == pytest.approx(1.0)
    per_sample = stage.loss_weights(batch, "sample")
    assert per_sample == pytest.approx([1 / 9, 1 / 3, 1 / 12])
    assert sum(w * len(s.loss_positions) for s, w in zip(batch, per_sample)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="loss_norm must be one of sample, token"):
        stage.loss_weights(batch, "micro")


def test_a_sample_of_one_turn():
    s = stage.Sample.of_turn("designer", [1, 2, 3], [4, 5], [-0.1, -0.2, -9.0], 0.5, 0.7, "des_x",
                             per_turn=True)
    assert s.ids == [1, 2, 3, 4, 5] and s.loss_positions == [3, 4]
    assert s.sampled_logprobs == [-0.1, -0.2] and s.advantage == 0.5 and s.temperature == 0.7
    assert s.source == "des_x" and s.per_turn and s.role == "designer"
    default = stage.Sample.of_turn("agent", [1], [2], [0.0], 1.0)
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
    samples, skipped = stage.build_samples(plays, CFG)
    assert skipped == {}
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    assert [s.source for s in samples] == [p.id for p in plays]


def test_hinted_plays_train_only_when_asked_and_apart_from_no_hint_plays():
    plays = [play(reward=1.0, seed=0), play(reward=0.0, seed=1),
             play(reward=1.0, hint=True, seed=2), play(reward=1.0, hint=True, seed=3)]
    samples, _ = stage.build_samples(plays, CFG)
    assert [s.source for s in samples] == [plays[0].id, plays[1].id]
    both, _ = stage.build_samples(plays, stage.Config(train_on_hinted=True))
    assert [s.advantage for s in both] == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_roles_choose_what_trains():
    design = Design(completion="x", prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.5, -0.5])
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=1.5)
    records = [play(seed=0), play(reward=0.0, seed=1), design, regret]
    agent, _ = stage.build_samples(records, stage.Config(roles=("agent",)))
    designer, _ = stage.build_samples(records, stage.Config(roles=("designer",)))
    assert {s.role for s in agent} == {"agent"} and len(agent) == 2
    assert [(s.role, s.advantage, s.ids, s.loss_positions, s.temperature, s.source)
            for s in designer] == [("designer", 1.5, [1, 2, 3], [1, 2], 1.0, design.id)]


def test_designs_without_token_ids_are_skipped_and_counted():
    for fields in ({"prompt_ids": None, "completion_ids": [2], "logprobs": [0.0]},
                   {"prompt_ids": [1], "completion_ids": [], "logprobs": [0.0]},
                   {"prompt_ids": [1], "completion_ids": [2], "logprobs": []}):
        design = Design(completion="x", **fields)
        regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=1.0)
        samples, skipped = stage.build_samples([design, regret], CFG)
        assert samples == [] and skipped == {"designer_no_token_ids": 1}
    design = Design(completion="x", prompt_ids=[], completion_ids=[2], logprobs=[0.0])
    samples, _ = stage.build_samples(
        [design, Regret(env_id="e", design_id=design.id, designer_advantage=1.0)], CFG)
    assert len(samples) == 1  # an empty prompt is still a prompt
    samples, skipped = stage.build_samples([Regret(env_id="e", designer_advantage=1.0)], CFG)
    assert skipped == {"designer_without_design_record": 1}


def test_broken_plays_are_not_trained_as_ordinary_samples():
    crash_turn = Turn(action="a", prompt_ids=[1], completion_ids=[2], logprobs=[0.0])
    crashed = play(reward=0.7, ok=False, outcome="program_error", seed=2, turns=[crash_turn])
    assert stage.crashed_step(crashed) and stage.trained_reward(crashed, CFG) == -1.0
    no_tokens = play(ok=False, outcome="program_error", seed=3,
                     turns=[Turn(action="a", prompt_ids=[1], completion_ids=[], logprobs=[])])
    assert not stage.crashed_step(no_tokens) and stage.trained_reward(no_tokens, CFG) is None
    ok_named_error = play(reward=0.5, ok=True, outcome="program_error", seed=4)
    assert not stage.crashed_step(ok_named_error)
    assert stage.trained_reward(ok_named_error, CFG) == 0.5
    hung = play(ok=False, outcome="timeout", seed=5)
    assert not stage.crashed_step(hung) and stage.trained_reward(hung, CFG) is None
    assert stage.trained_reward(crashed, stage.Config(drop_env_errors=True)) is None
    samples, skipped = stage.build_samples([play(reward=1.0), crashed, hung], CFG)
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0])
    assert skipped == {"agent_timeout_dropped": 1}


def test_a_play_whose_template_rewrites_history_trains_turn_by_turn():
    first = Turn(action="a", prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.3])
    second = Turn(action="b", prompt_ids=[1, 2, 9, 5], completion_ids=[6, 7],
                  logprobs=[-0.6, -0.7, -5.0])
    assert not stage.turns_extend([first, second])
    assert stage.turns_extend([first, second.model_copy(update={"prompt_ids": [1, 2, 3, 5]})])
    samples = stage.play_samples(play(turns=[first, second]), 0.5, CFG, {})
    assert [(s.ids, s.loss_positions, s.sampled_logprobs, s.per_turn) for s in samples] == [
        ([1, 2, 3], [2], [-0.3], True), ([1, 2, 9, 5, 6, 7], [4, 5], [-0.6, -0.7], True)]
    (single,) = stage.play_samples(play(turns=[first]), 0.5, CFG, {})
    assert not single.per_turn


def test_one_sequence_play_keeps_loss_only_on_turns_that_carry_it():
    first = Turn(action="a", completion="<tool_call>oops", prompt_ids=[1], completion_ids=[2, 3],
                 logprobs=[-0.2, -0.3, -9.0])
    second = Turn(action="b", prompt_ids=[1, 2, 3, 8], completion_ids=[4], logprobs=[-0.4])
    skipped = defaultdict(int)
    (s,) = stage.play_samples(play(turns=[first, second]), 1.0,
                              stage.Config(mask_malformed_tool_calls=True), skipped)
    assert s.ids == [1, 2, 3, 8, 4] and s.loss_positions == [4] and s.sampled_logprobs == [-0.4]
    assert skipped == {"agent_malformed_tool_call_masked": 1}
    (whole,) = stage.play_samples(play(turns=[first, second]), 1.0, CFG, defaultdict(int))
    assert whole.loss_positions == [1, 2, 4] and whole.sampled_logprobs == [-0.2, -0.3, -0.4]
    assert whole.temperature == 1.0 and whole.role == "agent"
    hot = play(turns=[first, second], meta={"temperature": 0.6})
    assert stage.play_samples(hot, 1.0, CFG, {})[0].temperature == 0.6


def test_a_play_with_a_turn_without_token_ids_trains_its_other_turns_apart():
    blank = Turn(action="a", prompt_ids=None, completion_ids=[2], logprobs=[0.0])
    good = Turn(action="b", prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1])
    skipped = defaultdict(int)
    (s,) = stage.play_samples(play(turns=[blank, good]), 1.0, CFG, skipped)
    assert s.per_turn and s.ids == [1, 2, 3] and skipped == {"agent_no_token_ids": 1}
    assert stage.play_samples(play(turns=[blank]), 1.0, CFG, defaultdict(int)) == []


def test_plan_steps_epochs_and_units():
    samples = [stage.Sample.of_turn("agent", [1], [2], [0.0], 0.0, source=f"p{i // 2}")
               for i in range(6)]
    steps = stage.plan_steps(samples, stage.Config(epochs=2), seed=1)
    assert len(steps) == 2 and all(sorted(s) == list(range(6)) for s in steps)
    steps = stage.plan_steps(samples, stage.Config(batch_size=1), seed=1)
    assert sorted(map(sorted, steps)) == [[0, 1], [2, 3], [4, 5]]
    assert stage.plan_steps(samples, stage.Config(batch_size=1), seed=1) == steps  # seeded
    with pytest.raises(ValueError, match="batch_unit must be one of episode, turn"):
        stage.plan_steps(samples, stage.Config(batch_unit="token"), seed=0)


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
    assert stage.malformed_tool_call(completion) is malformed


def test_approx_kl_and_the_tis_cap_with_a_moved_start_policy():
    _, _, parts = loss_and_grad(math.exp(0.4), 1.0, old=-2.0, sampled=-2.0)
    assert parts["approx_kl"] == pytest.approx(0.5 * 0.4 ** 2)
    _, _, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-1.0, tis_cap=1.0)
    assert parts["tis_clamped"] == 0.0 and parts["tis_weight"] == 1.0  # at the cap: not past it


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
    samples, skipped = stage.build_samples(records + good, stage.Config(mask_truncated=True))
    assert skipped == {"agent_timeout_dropped": 2, "agent_no_token_ids": 2,
                       "agent_truncated_masked": 2, "designer_without_design_record": 2,
                       "designer_no_token_ids": 2}
    assert [s.source for s in samples] == [good[0].id, good[1].id, design.id]
    malformed = Turn(action="a", completion="<tool_call>x", prompt_ids=[1], completion_ids=[2],
                     logprobs=[0.0])
    skipped = defaultdict(int)
    stage.play_samples(play(turns=[malformed, malformed]), 1.0,
                       stage.Config(mask_malformed_tool_calls=True), skipped)
    assert skipped == {"agent_malformed_tool_call_masked": 2}


def test_per_turn_samples_carry_the_plays_role_advantage_temperature_and_source():
    first = Turn(action="a", prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.3])
    second = Turn(action="b", prompt_ids=[1, 2, 9, 5], completion_ids=[6], logprobs=[-0.6])
    rewritten = play(turns=[first, second], meta={"temperature": 0.6})
    samples = stage.play_samples(rewritten, -0.75, CFG, defaultdict(int))
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
        stage.build_samples(records, CFG)
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
        stage.build_samples([design, regret], CFG)
    assert caught.value.where == (regret.id if field == "designer_advantage" else design.id)


def test_the_step_plan_is_a_function_of_the_seed():
    samples = [stage.Sample.of_turn("agent", [1], [2], [0.0], 0.0, source=f"p{i}")
               for i in range(20)]
    cfg = stage.Config(batch_size=1)
    assert stage.plan_steps(samples, cfg, seed=5) == stage.plan_steps(samples, cfg, seed=5)
    assert stage.plan_steps(samples, cfg, seed=5) != stage.plan_steps(samples, cfg, seed=6)


def test_every_masked_turn_of_a_truncated_play_is_counted():
    turn = Turn(action="a", prompt_ids=[1], completion_ids=[2], logprobs=[0.0])
    skipped = defaultdict(int)
    assert stage.play_samples(play(turns=[turn, turn, turn], truncated=True), 1.0,
                              stage.Config(mask_truncated=True), skipped) == []
    assert skipped == {"agent_truncated_masked": 3}
