"""stages/train/plan.py: the memory plan's arithmetic, the paper recipes on 8x H100-80GB, and the
plan against a measured peak on the CPU."""

import dataclasses
import json
from pathlib import Path

import pytest

from stages.train import plan

GiB = plan.GiB
REPO = Path(__file__).resolve().parents[3]
# what nvidia-smi reports of an H100-80GB (81,559 MiB) and an H200 (143,771 MiB); 512 GiB of
# host memory, what the 30B recipes say they need (a DGX H100 node has 2 TiB)
H100 = plan.Box(8, int(79.6 * GiB), 512 * GiB)
H200 = plan.Box(8, int(140.4 * GiB), 512 * GiB)


def test_the_paper_models_have_their_published_sizes():
    assert round(plan.QWEN3_4B.params / 1e9, 2) == 4.02
    assert round(plan.QWEN3_8B.params / 1e9, 2) == 8.19
    moe = plan.QWEN3_30B
    assert round(moe.params / 1e9, 2) == 30.53
    active = moe.params - moe.layers * moe.expert_params * (1 - moe.experts_per_token /
                                                            moe.experts)
    assert round(active / 1e9, 2) == 3.35
    assert plan.QWEN3_4B.kv_bytes_per_token() == 144 * 1024
    assert plan.QWEN3_30B.kv_bytes_per_token() == 96 * 1024
    # 4 KV heads over 8 GPUs: vLLM replicates them, each GPU holds one
    assert plan.QWEN3_30B.kv_bytes_per_token(8) == 96 * 1024 // 4


