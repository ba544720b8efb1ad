"""train-grpo: the loss math, masks, TIS, checkpoints, resume, and both roles' samples."""

import gc
import json
import math
import os
import random
import re
import weakref

import pytest

torch = pytest.importorskip("torch")

from stages import train_grpo as stage  # noqa: E402
from stages.backends import BackendSpec, Sampling, load_backend  # noqa: E402
from stages.records import Design, Failure, Regret, Rollout, Turn  # noqa: E402

CFG = stage.Config()


def token_loss(logp, old, sampled, adv, **cfg):
    return stage.token_loss(torch, torch.tensor(logp, requires_grad=True), torch.tensor(old),
                            torch.tensor(sampled), torch.tensor(adv), stage.Config(**cfg))


def test_asymmetric_clip_stops_the_gradient_outside_the_trust_region():
    logp = torch.log(torch.tensor([1.5, 1.1, 0.7, 0.9])).requires_grad_()
    loss, parts = stage.token_loss(torch, logp, torch.zeros(4), torch.zeros(4),
                                   torch.tensor([1.0, 1.0, -1.0, -1.0]), CFG)
    loss.sum().backward()
    # ratio 1.5 > 1.28 with A>0 and ratio 0.7 < 0.8 with A<0 are clipped: no gradient
    assert logp.grad.tolist() == pytest.approx([0.0, -1.1, 0.0, 0.9])
    assert parts["clip_frac"] == 2.0


def test_tis_weights_clamp_at_the_cap():
    _, parts = token_loss([0.0, 0.0], [0.0, 0.0], [-5.0, -0.1], [1.0, 1.0], tis_cap=2.0)
    assert parts["tis_weight"] == pytest.approx(2.0 + torch.exp(torch.tensor(0.1)).item())
    assert parts["tis_clamped"] == 1.0


