"""stages/train/loop.py on the tiny model: the update moves probability toward positive
advantage; one sequence per play and micro-batches by tokens give the per-turn path's loss and
gradients; checkpoints load, resume and count steps; a non-finite loss writes nothing; the step
plan; pruning; and the KL anchor across rounds."""

import gc
import json
import math
import os
import re
import weakref

import pytest

torch = pytest.importorskip("torch")

from stages.backends import BackendSpec, Sampling, load_backend  # noqa: E402
from stages.records import Design, Regret, Rollout, Turn  # noqa: E402
from stages.train import loop  # noqa: E402
from stages.train.config import Config  # noqa: E402
from stages.train.policy import Diverged, Policy  # noqa: E402
from stages.train.samples import Sample, build_samples, play_samples  # noqa: E402
from tests.stages.train.common import (env_fault_group, loss_logprobs,  # noqa: E402
                                       multi_turn_play, per_turn)

CFG = Config()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_update_moves_probability_toward_positive_advantage(tiny_model, tmp_path, device):
    """On CUDA the update runs under bf16 autocast (Config.bf16) and must move the same way."""
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    prompt = backend.render([{"role": "user", "content": "pick"}], None)
    good, bad = [70, 71, 72], [80, 81, 82]

    def logp(model_dir, completion):
        policy = Policy(model_dir, CFG)
        return loss_logprobs(policy, [Sample.of_turn("agent", prompt, completion,
                                                     [0.0] * 3, 0.0)]).sum().item()

    rollouts = [Rollout(env_id="env_x", seed=i, reward=r, meta={"temperature": 1.0},
                        turns=[Turn(action="a", prompt_ids=prompt, completion_ids=c,
                                    logprobs=[logp_sampled] * 3)])
                for i, (r, c, logp_sampled) in enumerate([(1.0, good, -6.0), (0.0, bad, -6.0)])]
    # Adam's first step moves every weight by about lr: at 1e-2 the step leaves the linear
    # regime and lifts the shared layers under both completions (bad +0.10 nats with seed 0);
    # at 1e-3 good rises by 1.1-1.3 nats and bad falls by 0.9-1.3 for tiny seeds 0-3.
    cfg = Config(lr=1e-3, batch_size=2, weight_decay=0.0, device=device)
    records, out, info = loop.run(rollouts, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert info["roles"] == {"agent": 2, "designer": 0}
    assert logp(str(out), good) > logp(tiny_model, good)
    assert logp(str(out), bad) < logp(tiny_model, bad)
    stats = records[0].stats
    assert stats["agent_adv_mean"] == 0.0 and stats["agent_adv_max"] == pytest.approx(1.0)
    assert {"loss", "clip_frac", "approx_kl", "entropy", "grad_norm"} <= set(stats)
    assert records[0].meta["tokens_per_s"] > 0


def test_episode_and_per_turn_layouts_give_the_same_logprobs_and_gradients(tiny_model):
    """One sequence per play is only a cheaper way to compute the per-turn path's numbers."""
    plays = [multi_turn_play(seed=s, reward=float(s % 2)) for s in range(4)]
    episodes = [play_samples(p, a, CFG, {})[0] for p, a in zip(plays, [1, -1, 0.5, -0.5])]
    turns = [s for p, a in zip(plays, [1, -1, 0.5, -0.5]) for s in per_turn(p, a)]
    policy = Policy(tiny_model, Config(micro_batch_tokens=64))
    torch.testing.assert_close(loss_logprobs(policy, episodes), loss_logprobs(policy, turns),
                               atol=1e-5, rtol=0)
    policy.optimizer.step = lambda: None  # keep the weights: compare the gradients

    def step(samples):
        record = loop._optimizer_step(policy, samples, list(range(len(samples))),
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
    samples = [play_samples(multi_turn_play(seed=s), a, CFG, {})[0]
               for s, a in enumerate([1.0, -1.0, 0.3])]

    def grads(budget):
        policy = Policy(tiny_model, Config(micro_batch_tokens=budget))
        policy.optimizer.step = lambda: None
        loop._optimizer_step(policy, samples, [0, 1, 2], [None] * 3, policy.cfg, 1)
        return {n: p.grad for n, p in policy.model.named_parameters()}

    one, several = grads(10_000), grads(1)  # one pass, or one sequence a pass
    for name, grad in one.items():
        torch.testing.assert_close(grad, several[name], atol=1e-6, rtol=1e-4)


def test_a_template_that_rewrites_history_falls_back_to_turns_and_is_counted(tiny_model,
                                                                             tmp_path):
    plays = [multi_turn_play(seed=0, rewrite_history=True, reward=1.0),
             multi_turn_play(seed=1, reward=0.0)]
    samples, _ = build_samples(plays, CFG)
    assert [(s.source, s.per_turn) for s in samples] == \
        [(plays[0].id, True)] * 3 + [(plays[1].id, False)]
    records, _, info = loop.run(plays, tiny_model, str(tmp_path / "ckpt"), CFG)
    assert info["per_turn_fallbacks"] == 1
    stats = records[0].stats
    assert stats["per_turn_fallbacks"] == 1.0 and stats["padding_share"] == 0.0
    assert stats["loss_tokens"] == sum(len(t.completion_ids) for p in plays for t in p.turns)
    assert stats["forward_tokens"] == sum(len(s.ids) for s in samples)
    assert records[0].meta["peak_memory_bytes"] > 0


def test_checkpoint_loads_resumes_and_counts_steps(tiny_model, tmp_path):
    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    plays = [Rollout(env_id="env_x", seed=i, reward=float(i % 2),
                     turns=[Turn(action="a", prompt_ids=c.prompt_ids, completion_ids=c.completion_ids,
                                 logprobs=c.logprobs)])
             for i, c in enumerate(backend.chat([[{"role": "user", "content": "go"}]] * 4,
                                                Sampling(max_tokens=6, seed=0)))]
    cfg = Config(lr=1e-3, batch_size=2)
    records, out, _ = loop.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert out.name == "step-000002" and [r.step for r in records] == [1, 2]
    state = json.loads((out / loop.STATE_FILE).read_text())
    assert state["step"] == 2 and (out / "trainer" / ".metadata").exists()
    reloaded = load_backend(BackendSpec(name="hf", model=str(out)))
    assert reloaded.chat([[{"role": "user", "content": "go"}]], Sampling(max_tokens=2, seed=0))
    again, same_out, info = loop.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    assert info.get("resumed") and same_out == out
    assert [r.stats for r in again] == [r.stats for r in records]
    next_records, next_out, _ = loop.run(plays, str(out), str(tmp_path / "ckpt"), cfg)
    assert next_out.name == "step-000004" and next_records[0].step == 3


def test_a_crashed_play_trains_end_to_end(tiny_model, tmp_path):
    plays, broken = env_fault_group()
    records, out, info = loop.run(plays + [broken], tiny_model, str(tmp_path / "ckpt"),
                                  Config(lr=1e-3, weight_decay=0.0))
    assert info["roles"]["agent"] == 4 and info["skipped"] == {} and out is not None
    assert broken.id in records[0].parents
    assert records[0].stats["agent_adv_min"] == pytest.approx(
        min(build_samples([*plays, broken], CFG)[0], key=lambda s: s.advantage).advantage)
    assert all(math.isfinite(v) for v in records[0].stats.values())


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
        loop.run(records, "no-model-needed", str(tmp_path / "ckpt"), CFG)
    assert not (tmp_path / "ckpt").exists()


def test_a_non_finite_loss_stops_the_update_and_writes_no_checkpoint(tiny_model, tmp_path,
                                                                     monkeypatch):
    models = []
    load = Policy.__init__

    def watched(policy, *args, **kwargs):
        load(policy, *args, **kwargs)
        models.append(weakref.ref(policy.model))

    monkeypatch.setattr(Policy, "__init__", watched)
    design = Design(completion="x", prompt_ids=[5, 6], completion_ids=[7, 8],
                    logprobs=[-1.0, -1.0])
    regret = Regret(env_id="env_a", design_id=design.id, designer_advantage=1e300)  # inf in fp32
    cfg = Config(batch_size=1)
    with pytest.raises(Diverged, match="step 1: loss .*not finite, so no checkpoint") \
            as raised:
        loop.run([design, regret], tiny_model, str(tmp_path / "ckpt"), cfg)
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())
    # the model is let go although the error's traceback keeps the trainer's frame: on a GPU
    # its memory is free for whatever runs next
    gc.collect()
    assert raised.traceback and len(models) == 1 and models[0]() is None


def test_one_step_per_round_over_whole_episodes_by_default():
    """The reference: one optimizer step per round; an episode's turns never split."""
    samples = [Sample.of_turn("agent", [1], [2], [0.0], 0.0, source=f"play_{i // 3}")
               for i in range(30)]  # 10 plays of 3 turns
    (only,) = loop.plan_steps(samples, Config(), seed=0)
    assert sorted(only) == list(range(30))
    steps = loop.plan_steps(samples, Config(batch_size=4), seed=0)
    assert [len(step) for step in steps] == [12, 12, 6]
    for step in steps:  # every turn of a play that is in the step
        assert all(i // 3 * 3 + k in step for i in step for k in range(3))
    turns = loop.plan_steps(samples, Config(batch_size=4, batch_unit="turn"), seed=0)
    assert [len(step) for step in turns] == [4] * 7 + [2]


def test_plan_steps_epochs_and_units():
    samples = [Sample.of_turn("agent", [1], [2], [0.0], 0.0, source=f"p{i // 2}")
               for i in range(6)]
    steps = loop.plan_steps(samples, Config(epochs=2), seed=1)
    assert len(steps) == 2 and all(sorted(s) == list(range(6)) for s in steps)
    steps = loop.plan_steps(samples, Config(batch_size=1), seed=1)
    assert sorted(map(sorted, steps)) == [[0, 1], [2, 3], [4, 5]]
    assert loop.plan_steps(samples, Config(batch_size=1), seed=1) == steps  # seeded
    with pytest.raises(ValueError, match="batch_unit must be one of episode, turn"):
        loop.plan_steps(samples, Config(batch_unit="token"), seed=0)


def test_the_step_plan_is_a_function_of_the_seed():
    samples = [Sample.of_turn("agent", [1], [2], [0.0], 0.0, source=f"p{i}")
               for i in range(20)]
    cfg = Config(batch_size=1)
    assert loop.plan_steps(samples, cfg, seed=5) == loop.plan_steps(samples, cfg, seed=5)
    assert loop.plan_steps(samples, cfg, seed=5) != loop.plan_steps(samples, cfg, seed=6)


def test_prune_keeps_the_newest_the_parent_and_marked_checkpoints(tmp_path):
    for step in range(1, 7):
        folder = tmp_path / f"step-{step:06d}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"w")
        (folder / "trainer").mkdir()
        (folder / "trainer" / ".metadata").write_bytes(b"o")
    (tmp_path / "step-000002" / loop.KEEP_FILE).write_text("eval: runs/x/r01/eval-rg-hard\n")
    deleted = loop.prune_checkpoints(str(tmp_path), 2, protect=[str(tmp_path / "step-000004")])
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
        cfg = Config(lr=1e-2, kl_beta=kl_beta, weight_decay=0.0)
        _, first, _ = loop.run(plays, tiny_model, root, cfg)
        _, second, _ = loop.run(plays, str(first), root, cfg, round=1)
        return first, second

    (off_1, off_2), (on_1, on_2) = two_rounds(0.0), two_rounds(1.0)
    weights = {path: load_file(str(path / "model.safetensors"))
               for path in (off_1, off_2, on_1, on_2)}
    # round 1 starts at the anchor: the KL term and its gradient are exactly zero
    assert all(torch.equal(weights[off_1][k], weights[on_1][k]) for k in weights[off_1])
    assert any(not torch.equal(weights[off_2][k], weights[on_2][k]) for k in weights[off_2])
    state = json.loads((on_2 / loop.STATE_FILE).read_text())
    assert state["kl_anchor"] == state["start_model"] == os.path.normpath(tiny_model)
    assert state["parent"] == os.path.normpath(on_1)