def test_a_model_directory_is_read_else_its_name_is_known(tmp_path, tiny_model):
    import torch  # noqa: F401  (tiny_model needs it)
    from transformers import AutoModelForCausalLM

    shape = plan.model_shape(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.source.endswith("config.json")
    named = plan.model_shape("/models/Qwen3-8B")
    assert named.params == plan.QWEN3_8B.params and "has no config.json" in named.source
    later = plan.model_shape("runs/qwen3-4b-games/ckpt/step-000200")
    assert later.params == plan.QWEN3_4B.params and "'qwen3-4b' in its name" in later.source
    with pytest.raises(plan.PlanError, match="no config.json"):
        plan.model_shape(str(tmp_path / "my-model"))


def test_full_fine_tuning_holds_16_bytes_a_parameter_sharded_over_the_ranks():
    shape, p = plan.QWEN3_4B, plan.QWEN3_4B.params
    one = plan.train_memory(shape, plan.Trainer(nproc=1))
    assert (one.detail["master"], one.grads, one.optimizer) == (4 * p, 4 * p, 8 * p)
    eight = plan.train_memory(shape, plan.Trainer(nproc=8))
    assert (eight.detail["master"], eight.grads, eight.optimizer) == \
        (4 * p // 8, 4 * p // 8, 8 * p // 8)
    # FSDP2 gathers the root (tied embeddings and head) and two blocks in bf16
    assert eight.detail["gathered"] == 2 * (shape.root_params + 2 * shape.block_params)
    offloaded = plan.train_memory(shape, plan.Trainer(nproc=8, offload="all"))
    assert (offloaded.detail["master"], offloaded.grads, offloaded.optimizer) == (0, 0, 0)
    assert offloaded.host == 16 * p // 8
    assert offloaded.peak < eight.peak - 16 * p // 8 + GiB
    # the reference's optimizer offload: AdamW's moments (and its step) off the GPUs only
    moments = plan.train_memory(shape, plan.Trainer(nproc=8, offload="optimizer"))
    assert (moments.detail["master"], moments.grads, moments.optimizer) == \
        (4 * p // 8, 4 * p // 8, 0)
    assert moments.host == 8 * p // 8
    assert eight.peak - 9 * p // 8 < moments.peak < eight.peak - 7 * p // 8


def test_lora_keeps_a_bf16_base_and_trains_fp32_adapters():
    shape = plan.tiny_shape(hidden=64, layers=2)  # q 64->64, k and v 64->32, MLP 64<->192
    rank = 4
    per_layer = rank * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 192) + (192 + 64))
    assert shape.lora_params(rank) == 2 * per_layer
    m = plan.train_memory(shape, plan.Trainer(lora_rank=rank))
    assert m.detail["base"] == 2 * shape.params
    assert (m.grads, m.optimizer) == (4 * 2 * per_layer, 8 * 2 * per_layer)
    # experts and the router are not adapted: attention only on a MoE model
    moe = plan.QWEN3_30B
    assert moe.lora_params(64) == moe.layers * 64 * (
        (2048 + 4096) + 2 * (2048 + 512) + (4096 + 2048))


def test_the_kl_anchor_is_bf16_and_sharded_like_the_policy():
    shape = plan.QWEN3_8B
    m = plan.train_memory(shape, plan.Trainer(nproc=8, kl_beta=0.005))
    assert m.detail["anchor"] == 2 * shape.params // 8
    assert plan.train_memory(shape, plan.Trainer(nproc=8)).detail.get("anchor") is None


def test_logits_are_one_chunk_of_the_head_whatever_the_sequence_length():
    from stages.train import packing

    assert plan.LOGIT_ELEMENTS == packing.LOGIT_ELEMENTS
    shape = plan.QWEN3_4B
    chunk = packing.LOGIT_ELEMENTS // shape.vocab  # 220 positions of 151,936
    assert plan.logits_bytes(shape, 32768) == plan.logits_bytes(shape, chunk) == \
        chunk * shape.vocab * 8
    assert plan.logits_bytes(shape, 10) == 10 * shape.vocab * 8


def test_activations_grow_with_the_context_and_checkpointing_keeps_layer_inputs_only():
    shape = plan.QWEN3_4B
    short = plan.train_memory(shape, plan.Trainer(nproc=8, gradient_checkpointing=True,
                                                  micro_batch_tokens=8192, context_length=8192))
    long = plan.train_memory(shape, plan.Trainer(nproc=8, gradient_checkpointing=True,
                                                 micro_batch_tokens=8192, context_length=32768))
    full = plan.train_memory(shape, plan.Trainer(nproc=8, gradient_checkpointing=False,
                                                 micro_batch_tokens=8192, context_length=8192))
    assert long.activations > 3 * short.activations
    assert full.activations > 10 * short.activations
    # checkpointed: every layer's bf16 input is in it, 2 bytes x hidden a token a layer
    assert short.activations > shape.layers * 8192 * shape.hidden * 2


def test_the_trainer_plans_from_train_grpos_own_defaults():
    from stages.train import Config

    cfg, t = Config(), plan.Trainer()
    assert (t.micro_batch_tokens, t.gradient_checkpointing, t.lora_rank, t.kl_beta) == \
        (cfg.micro_batch_tokens, cfg.gradient_checkpointing, cfg.lora_rank, cfg.kl_beta)
    assert t.offload == cfg.offload == "none"


def test_an_engine_splits_its_weights_over_tensor_and_expert_parallel_gpus():
    dense = plan.engine_memory(plan.QWEN3_4B, plan.Engine(data_parallel=8), 80 * GiB)
    assert dense.weights == 2 * plan.QWEN3_4B.params
    assert dense.peak == int(0.9 * 80 * GiB)
    assert dense.kv_cache == dense.peak - dense.weights - plan.ENGINE_WORKSPACE
    assert dense.detail["sequences"] == dense.kv_cache // (32768 * 144 * 1024)
    moe = plan.QWEN3_30B
    tp = plan.engine_memory(moe, plan.Engine(tensor_parallel=8), 80 * GiB)
    ep = plan.engine_memory(moe, plan.Engine(data_parallel=2, tensor_parallel=4,
                                             expert_parallel=True), 80 * GiB)
    assert tp.weights == 2 * (moe.params // 8)
    experts = moe.layers * moe.expert_params
    assert ep.weights == 2 * ((moe.params - experts) // 4 + experts // 8)
    # one GPU: the 30B model's bf16 weights leave room for a couple of 32k sequences only
    alone = plan.engine_memory(moe, plan.Engine(utilization=0.85), int(79.6 * GiB))
    assert alone.detail["sequences"] < 4


@dataclasses.dataclass
class Serve:  # a recipe's [serve] table, as spade_cli/recipe.py reads it
    data_parallel: int = 1
    tensor_parallel: int = 1
    expert_parallel: bool = False
    sleep: bool | None = None
    args: tuple = ()


def test_a_stage_that_does_not_fit_is_the_first_misfit_and_says_what_dominates():
    stages = [("rollout", "rollout", {}), ("train-grpo", "train-grpo",
                                           {"nproc": 1, "gradient-checkpointing": True})]
    defaults = {"backend": "vllm", "context-length": 32768}
    rows = plan.stage_rows(plan.QWEN3_8B, stages, defaults, None, H100)
    misfit = plan.first_misfit(rows)
    assert misfit.stage == "train-grpo" and not rows[0].memory is None
    assert misfit.problem.startswith("needs ") and "optimizer state" in misfit.problem
    rows = plan.stage_rows(plan.QWEN3_8B, stages[:1] + [
        ("train-grpo", "train-grpo", {"nproc": 8, "gradient-checkpointing": True})],
        defaults, Serve(data_parallel=8), H100)
    assert plan.first_misfit(rows) is None
    assert [r.gpus for r in rows] == [8, 8]
    # an engine that stays awake leaves the trainer only what vLLM did not take
    awake = plan.stage_rows(plan.QWEN3_8B, stages[1:], defaults,
                            Serve(data_parallel=8, sleep=False), H100)
    assert "awake" in awake[0].note and not awake[0].fits
    # more GPUs than the box has
    small = plan.stage_rows(plan.QWEN3_8B, stages, defaults, Serve(data_parallel=8),
                            plan.Box(4, 80 * GiB))
    assert plan.first_misfit(small).problem == "needs 8 GPUs, the box has 4"


def test_a_local_designer_is_planned_by_its_own_shape_and_a_remote_one_not_at_all(tmp_path):
    """A separate designer answers design, hint and audit: rollout keeps the run's model."""
    from types import SimpleNamespace

    stages = [(c, c, {}) for c in ("design", "audit", "hint", "rollout")]
    defaults = {"backend": "vllm", "context-length": 32768}
    local = SimpleNamespace(backend="vllm", model="/models/Qwen3-8B")
    rows = plan.stage_rows(plan.QWEN3_4B, stages, defaults, None, H100, local)
    for row in rows[:3]:
        assert row.memory.weights == 2 * plan.QWEN3_8B.params
        assert row.note.startswith("designer /models/Qwen3-8B, own engine")
    assert rows[3].memory.weights == 2 * plan.QWEN3_4B.params
    # a 30B designer (61 GB of bf16 weights) on a 40 GB GPU does not fit, where the run's
    # 4B model would
    big = SimpleNamespace(backend="hf", model="/models/Qwen3-30B-A3B")
    small = plan.Box(1, 40 * GiB)
    assert plan.first_misfit(plan.stage_rows(plan.QWEN3_4B, stages, defaults, None, small,
                                             big)).stage == "design"
    assert plan.first_misfit(plan.stage_rows(plan.QWEN3_4B, stages, defaults, None, small,
                                             None)) is None
    remote = SimpleNamespace(backend="openai", model="big-designer")
    rows = plan.stage_rows(plan.QWEN3_4B, stages, defaults, None, H100, remote)
    assert [row.memory for row in rows[:3]] == [None] * 3 and rows[3].memory is not None
    assert rows[0].note == "designer big-designer on its server: not counted"
    unknown = SimpleNamespace(backend="hf", model=str(tmp_path / "my-designer"))
    assert "not counted (its shape is unknown)" in plan.stage_rows(
        plan.QWEN3_4B, stages, defaults, None, H100, unknown)[0].note
    served = plan.stage_rows(plan.QWEN3_4B, stages, defaults, Serve(data_parallel=8), H100,
                             local)
    assert "not counted (beside the run's awake server)" in served[0].note
    assert served[3].note.startswith("server")


def test_auto_offload_is_the_least_that_fits_the_gpu():
    shape = plan.QWEN3_30B
    trainer = plan.Trainer(nproc=8, micro_batch_tokens=8192, context_length=32768,
                           gradient_checkpointing=True, kl_beta=0.005)
    assert plan.least_offload(shape, trainer, int(140 * GiB)) == "none"
    assert plan.least_offload(shape, trainer, int(76 * GiB)) == "optimizer"
    assert plan.least_offload(shape, trainer, int(40 * GiB)) == "all"
    assert plan.least_offload(shape, trainer, int(10 * GiB)) == "all"  # the least there is


def test_a_node_without_the_host_memory_for_the_trainer_is_a_misfit():
    stages = [("train-grpo", "train-grpo", {"nproc": 8, "gradient-checkpointing": True,
                                            "offload": "all", "kl-beta": 0.005})]
    defaults = {"context-length": 32768, "micro-batch-tokens": 8192}
    rows = plan.stage_rows(plan.QWEN3_30B, stages, defaults, Serve(tensor_parallel=8),
                           dataclasses.replace(H100, host_memory=400 * GiB))
    misfit = plan.first_misfit(rows)
    assert misfit.stage == "train-grpo" and "GiB of host memory on the node, it has 400 GiB" \
        in misfit.problem
    # every rank holds its offloaded shards (16 B a parameter, 2 more for the anchor), a
    # resident trainer a kept copy beside them as it refills
    n, p = 8, plan.QWEN3_30B.params
    assert rows[0].memory.host == 18 * p // n
    assert rows[0].host > 8 * 18 * p // n + 2 * p
    unchecked = plan.stage_rows(plan.QWEN3_30B, stages, defaults, Serve(tensor_parallel=8),
                                dataclasses.replace(H100, host_memory=None))
    assert plan.first_misfit(unchecked) is None


def test_the_30b_recipes_offload_the_optimizer_on_h100_and_nothing_on_h200(monkeypatch):
    from spade_cli import recipe as recipes
    from spade_cli.run import recipe_plan

    monkeypatch.chdir(REPO)
    for path in sorted((REPO / "recipes").glob("qwen3-30b-a3b-*.toml")):
        for box, offload in ((H100, "optimizer"), (H200, "none")):
            rows, _ = recipe_plan(recipes.load(str(path)), box)
            train = next(r for r in rows if r.stage == "train-grpo")
            assert f"offload {offload} (auto)" in train.note and train.fits, path.name
            assert train.host <= 512 * GiB


def test_the_one_gpu_recipe_fits_one_80gb_gpu_with_the_optimizer_in_host_memory(monkeypatch):
    from spade_cli import recipe as recipes
    from spade_cli.run import recipe_plan

    monkeypatch.chdir(REPO)
    one = plan.Box(1, int(79.6 * GiB), 64 * GiB)
    rows, _ = recipe_plan(recipes.load("recipes/one-gpu-qwen3-4b-games.toml"), one)
    assert plan.first_misfit(rows) is None
    train = next(r for r in rows if r.stage == "train-grpo")
    assert train.gpus == 1 and "offload optimizer (auto)" in train.note


def test_the_servers_memory_utilization_is_read_from_its_arguments():
    assert plan.utilization_of(["--gpu-memory-utilization", "0.7"]) == 0.7
    assert plan.utilization_of(["--gpu-memory-utilization=0.8"]) == 0.8
    assert plan.utilization_of([]) == plan.SERVER_UTILIZATION


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO))
                                        for p in (REPO / "recipes").glob("qwen3-*.toml")))
def test_every_paper_recipe_fits_8_h100_80gb(path, monkeypatch):
    from spade_cli import recipe as recipes
    from spade_cli.run import recipe_plan

    monkeypatch.chdir(REPO)
    rows, _ = recipe_plan(recipes.load(path), H100)
    misfit = plan.first_misfit(rows)
    assert misfit is None, f"{path}: {misfit.stage} {misfit.problem}"
    train = next(r for r in rows if r.stage == "train-grpo")
    assert train.gpus == 8  # the trainer uses the whole box, as the engine does
    assert all(r.gpus == 8 for r in rows if r.memory is not None and
               r.memory.phase == "serving")


@pytest.mark.slow
def test_the_plan_is_within_20_percent_of_the_measured_cpu_peak(tiny_model):
    """train-grpo's real step on the tiny model, packed micro-batches with gradient
    checkpointing (logits and the [T, T] mask dominate), in a fresh process."""
    from benchmarks import plan as bench

    case = bench.Case("tiny", 4096, True, sequences=4)
    result = bench.measure_in_child(case, tiny_model, timeout=600)
    ratio = result["predicted"] / result["measured"]
    assert 0.8 <= ratio <= 1.2, json.dumps(result)