def loss_logprobs(policy, samples, model=None):
    with torch.no_grad():
        values, _ = policy.logprobs(model or policy.model, policy.pack(samples))
    return values


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_update_moves_probability_toward_positive_advantage(tiny_model, tmp_path, device):
    """On CUDA the update runs under bf16 autocast (Config.bf16) and must move the same way."""
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    prompt = backend.render([{"role": "user", "content": "pick"}], None)
    good, bad = [70, 71, 72], [80, 81, 82]

    def logp(model_dir, completion):
        policy = stage.Policy(model_dir, CFG)
        return loss_logprobs(policy, [stage.Sample.of_turn("agent", prompt, completion,
                                                           [0.0] * 3, 0.0)]).sum().item()

    rollouts = [Rollout(env_id="env_x", seed=i, reward=r, meta={"temperature": 1.0},
                        turns=[Turn(action="a", prompt_ids=prompt, completion_ids=c,
                                    logprobs=[logp_sampled] * 3)])
                for i, (r, c, logp_sampled) in enumerate([(1.0, good, -6.0), (0.0, bad, -6.0)])]
    # Adam's first step moves every weight by about lr: at 1e-2 the step leaves the linear
    # regime and lifts the shared layers under both completions (bad +0.10 nats with seed 0);
    # at 1e-3 good rises by 1.1-1.3 nats and bad falls by 0.9-1.3 for tiny seeds 0-3.
    cfg = stage.Config(lr=1e-3, batch_size=2, weight_decay=0.0, device=device)
    records, out, info = stage.run(rollouts, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert info["roles"] == {"agent": 2, "designer": 0}
    assert logp(str(out), good) > logp(tiny_model, good)
    assert logp(str(out), bad) < logp(tiny_model, bad)
    stats = records[0].stats
    assert stats["agent_adv_mean"] == 0.0 and stats["agent_adv_max"] == pytest.approx(1.0)
    assert {"loss", "clip_frac", "approx_kl", "entropy", "grad_norm"} <= set(stats)
    assert records[0].meta["tokens_per_s"] > 0


EOS = 3


def multi_turn_play(seed=0, turns=3, rewrite_history=False, reward=1.0):
    """A play whose prompts grow by the last completion and an observation, as a chat template
    renders them; `rewrite_history` changes an earlier turn in later prompts, as templates
    that drop earlier reasoning do."""
    rng = random.Random(seed)
    prompt = [1, 50, 51, 52, 2]
    played = []
    for turn in range(turns):
        completion = [rng.randrange(10, 1500) for _ in range(rng.randrange(2, 7))] + [EOS]
        played.append(Turn(action="a", prompt_ids=list(prompt), completion_ids=completion,
                           logprobs=[rng.uniform(-3, -0.5) for _ in completion]))
        observation = [1, rng.randrange(10, 1500), rng.randrange(10, 1500), 2]
        prompt = prompt + completion + observation
        if rewrite_history and turn == 0:
            prompt[len(played[0].prompt_ids)] = 7  # the first completion, rewritten
    return Rollout(env_id="env_m", seed=seed, reward=reward, turns=played,
                   meta={"temperature": 0.8})


def per_turn(play, advantage):
    return [stage.Sample.of_turn("agent", t.prompt_ids, t.completion_ids, t.logprobs,
                                 advantage, 0.8, play.id) for t in play.turns]


def test_a_play_whose_turns_extend_each_other_is_one_sequence():
    play = multi_turn_play()
    (episode,) = stage.play_samples(play, 1.0, CFG, {})
    last = play.turns[-1]
    assert episode.ids == last.prompt_ids + last.completion_ids and not episode.per_turn
    # loss on the completions only: the observations between them are context
    assert [episode.ids[p] for p in episode.loss_positions] == \
        [tok for t in play.turns for tok in t.completion_ids]
    assert episode.sampled_logprobs == [lp for t in play.turns for lp in t.logprobs]
    assert len(episode.ids) < sum(len(s.ids) for s in per_turn(play, 1.0))


def test_episode_and_per_turn_layouts_give_the_same_logprobs_and_gradients(tiny_model):
    """One sequence per play is only a cheaper way to compute the per-turn path's numbers."""
    plays = [multi_turn_play(seed=s, reward=float(s % 2)) for s in range(4)]
    episodes = [stage.play_samples(p, a, CFG, {})[0] for p, a in zip(plays, [1, -1, 0.5, -0.5])]
    turns = [s for p, a in zip(plays, [1, -1, 0.5, -0.5]) for s in per_turn(p, a)]
    policy = stage.Policy(tiny_model, stage.Config(micro_batch_tokens=64))
    torch.testing.assert_close(loss_logprobs(policy, episodes), loss_logprobs(policy, turns),
                               atol=1e-5, rtol=0)
    policy.optimizer.step = lambda: None  # keep the weights: compare the gradients

    def step(samples):
        record = stage._optimizer_step(policy, samples, list(range(len(samples))),
                                       [None] * len(samples), policy.cfg, 1)
        return record, {n: p.grad.clone() for n, p in policy.model.named_parameters()}

    by_episode, episode_grads = step(episodes)
    by_turn, turn_grads = step(turns)
    assert by_episode.stats["loss"] == pytest.approx(by_turn.stats["loss"], abs=1e-6)
    for name, grad in episode_grads.items():
        torch.testing.assert_close(grad, turn_grads[name], atol=1e-5, rtol=1e-4)
    assert by_episode.stats["loss_tokens"] == by_turn.stats["loss_tokens"]
    assert by_episode.stats["forward_tokens"] == sum(len(s.ids) for s in episodes)
    assert by_turn.stats["forward_tokens"] == sum(len(s.ids) for s in turns)


def test_micro_batches_by_tokens_accumulate_to_the_same_gradient(tiny_model):
    samples = [stage.play_samples(multi_turn_play(seed=s), a, CFG, {})[0]
               for s, a in enumerate([1.0, -1.0, 0.3])]

    def grads(budget):
        policy = stage.Policy(tiny_model, stage.Config(micro_batch_tokens=budget))
        policy.optimizer.step = lambda: None
        stage._optimizer_step(policy, samples, [0, 1, 2], [None] * 3, policy.cfg, 1)
        return {n: p.grad for n, p in policy.model.named_parameters()}

    one, several = grads(10_000), grads(1)  # one pass, or one sequence a pass
    for name, grad in one.items():
        torch.testing.assert_close(grad, several[name], atol=1e-6, rtol=1e-4)


def test_a_template_that_rewrites_history_falls_back_to_turns_and_is_counted(tiny_model,
                                                                             tmp_path):
    plays = [multi_turn_play(seed=0, rewrite_history=True, reward=1.0),
             multi_turn_play(seed=1, reward=0.0)]
    samples, _ = stage.build_samples(plays, CFG)
    assert [(s.source, s.per_turn) for s in samples] == \
        [(plays[0].id, True)] * 3 + [(plays[1].id, False)]
    records, _, info = stage.run(plays, tiny_model, str(tmp_path / "ckpt"), CFG)
    assert info["per_turn_fallbacks"] == 1
    stats = records[0].stats
    assert stats["per_turn_fallbacks"] == 1.0 and stats["padding_share"] == 0.0
    assert stats["loss_tokens"] == sum(len(t.completion_ids) for p in plays for t in p.turns)
    assert stats["forward_tokens"] == sum(len(s.ids) for s in samples)
    assert records[0].meta["peak_memory_bytes"] > 0


def reference_loss(samples, logp, old, cfg, norm):
    """The GRPO objective written out token by token, as the reference's trainer reduces it
    ("sample": slime's sum of per-sample token means over the batch size) or as TRL's dapo
    does ("token")."""
    per_sample, offset = [], 0
    for sample in samples:
        terms = []
        for k, sampled in enumerate(sample.sampled_logprobs):
            ratio = math.exp(logp[offset + k] - old[offset + k])
            tis = min(math.exp(old[offset + k] - sampled), cfg.tis_cap)
            clipped = min(max(ratio, 1 - cfg.clip_low), 1 + cfg.clip_high)
            terms.append(-tis * min(ratio * sample.advantage, clipped * sample.advantage))
        offset += len(sample.sampled_logprobs)
        per_sample.append(terms)
    if norm == "token":
        return sum(map(sum, per_sample)) / sum(map(len, per_sample))
    return sum(sum(t) / len(t) for t in per_sample) / len(per_sample)


@pytest.mark.parametrize("norm", stage.LOSS_NORMS)
def test_loss_norms_match_a_hand_written_reference(norm):
    rng = random.Random(3)
    cfg = stage.Config(loss_norm=norm)
    for _ in range(50):
        samples = []
        for i in range(rng.randrange(1, 6)):
            n = rng.randrange(1, 9)
            samples.append(stage.Sample("agent", [0] * (n + 1), list(range(1, n + 1)),
                                        [rng.uniform(-3, 0) for _ in range(n)],
                                        rng.gauss(0, 2), source=f"play_{i}"))
        tokens = sum(len(s.loss_positions) for s in samples)
        logp = [rng.uniform(-3, 0) for _ in range(tokens)]
        old = [lp + rng.uniform(-0.5, 0.5) for lp in logp]
        terms, _ = stage.token_loss(
            torch, torch.tensor(logp, dtype=torch.float64), torch.tensor(old, dtype=torch.float64),
            torch.tensor([v for s in samples for v in s.sampled_logprobs], dtype=torch.float64),
            torch.tensor([s.advantage for s in samples for _ in s.loss_positions],
                         dtype=torch.float64), cfg)
        weights = [w for s, w in zip(samples, stage.loss_weights(samples, norm))
                   for _ in s.loss_positions]
        ours = float((terms * torch.tensor(weights, dtype=torch.float64)).sum())
        assert ours == pytest.approx(reference_loss(samples, logp, old, cfg, norm), abs=1e-12)


def test_sample_norm_weighs_every_episode_alike_however_long():
    short = stage.Sample("agent", [0, 1], [1], [0.0], 1.0, source="a")
    long = stage.Sample("agent", [0] * 11, list(range(1, 11)), [0.0] * 10, 1.0, source="b")
    turn_one, turn_two = (stage.Sample("agent", [0] * 3, [1, 2], [0.0] * 2, 1.0, source="c")
                          for _ in range(2))
    assert stage.loss_weights([short, long], "sample") == [1 / 2, 1 / 20]
    assert stage.loss_weights([short, long], "token") == [1 / 11, 1 / 11]
    # a play trained turn by turn is still one sample: its turns share its weight
    assert stage.loss_weights([short, turn_one, turn_two], "sample") == [1 / 2, 1 / 8, 1 / 8]


def test_checkpoint_loads_resumes_and_counts_steps(tiny_model, tmp_path):
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    plays = [Rollout(env_id="env_x", seed=i, reward=float(i % 2),
                     turns=[Turn(action="a", prompt_ids=c.prompt_ids, completion_ids=c.completion_ids,
                                 logprobs=c.logprobs)])
             for i, c in enumerate(backend.chat([[{"role": "user", "content": "go"}]] * 4,
                                                Sampling(max_tokens=6, seed=0)))]
    cfg = stage.Config(lr=1e-3, batch_size=2)
    records, out, _ = stage.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert out.name == "step-000002" and [r.step for r in records] == [1, 2]
    state = json.loads((out / stage.STATE_FILE).read_text())
    assert state["step"] == 2 and (out / "trainer" / ".metadata").exists()
    reloaded = load_backend(BackendSpec(name="hf", model=str(out)))
    assert reloaded.chat([[{"role": "user", "content": "go"}]], Sampling(max_tokens=2, seed=0))
    again, same_out, info = stage.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert info.get("resumed") and same_out == out
    assert [r.stats for r in again] == [r.stats for r in records]
    next_records, next_out, _ = stage.run(plays, str(out), str(tmp_path / "ckpt"), cfg)
    assert next_out.name == "step-000004" and next_records[0].step == 3


def test_designer_samples_come_from_regret_and_design_records():
    design = Design(completion="```python\n...```", prompt_ids=[1, 2], completion_ids=[3, 4],
                    logprobs=[-0.5, -0.5], meta={"temperature": 0.6})
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=2.5)
    orphan = Regret(env_id="env_b", design_id="des_missing", designer_advantage=1.0)
    hinted = Rollout(env_id="env_a", hint=True, turns=[Turn(action="a", prompt_ids=[1],
                                                            completion_ids=[2], logprobs=[0.0])])
    samples, skipped = stage.build_samples([design, regret, orphan, hinted], CFG)
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
    (sample,), _ = stage.build_samples([first, repair, turn_one], CFG)
    assert sample.ids == [1, 2, 3, 4] and sample.loss_positions == [2, 3]  # the default
    whole = Regret(env_id="env_a", design_id=repair.id, designer_advantage=1.0,
                   designer_sample="conversation")
    (sample,), _ = stage.build_samples([first, repair, whole], CFG)
    assert sample.ids == [1, 2, 3, 4, 9, 5, 6] and sample.loss_positions == [2, 3, 5, 6]
    assert sample.sampled_logprobs == [-0.1, -0.2, -0.3, -0.4] and sample.source == repair.id
    hotter = repair_conversation(repair_temperature=1.0)
    regret = whole.model_copy(update={"design_id": hotter[1].id})
    samples, _ = stage.build_samples([*hotter, regret], CFG)  # two temperatures: per turn
    assert [(s.temperature, s.per_turn, s.source) for s in samples] == [
        (0.6, True, hotter[1].id), (1.0, True, hotter[1].id)]
    _, skipped = stage.build_samples([repair, whole], CFG)  # turn 1 not among the inputs
    assert skipped == {"designer_without_design_record": 1}


