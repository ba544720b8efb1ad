"""train-grpo: the loss math, masks, TIS, checkpoints, resume, and both roles' samples."""

import gc
import json
import re
import weakref

import pytest

torch = pytest.importorskip("torch")

from stages import train_grpo as stage  # noqa: E402
from stages.backends import BackendSpec, Sampling, load_backend  # noqa: E402
from stages.records import Design, Regret, Rollout, Turn  # noqa: E402

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


def test_masked_tokens_get_zero_gradient(tiny_model):
    from trl.trainer.utils import selective_log_softmax

    policy = stage.Policy(tiny_model, CFG)
    samples = [stage.Sample("agent", [5, 6, 7, 8], [9, 10], [-1.0, -1.0], 1.0),
               stage.Sample("agent", [5, 6], [11, 12, 13], [-1.0] * 3, -1.0)]
    ids, attention, mask, targets, temps = policy.batch(samples)
    assert mask.sum().item() == 5
    assert targets[0][mask[0]].tolist() == [9, 10] and targets[1][mask[1]].tolist() == [11, 12, 13]
    logits = torch.randn(2, ids.shape[1] - 1, policy.model.config.vocab_size, requires_grad=True)
    logp = selective_log_softmax(logits, targets)[mask]
    loss, _ = stage.token_loss(torch, logp, logp.detach(), logp.detach(),
                               torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0]), CFG)
    loss.sum().backward()
    grad_per_position = logits.grad.abs().sum(-1)
    assert torch.all(grad_per_position[~mask] == 0)
    assert torch.all(grad_per_position[mask] > 0)


def test_update_moves_probability_toward_positive_advantage(tiny_model, tmp_path):
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    prompt = backend.render([{"role": "user", "content": "pick"}], None)
    good, bad = [70, 71, 72], [80, 81, 82]

    def logp(model_dir, completion):
        policy = stage.Policy(model_dir, CFG)
        ids, attention, mask, targets, temps = policy.batch(
            [stage.Sample("agent", prompt, completion, [0.0] * 3, 0.0)])
        with torch.no_grad():
            values, _ = policy.logprobs(policy.model, ids, attention, targets, temps, mask)
        return values[mask].sum().item()

    rollouts = [Rollout(env_id="env_x", seed=i, reward=r, meta={"temperature": 1.0},
                        turns=[Turn(action="a", prompt_ids=prompt, completion_ids=c,
                                    logprobs=[logp_sampled] * 3)])
                for i, (r, c, logp_sampled) in enumerate([(1.0, good, -6.0), (0.0, bad, -6.0)])]
    cfg = stage.Config(lr=1e-2, batch_size=2, micro_batch=2, weight_decay=0.0)
    records, out, info = stage.run(rollouts, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert info["roles"] == {"agent": 2, "designer": 0}
    assert logp(str(out), good) > logp(tiny_model, good)
    assert logp(str(out), bad) < logp(tiny_model, bad)
    stats = records[0].stats
    assert stats["agent_adv_mean"] == 0.0 and stats["agent_adv_max"] == pytest.approx(1.0)
    assert {"loss", "clip_frac", "approx_kl", "entropy", "grad_norm"} <= set(stats)
    assert records[0].meta["tokens_per_s"] > 0


def test_checkpoint_loads_resumes_and_counts_steps(tiny_model, tmp_path):
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    plays = [Rollout(env_id="env_x", seed=i, reward=float(i % 2),
                     turns=[Turn(action="a", prompt_ids=c.prompt_ids, completion_ids=c.completion_ids,
                                 logprobs=c.logprobs)])
             for i, c in enumerate(backend.chat([[{"role": "user", "content": "go"}]] * 4,
                                                Sampling(max_tokens=6, seed=0)))]
    cfg = stage.Config(lr=1e-3, batch_size=2, micro_batch=2)
    records, out, _ = stage.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert out.name == "step-000002" and [r.step for r in records] == [1, 2]
    state = json.loads((out / stage.STATE_FILE).read_text())
    assert state["step"] == 2 and (out / "optimizer.pt").exists()
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


def test_samples_without_token_ids_are_skipped_and_counted():
    play = Rollout(env_id="env_a", turns=[Turn(action="a", completion="x")])
    samples, skipped = stage.build_samples([play], CFG)
    assert samples == [] and skipped == {"agent_no_token_ids": 1}


def test_lora_update_saves_a_plain_checkpoint(tiny_model, tmp_path):
    pytest.importorskip("peft")
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    done = backend.chat([[{"role": "user", "content": "go"}]] * 2, Sampling(max_tokens=4, seed=0))
    plays = [Rollout(env_id="env_x", seed=i, reward=float(i),
                     turns=[Turn(action="a", prompt_ids=c.prompt_ids,
                                 completion_ids=c.completion_ids, logprobs=c.logprobs)])
             for i, c in enumerate(done)]
    cfg = stage.Config(lr=1e-2, batch_size=2, micro_batch=2, lora_rank=4)
    records, out, _ = stage.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert records[0].stats["grad_norm"] > 0
    assert not (out / "adapter_config.json").exists()  # merged: every backend loads it
    reloaded = load_backend(BackendSpec(name="hf", model=str(out)))
    before = dict(backend.model.named_parameters())
    changed = [name for name, p in reloaded.model.named_parameters()
               if not torch.equal(p, before[name])]
    assert changed and all("proj" in name for name in changed)


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

    def watched(policy, *args):
        load(policy, *args)
        models.append(weakref.ref(policy.model))

    monkeypatch.setattr(stage.Policy, "__init__", watched)
    design = Design(completion="x", prompt_ids=[5, 6], completion_ids=[7, 8],
                    logprobs=[-1.0, -1.0])
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=1e300)  # inf in fp32
    cfg = stage.Config(batch_size=1, micro_batch=1)
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
    samples = [stage.Sample("agent", [1], [2], [0.0], 0.0, source=f"play_{i // 3}")
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
        (folder / "optimizer.pt").write_bytes(b"o")
    (tmp_path / "step-000002" / stage.KEEP_FILE).write_text("eval: runs/x/r01/eval-rg-hard\n")
    deleted = stage.prune_checkpoints(str(tmp_path), 2, protect=[str(tmp_path / "step-000004")])
    assert sorted(p.name for p in deleted) == ["step-000001", "step-000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000002", "step-000004", "step-000005", "step-000006"]
    assert [p.parent.name for p in sorted(tmp_path.glob("*/optimizer.pt"))] == ["step-000006"]
    assert all((tmp_path / name / "model.safetensors").exists()
               for name in ("step-000002", "step-000004", "step-000005"))
