"""train-grpo's checkpoints: an export engines load, fp32 trainer state a next step resumes
from, nothing half-written after a kill, offload that changes where state lives and not what
it is."""

import json
import random

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from stages import train as stage  # noqa: E402
from stages.train import checkpoint  # noqa: E402
from stages.records import Rollout, Turn  # noqa: E402

CFG = stage.Config(lr=1e-2, weight_decay=0.0, micro_batch_tokens=40)


def plays(count=4):
    """Two-turn plays whose second prompt extends the first turn: one sequence each."""
    rng = random.Random(0)
    out = []
    for seed in range(count):
        prompt, turns = [1, 50, 51, 2], []
        for _ in range(2):
            completion = [rng.randrange(10, 1500) for _ in range(4)] + [3]
            turns.append(Turn(action="a", prompt_ids=list(prompt), completion_ids=completion,
                              logprobs=[rng.uniform(-3, -0.5) for _ in completion]))
            prompt = prompt + completion + [1, rng.randrange(10, 1500), 2]
        out.append(Rollout(env_id="env_c", seed=seed, reward=float(seed % 2), turns=turns))
    return out


def exported(step_dir):
    return load_file(str(step_dir / "model.safetensors"))


def same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_step_writes_an_export_and_sharded_trainer_state(tiny_model, tmp_path):
    _, out, _ = stage.run(plays(), tiny_model, str(tmp_path / "ckpt"), CFG)
    assert (out / checkpoint.TRAINER_DIR / ".metadata").exists()
    assert list((out / checkpoint.TRAINER_DIR).glob("*.distcp"))
    config = json.loads((out / "config.json").read_text())
    # on a CPU the policy computes in fp32, and that is what it exports
    assert config["dtype"] == "float32"
    assert {t.dtype for t in exported(out).values()} == {torch.float32}
    assert not list(tmp_path.glob("ckpt/*.tmp"))


def test_the_next_step_resumes_from_the_trainer_state_not_the_export(tiny_model, tmp_path):
    _, first, _ = stage.run(plays(), tiny_model, str(tmp_path / "a"), CFG)
    _, second, _ = stage.run(plays(), str(first), str(tmp_path / "a"), CFG, round=1)
    # the same first step, whose export is then spoilt: the masters still carry the run
    _, spoilt, _ = stage.run(plays(), tiny_model, str(tmp_path / "b"), CFG)
    save_file({k: v + 1.0 for k, v in exported(spoilt).items()},
              str(spoilt / "model.safetensors"), metadata={"format": "pt"})
    _, after, _ = stage.run(plays(), str(spoilt), str(tmp_path / "b"), CFG, round=1)
    assert same(exported(second), exported(after))


def test_a_kill_mid_save_leaves_no_checkpoint_and_the_rerun_writes_the_same(
        tiny_model, tmp_path, monkeypatch):
    _, clean, _ = stage.run(plays(), tiny_model, str(tmp_path / "clean"), CFG)
    real = checkpoint.export_weights

    def killed(*args, **kwargs):  # the trainer state is on disk, the export is not
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "export_weights", killed)
    with pytest.raises(KeyboardInterrupt):
        stage.run(plays(), tiny_model, str(tmp_path / "killed"), CFG)
    assert [p.name for p in (tmp_path / "killed").iterdir()] == ["step-000001.tmp"]
    monkeypatch.setattr(checkpoint, "export_weights", real)
    records, out, info = stage.run(plays(), tiny_model, str(tmp_path / "killed"), CFG)
    assert not info.get("resumed") and records
    assert same(exported(clean), exported(out))
    assert [p.name for p in (tmp_path / "killed").iterdir()] == ["step-000001"]