def test_the_agent_role_alone_trains_no_designer_sample_whatever_the_inputs():
    """What `spade run` gives train-grpo with a separate, frozen designer: `--roles agent`."""
    design = Design(completion="x", prompt_ids=[1, 2], completion_ids=[3, 4],
                    logprobs=[-0.5, -0.5])
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=2.5)
    samples, skipped = stage.build_samples([design, regret],
                                           stage.Config(roles=("agent",)))
    assert samples == [] and skipped == {}


def test_the_plays_of_an_env_judged_a_shortcut_do_not_train():
    from stages.records import Judgement

    def play(env_id, reward):
        return Rollout(env_id=env_id, reward=reward, turns=[Turn(
            action="a", prompt_ids=[1], completion_ids=[2], logprobs=[0.0])])

    records = [play("env_a", 1.0), play("env_a", 0.0), play("env_b", 1.0), play("env_b", 0.0),
               Judgement(env_id="env_a", verdict="shortcut")]
    samples, skipped = stage.build_samples(records, CFG)
    assert len(samples) == 2 and skipped == {"agent_shortcut_env_dropped": 2}


def crashed(play, outcome="program_error"):
    """`play` as the rollout stage records one the env broke: its last turn (the step that
    failed) keeps the agent's completion and has no observation; reward 0, ok false."""
    last = play.turns[-1].model_copy(update={"observation": "", "reward": 0.0}) \
        if play.turns else None
    return play.model_copy(update={
        "id": "", "ok": False, "outcome": outcome, "reward": 0.0, "terminated": False,
        "error": Failure(type=f"env.{outcome}", msg="boom"),
        "turns": play.turns[:-1] + [last] if last else []})


