"""stages/train/policy.py: LoRA adapters and their AdamW state carry over from round to round
and are served unmerged, a LoRA run's KL anchor is its base with the adapter off, the auto LoRA
targets of an MoE model, and no checkpoint with a non-finite weight."""

import json
import os

import pytest

torch = pytest.importorskip("torch")

from stages.backends import BackendSpec, Sampling, load_backend  # noqa: E402
from stages.records import Rollout, Turn  # noqa: E402
from stages.train import loop  # noqa: E402
from stages.train.config import Config  # noqa: E402
from stages.train.policy import (Diverged, Policy, lora_targets,  # noqa: E402
                                 parameter_counts, wraps_experts)
from stages.train.samples import build_samples  # noqa: E402
from tests.stages.train.common import loss_logprobs  # noqa: E402

CFG = Config()


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
    cfg = Config(lr=1e-2, weight_decay=0.0, lora_rank=4)
    root = str(tmp_path / "ckpt")
    first_records, first, info = loop.run(plays, tiny_model, root, cfg)
    assert first_records[0].stats["grad_norm"] > 0
    # an adapter folder on the start model: no weights of a model of its own
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer",
            loop.STATE_FILE} <= {p.name for p in first.iterdir()}
    assert not (first / "model.safetensors").exists() and not (first / "config.json").exists()
    adapter = adapter_weights(first)
    assert info["trainable_parameters"] == sum(t.numel() for t in adapter.values())
    assert 0 < info["trainable_parameters"] < info["parameters"]
    assert not any("lm_head" in k or "embed" in k for k in adapter)

    # round 2 starts from round 1's adapter and AdamW state (one step taken)
    import peft

    resumed = Policy(str(first), cfg)
    assert same_tensors(peft.get_peft_model_state_dict(resumed.model), adapter)
    steps = {float(s["step"]) for s in resumed.optimizer.state.values()}
    assert steps == {1.0} and len(resumed.optimizer.state) == len(adapter)
    resumed.close()
    _, second, _ = loop.run(plays, str(first), root, cfg, round=1)
    state = json.loads((second / loop.STATE_FILE).read_text())
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
    cfg = Config(lr=1e-2, weight_decay=0.0, lora_rank=4, kl_beta=1.0)
    _, first, _ = loop.run(plays, tiny_model, str(tmp_path / "ckpt"), cfg)
    samples, _ = build_samples(plays, cfg)
    policy = Policy(str(first), cfg, anchor=loop.start_model(str(first)))
    assert policy.anchor is policy.model  # no second copy of the base
    with torch.no_grad():
        anchored = policy.anchor_logprobs(policy.pack(samples))
    base = loss_logprobs(Policy(tiny_model, CFG), samples)
    assert torch.allclose(anchored, base, atol=1e-6)
    assert not torch.allclose(loss_logprobs(policy, samples), base, atol=1e-3)


def same_tensors(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_small_lora_update_changes_the_adapter_and_never_the_base(tiny_model, tmp_path):
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    backend = load_backend(BackendSpec(name="hf", model=tiny_model))
    before = load_file(os.path.join(tiny_model, "model.safetensors"))
    cfg = Config(lr=1e-6, lora_rank=4)  # the paper recipes' lr
    _, out, _ = loop.run(lora_plays(backend), tiny_model, str(tmp_path / "ckpt"), cfg)
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
    targets = lora_targets(torch, model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=targets))
    adapted = {name.split(".lora_")[0].removeprefix("base_model.model.")
               for name, p in wrapped.named_parameters() if p.requires_grad}
    # no experts, no mlp.gate (the router), no lm_head; and no MLP projection at all, since
    # peft would read layer 1's gate_proj/up_proj/down_proj as the experts' fused weights
    assert adapted == {f"model.layers.{i}.self_attn.{m}_proj" for i in (0, 1) for m in "qkvo"}
    assert not wraps_experts(wrapped)
    everything = peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(config),
                                     peft.LoraConfig(r=2, target_modules="all-linear"))
    assert wraps_experts(everything)  # what peft's own "all-linear" does
    dense = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    assert lora_targets(torch, dense) == sorted(
        f"{m}_proj" for m in ("q", "k", "v", "o", "gate", "up", "down"))
    assert parameter_counts(wrapped)[0] == sum(
        p.numel() for n, p in wrapped.named_parameters() if "lora_" in n)
    assert lora_targets(torch, model, "q_proj, v_proj") == ["q_proj", "v_proj"]


def test_a_checkpoint_with_a_non_finite_weight_is_never_saved(tiny_model, tmp_path):
    policy = Policy(tiny_model, CFG)
    with torch.no_grad():
        next(policy.model.parameters())[0].fill_(float("nan"))
    with pytest.raises(Diverged, match="is not finite after the update"):
        policy.save(tmp_path / "step-000001", {"step": 1})
    assert list(tmp_path.iterdir()) == []