def test_a_checkpoint_from_before_trainer_state_resumes_with_its_optimizer_state(
        tiny_model, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    _, first, _ = stage.run(plays(), tiny_model, str(tmp_path / "new"), CFG)
    _, second, _ = stage.run(plays(), str(first), str(tmp_path / "new"), CFG, round=1)
    # the old layout: fp32 weights and the optimizer state by name in optimizer.pt
    whole = tmp_path / "whole.pt"
    dcp_to_torch_save(str(first / checkpoint.TRAINER_DIR), str(whole))
    old = tmp_path / "old" / first.name
    old.parent.mkdir()
    old.mkdir()
    for item in first.iterdir():
        if item.is_file():
            (old / item.name).write_bytes(item.read_bytes())
    torch.save(torch.load(whole, weights_only=True)["optimizer"],
               old / checkpoint.LEGACY_OPTIMIZER_FILE)
    _, resumed, _ = stage.run(plays(), str(old), str(tmp_path / "old"), CFG, round=1)
    assert same(exported(second), exported(resumed))


@pytest.mark.parametrize("offload", ["all", "optimizer"])
def test_offload_makes_the_update_the_whole_model_makes(tiny_model, tmp_path, offload):
    """FSDP2's offload of everything, or AdamW's state alone in host memory; either way the
    next round resumes the optimizer state under any other setting, and trains the same."""
    _, whole, _ = stage.run(plays(), tiny_model, str(tmp_path / "whole"), CFG)
    moved = stage.Config(**{**CFG.__dict__, "offload": offload})
    _, offloaded, _ = stage.run(plays(), tiny_model, str(tmp_path / "off"), moved)
    a, b = exported(whole), exported(offloaded)
    assert sorted(a) == sorted(b)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    for first, then, where in ((whole, moved, "a"), (offloaded, CFG, "b")):
        stage.run(plays(), str(first), str(tmp_path / where), then, round=1)
    a, b = (exported(tmp_path / where / "step-000002") for where in ("a", "b"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


LORA = stage.Config(lr=1e-2, weight_decay=0.0, micro_batch_tokens=40, lora_rank=4)


def test_a_kill_mid_save_of_a_lora_step_leaves_no_checkpoint(tiny_model, tmp_path, monkeypatch):
    peft = pytest.importorskip("peft")
    _, clean, _ = stage.run(plays(), tiny_model, str(tmp_path / "clean"), LORA)
    real = peft.PeftModel.save_pretrained

    def killed(*args, **kwargs):  # the adapter's trainer state is on disk, its folder is not
        raise KeyboardInterrupt

    monkeypatch.setattr(peft.PeftModel, "save_pretrained", killed)
    with pytest.raises(KeyboardInterrupt):
        stage.run(plays(), tiny_model, str(tmp_path / "killed"), LORA)
    assert [p.name for p in (tmp_path / "killed").iterdir()] == ["step-000001.tmp"]
    monkeypatch.setattr(peft.PeftModel, "save_pretrained", real)
    _, out, _ = stage.run(plays(), tiny_model, str(tmp_path / "killed"), LORA)
    assert same(load_file(str(clean / "adapter_model.safetensors")),
                load_file(str(out / "adapter_model.safetensors")))


def test_an_adapter_is_a_model_only_while_its_base_exists(tiny_model, tmp_path):
    pytest.importorskip("peft")
    import shutil

    from stages.backends import check_local_model
    from stages.shards import InputMissing

    _, out, _ = stage.run(plays(), tiny_model, str(tmp_path / "ckpt"), LORA)
    assert checkpoint.adapter_base(str(out)) == tiny_model
    assert checkpoint.adapter_base(tiny_model) is None
    check_local_model(str(out))
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    state = json.loads((moved / checkpoint.STATE_FILE).read_text())
    state[checkpoint.BASE_KEY] = str(tmp_path / "gone")
    (moved / checkpoint.STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(InputMissing, match="a LoRA adapter on .*gone"):
        check_local_model(str(moved))


def test_a_recipe_cannot_serve_lora_from_its_server():
    from stages.records import RecordError

    checkpoint.refuse_lora_in_server_mode(False, {"lora-rank": 64}, "r.toml: stage train-grpo")
    checkpoint.refuse_lora_in_server_mode(True, {"lora-rank": 0}, "r.toml: stage train-grpo")
    with pytest.raises(RecordError, match=r"^r.toml: stage train-grpo: lora-rank: .*\[serve\]"):
        checkpoint.refuse_lora_in_server_mode(True, {"lora-rank": 64}, "r.toml: stage train-grpo")