def env_fault_group(outcome="program_error"):
    plays = [multi_turn_play(seed=s, reward=r) for s, r in enumerate([1.0, 0.0, 1.0])]
    broken = crashed(multi_turn_play(seed=3, reward=1.0), outcome)
    return plays, Rollout.model_validate(broken.model_dump())  # a fresh id, as read


def test_a_play_whose_env_step_raised_trains_with_reward_minus_one():
    """The reference's env wrapper scores a step that raises -1 and completes the episode: it
    trains, in its env's group, and moves the other plays' advantages."""
    from stages import rewards

    plays, broken = env_fault_group()
    samples, skipped = stage.build_samples(plays + [broken], CFG)
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
    kept, skipped = stage.build_samples(plays + [broken], stage.Config(drop_env_errors=True))
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
    samples, skipped = stage.build_samples(plays + [broken],
                                           stage.Config(drop_env_errors=drop))
    assert [s.source for s in samples] == [p.id for p in plays]
    assert skipped == {f"agent_{outcome}_dropped": 1}
    assert [s.advantage for s in samples] == pytest.approx([0.7071067, -1.4142135, 0.7071067])


def test_a_program_error_before_the_agent_acted_is_dropped():
    """A load or reset that raised leaves no turn: a FAILED play, never trained."""
    plays, _ = env_fault_group()
    no_turns = crashed(Rollout(env_id="env_m", seed=9))
    samples, skipped = stage.build_samples(plays + [no_turns], CFG)
    assert [s.source for s in samples] == [p.id for p in plays]
    assert skipped == {"agent_program_error_dropped": 1}


def test_a_crashed_play_trains_end_to_end(tiny_model, tmp_path):
    plays, broken = env_fault_group()
    records, out, info = stage.run(plays + [broken], tiny_model, str(tmp_path / "ckpt"),
                                   stage.Config(lr=1e-3, weight_decay=0.0))
    assert info["roles"]["agent"] == 4 and info["skipped"] == {} and out is not None
    assert broken.id in records[0].parents
    assert records[0].stats["agent_adv_min"] == pytest.approx(
        min(stage.build_samples([*plays, broken], CFG)[0], key=lambda s: s.advantage).advantage)
    assert all(math.isfinite(v) for v in records[0].stats.values())


@pytest.mark.parametrize("log_ratio", [50.0, -50.0, 100.0, 1e30])
def test_an_extreme_token_adds_exactly_the_clamp_to_the_kl_term(log_ratio):
    """slime's low_var_kl clamps k3 at 10: past it a token adds 10 and no gradient."""
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    anchored = torch.tensor([-1.0 + log_ratio, -1.0])  # the second token: policy = anchor
    kl = stage.kl_k3(torch, logp, anchored)
    assert kl.tolist() == [10.0, 0.0] and stage.KL_CLAMP == 10.0
    kl.sum().backward()
    assert logp.grad.tolist() == [0.0, 0.0]


def test_ordinary_tokens_keep_the_unclamped_k3_and_its_gradient():
    log_ratio = torch.linspace(-2.0, 2.0, 41, dtype=torch.float64)  # k3(2) = 4.39 < 10
    logp = torch.zeros(41, dtype=torch.float64, requires_grad=True)
    kl = stage.kl_k3(torch, logp, log_ratio)
    expected_logp = torch.zeros(41, dtype=torch.float64, requires_grad=True)
    r = log_ratio - expected_logp
    expected = torch.exp(r) - r - 1
    torch.testing.assert_close(kl, expected, atol=0, rtol=0)
    kl.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(logp.grad, expected_logp.grad, atol=0, rtol=0)


def test_samples_without_token_ids_are_skipped_and_counted():
    play = Rollout(env_id="env_a", turns=[Turn(action="a", completion="x")])
    samples, skipped = stage.build_samples([play], CFG)
    assert samples == [] and skipped == {"agent_no_token_ids": 1}


def lora_plays(backend, count=4):
    done = backend.chat([[{"role": "user", "content": f"go {i}"}] for i in range(count)],
                        Sampling(max_tokens=6, seed=0))
    return [Rollout(env_id="env_x", seed=i, reward=float(i % 2),
                    turns=[Turn(action="a", prompt_ids=c.prompt_ids,
                                completion_ids=c.completion_ids, logprobs=c.logprobs)])
            for i, c in enumerate(done)]


def adapter_weights(step_dir):
    from safetensors.torch import load_file

    return load_file(str(step_dir / "adapter_model.safetensors"))


def trainer_state_file(step_dir, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = tmp_path / f"{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir / "trainer"), str(whole))
    return torch.load(whole, weights_only=True)


def served_and_direct_logprobs(step_dir, base):
    """What the hf backend samples from a LoRA checkpoint, with the logprobs it reports, and
    the logprobs of the same tokens under base + adapter built directly with peft."""
    import peft
    import transformers

    served = load_backend(BackendSpec(name="hf", model=str(step_dir))).chat(
        [[{"role": "user", "content": "go 9"}]], Sampling(max_tokens=8, seed=3))[0]
    model = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
        str(step_dir)).eval()
    ids = torch.tensor([served.prompt_ids + served.completion_ids])
    start = len(served.prompt_ids)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, start - 1:-1]
    direct = torch.log_softmax(logits, -1).gather(
        1, torch.tensor(served.completion_ids)[:, None])[:, 0]
    return served, direct, model


def test_lora_adapters_and_their_adamw_state_carry_over_and_are_served_unmerged(
        tiny_model, tmp_path):
    pytest.importorskip("peft")
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    plays = lora_plays(backend)
    cfg = stage.Config(lr=1e-2, weight_decay=0.0, lora_rank=4)
    root = str(tmp_path / "ckpt")
    first_records, first, info = stage.run(plays, tiny_model, root, cfg)
    assert first_records[0].stats["grad_norm"] > 0
    # an adapter folder on the start model: no weights of a model of its own
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer",
            stage.STATE_FILE} <= {p.name for p in first.iterdir()}
    assert not (first / "model.safetensors").exists() and not (first / "config.json").exists()
    adapter = adapter_weights(first)
    assert info["trainable_parameters"] == sum(t.numel() for t in adapter.values())
    assert 0 < info["trainable_parameters"] < info["parameters"]
    assert not any("lm_head" in k or "embed" in k for k in adapter)

    # round 2 starts from round 1's adapter and AdamW state (one step taken)
    import peft

    resumed = stage.Policy(str(first), cfg)
    assert same_tensors(peft.get_peft_model_state_dict(resumed.model), adapter)
    steps = {float(s["step"]) for s in resumed.optimizer.state.values()}
    assert steps == {1.0} and len(resumed.optimizer.state) == len(adapter)
    resumed.close()
    _, second, _ = stage.run(plays, str(first), root, cfg, round=1)
    state = json.loads((second / stage.STATE_FILE).read_text())
    assert state["base_model"] == state["start_model"] == os.path.normpath(tiny_model)
    assert json.loads((second / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == os.path.normpath(tiny_model)
    optimizer = trainer_state_file(second, tmp_path)["optimizer"]
    assert {float(s["step"]) for s in optimizer["state"].values()} == {2.0}
    assert not same_tensors(adapter_weights(second), adapter)

    # what the hf backend serves from step 2 is base + the twice-updated adapter
    served, direct, model = served_and_direct_logprobs(second, tiny_model)
    assert len(served.logprobs) == len(served.completion_ids) == 8
    assert max(abs(a - b) for a, b in zip(served.logprobs, direct.tolist())) < 1e-5
    with torch.no_grad(), model.disable_adapter():  # and the adapter does change them
        ids = torch.tensor([served.prompt_ids + served.completion_ids])
        base = torch.log_softmax(model(input_ids=ids).logits[0, len(served.prompt_ids) - 1:-1],
                                 -1).gather(1, torch.tensor(served.completion_ids)[:, None])
    assert float((base[:, 0] - direct).abs().max()) > 1e-3


def test_a_lora_run_anchors_its_kl_to_the_base_with_the_adapter_switched_off(tiny_model,
                                                                            tmp_path):
    pytest.importorskip("peft")
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    plays = lora_plays(backend)
    cfg = stage.Config(lr=1e-2, weight_decay=0.0, lora_rank=4, kl_beta=1.0)
    _, first, _ = stage.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    samples, _ = stage.build_samples(plays, cfg)
    policy = stage.Policy(str(first), cfg, anchor=stage.start_model(str(first)))
    assert policy.anchor is policy.model  # no second copy of the base
    with torch.no_grad():
        anchored = policy.anchor_logprobs(policy.pack(samples))
    base = loss_logprobs(stage.Policy(tiny_model, CFG), samples)
    assert torch.allclose(anchored, base, atol=1e-6)
    assert not torch.allclose(loss_logprobs(policy, samples), base, atol=1e-3)


def same_tensors(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_small_lora_update_changes_the_adapter_and_never_the_base(tiny_model, tmp_path):
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    before = load_file(os.path.join(tiny_model, "model.safetensors"))
    cfg = stage.Config(lr=1e-6, lora_rank=4)  # the paper recipes' lr
    _, out, _ = stage.run(lora_plays(backend), tiny_model, str(tmp_path / "ckpt"), cfg)
    adapter = adapter_weights(out)
    # peft starts lora_B at zero: any change of it is the update, however small
    assert all(bool(t.abs().max() > 0) for k, t in adapter.items() if "lora_B" in k)
    assert same_tensors(load_file(os.path.join(tiny_model, "model.safetensors")), before)
    served = load_backend(BackendSpec(name="hf", model=str(out))).model
    base_layers = {k.replace(".base_layer", ""): v for k, v in served.state_dict().items()
                   if "lora_" not in k}
    assert all(torch.equal(base_layers[k], v) for k, v in before.items())


def test_auto_lora_targets_leave_moe_experts_the_router_and_the_head_alone():
    peft = pytest.importorskip("peft")
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1])  # layer 1: a dense MLP
    model = transformers.AutoModelForCausalLM.from_config(config)
    targets = stage.lora_targets(torch, model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=targets))
    adapted = {name.split(".lora_")[0].removeprefix("base_model.model.")
               for name, p in wrapped.named_parameters() if p.requires_grad}
    # no experts, no mlp.gate (the router), no lm_head; and no MLP projection at all, since
    # peft would read layer 1's gate_proj/up_proj/down_proj as the experts' fused weights
    assert adapted == {f"model.layers.{i}.self_attn.{m}_proj" for i in (0, 1) for m in "qkvo"}
    assert not stage.wraps_experts(wrapped)
    everything = peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(config),
                                     peft.LoraConfig(r=2, target_modules="all-linear"))
    assert stage.wraps_experts(everything)  # what peft's own "all-linear" does
    dense = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    assert stage.lora_targets(torch, dense) == sorted(
        f"{m}_proj" for m in ("q", "k", "v", "o", "gate", "up", "down"))
    assert stage.parameter_counts(wrapped)[0] == sum(
        p.numel() for n, p in wrapped.named_parameters() if "lora_" in n)
    assert stage.lora_targets(torch, model, "q_proj, v_proj") == ["q_proj", "v_proj"]


def play(reward, seed=0, logprobs=(-1.0,), **meta):
    return Rollout(env_id="env_x", seed=seed, reward=reward, meta=meta,
                   turns=[Turn(action="a", prompt_ids=[5, 6], completion_ids=[7],
                               logprobs=list(logprobs))])


@pytest.mark.parametrize("records, field", [
    ([play(1.0), play(float("nan"), seed=1), play(0.0, seed=2)], "reward"),
    ([play(1.0), play(0.0, seed=1, logprobs=[float("-inf")])], "turns.0.logprobs"),
    ([play(1.0), play(0.0, seed=1, temperature="NaN")], "meta.temperature"),
])
def test_non_finite_inputs_are_refused_before_any_training(tmp_path, records, field):
    from stages.records import RecordError

    with pytest.raises(RecordError, match=rf"^ro_\w+: field '{re.escape(field)}'"):
        stage.run(records, "no-model-needed", str(tmp_path / "ckpt"), CFG)
    assert not (tmp_path / "ckpt").exists()


def test_a_non_finite_loss_stops_the_update_and_writes_no_checkpoint(tiny_model, tmp_path,
                                                                     monkeypatch):
    models = []
    load = stage.Policy.__init__

    def watched(policy, *args, **kwargs):
        load(policy, *args, **kwargs)
        models.append(weakref.ref(policy.model))

    monkeypatch.setattr(stage.Policy, "__init__", watched)
    design = Design(completion="x", prompt_ids=[5, 6], completion_ids=[7, 8],
                    logprobs=[-1.0, -1.0])
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=1e300)  # inf in fp32
    cfg = stage.Config(batch_size=1)
    with pytest.raises(stage.Diverged, match="step 1: loss .*not finite, so no checkpoint") \
            as raised:
        stage.run([design, regret], tiny_model, str(tmp_path / "ckpt"), cfg)
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())
    # the model is let go although the error's traceback keeps the trainer's frame: on a GPU
    # its memory is free for whatever runs next
    gc.collect()
    assert raised.traceback and len(models) == 1 and models[0]() is None


def test_a_checkpoint_with_a_non_finite_weight_is_never_saved(tiny_model, tmp_path):
    policy = stage.Policy(tiny_model, CFG)
    with torch.no_grad():
        next(policy.model.parameters())[0].fill_(float("nan"))
    with pytest.raises(stage.Diverged, match="is not finite after the update"):
        policy.save(tmp_path / "step-000001", {"step": 1})
    assert list(tmp_path.iterdir()) == []


def test_one_step_per_round_over_whole_episodes_by_default():
    """The reference: one optimizer step per round; an episode's turns never split."""
    samples = [stage.Sample.of_turn("agent", [1], [2], [0.0], 0.0, source=f"play_{i // 3}")
               for i in range(30)]  # 10 plays of 3 turns
    (only,) = stage.plan_steps(samples, stage.Config(), seed=0)
    assert sorted(only) == list(range(30))
    steps = stage.plan_steps(samples, stage.Config(batch_size=4), seed=0)
    assert [len(step) for step in steps] == [12, 12, 6]
    for step in steps:  # every turn of a play that is in the step
        assert all(i // 3 * 3 + k in step for i in step for k in range(3))
    turns = stage.plan_steps(samples, stage.Config(batch_size=4, batch_unit="turn"), seed=0)
    assert [len(step) for step in turns] == [4] * 7 + [2]


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
    assert stage.malformed_tool_call(completion) is malformed


def test_truncated_episodes_and_malformed_calls_can_be_masked():
    def play(seed, reward, truncated, completion):
        return Rollout(env_id="env_t", seed=seed, reward=reward, truncated=truncated,
                       turns=[Turn(action="a", completion=completion, prompt_ids=[1],
                                   completion_ids=[2], logprobs=[0.0])])

    good = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    plays = [play(0, 1.0, False, good), play(1, 0.0, True, good),
             play(2, 0.0, False, "<tool_call>oops")]
    samples, _ = stage.build_samples(plays, CFG)
    assert len(samples) == 3
    cfg = stage.Config(mask_truncated=True, mask_malformed_tool_calls=True)
    samples, skipped = stage.build_samples(plays, cfg)
    assert [s.source for s in samples] == [plays[0].id]
    assert skipped == {"agent_truncated_masked": 1, "agent_malformed_tool_call_masked": 1}
    # masked plays still count in their group: the kept play's advantage is unchanged
    assert samples[0].advantage == pytest.approx(
        stage.build_samples(plays, CFG)[0][0].advantage)


def test_prune_keeps_the_newest_the_parent_and_marked_checkpoints(tmp_path):
    for step in range(1, 7):
        folder = tmp_path / f"step-{step:06d}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"w")
        (folder / "trainer").mkdir()
        (folder / "trainer" / ".metadata").write_bytes(b"o")
    (tmp_path / "step-000002" / stage.KEEP_FILE).write_text("eval: runs/x/r01/eval-rg-hard\n")
    deleted = stage.prune_checkpoints(str(tmp_path), 2, protect=[str(tmp_path / "step-000004")])
    assert sorted(p.name for p in deleted) == ["step-000001", "step-000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000002", "step-000004", "step-000005", "step-000006"]
    assert [p.parent.name for p in sorted(tmp_path.glob("*/trainer"))] == ["step-000006"]
    assert all((tmp_path / name / "model.safetensors").exists()
               for name in ("step-000002", "step-000004", "step-000005"))


def test_kl_anchors_to_the_start_model_and_changes_the_second_round(tiny_model, tmp_path):
    """With one step per round, a KL to the round's own start has no gradient; anchored to the
    model the run started from, it pulls the second round's update back."""
    from safetensors.torch import load_file

    plays = [multi_turn_play(seed=s, reward=float(s % 2)) for s in range(4)]

    def two_rounds(kl_beta):
        root = str(tmp_path / f"kl-{kl_beta}")
        cfg = stage.Config(lr=1e-2, kl_beta=kl_beta, weight_decay=0.0)
        _, first, _ = stage.run(plays, tiny_model, root, cfg)
        _, second, _ = stage.run(plays, str(first), root, cfg, round=1)
        return first, second

    (off_1, off_2), (on_1, on_2) = two_rounds(0.0), two_rounds(1.0)
    weights = {path: load_file(str(path / "model.safetensors"))
               for path in (off_1, off_2, on_1, on_2)}
    # round 1 starts at the anchor: the KL term and its gradient are exactly zero
    assert all(torch.equal(weights[off_1][k], weights[on_1][k]) for k in weights[off_1])
    assert any(not torch.equal(weights[off_2][k], weights[on_2][k]) for k in weights[off_2])
    state = json.loads((on_2 / stage.STATE_FILE).read_text())
    assert state["kl_anchor"] == state["start_model"] == os.path.normpath(tiny_model)
    assert state["parent"] == os.path.normpath(on_1)
