"""The model being trained on this rank: loaded whole or as FSDP2 shards, its optimizer, LoRA,
where its state lives (offload), log p of packed samples, and the checkpoint it writes.

In: a model directory (an HF model, or a train-grpo checkpoint: whole, or a LoRA adapter folder
on its base), a Config, this rank's layout (stages/train/parallel.py), the KL anchor's directory,
and optionally a resident trainer's host copy of both states (stages/train/ranks.py).
Out: `Policy`: `.model` and `.optimizer` (this rank's shards), `.logprobs` of the loss tokens of
a packed micro-batch (stages/train/packing.py), `.anchor_logprobs`, `.save` (in the format of
stages/train/checkpoint.py), `.host_state`, `.close`.
Guarantees:
- LoRA (`lora_rank`): one adapter on the frozen start model, carried with its AdamW state from
  round to round and never merged (a LoRA checkpoint is the adapter folder:
  stages/train/checkpoint.py); `lora_targets` "auto" leaves MoE experts, routers and the head
  alone; a LoRA checkpoint trains on only as LoRA of its own rank;
- `offload` "auto" is the least the memory plan (stages/train/plan.py) says fits the free memory
  of the fullest GPU of the ranks for the round's longest sequence; "optimizer" keeps AdamW in
  host memory (stages/train/offload.py, imported with torch only then);
- the KL anchor computes in the policy's dtype, sharded as the policy is; a LoRA run anchored to
  its base uses the policy itself with its adapter switched off, no second copy;
- a model whose head transforms its logits (soft-capping, a logit scale) is refused: its log p
  would be wrong;
- no checkpoint holds a non-finite weight: `save` checks every rank's weights first and raises
  Diverged (exit 65) before anything is written.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from pathlib import Path

from stages.train import checkpoint, parallel, plan
from stages.train.config import Config
from stages.train.packing import Packed, loss_logprobs, pack
from stages.train.samples import Sample


class Diverged(ArithmeticError):
    """The update made a non-finite loss, gradient norm or weight; no checkpoint was written."""


class Policy:
    """The model being trained, its optimizer, and log p of packed samples, on one rank of
    `layout` (stages/train/parallel.py: the whole model on one process, or FSDP2 shards); how it is
    read and written is stages/train/checkpoint.py."""

    def __init__(self, model_dir: str, cfg: Config, anchor: str | None = None,
                 layout: parallel.Layout = parallel.Layout(), kept: dict | None = None,
                 kept_anchor: dict | None = None, offload: str | None = None,
                 longest: int = 0):
        """`offload`: the setting `cfg.offload` stands for, decided already (a resident
        trainer's kept state has its layout); `longest`: the round's longest sequence, which
        "auto" plans for."""
        from stages.backends.hf import import_torch_transformers, pick_device

        from stages.backends import check_local_model

        torch, transformers = import_torch_transformers()
        check_local_model(model_dir)
        self.torch, self.transformers, self.cfg, self.layout = torch, transformers, cfg, layout
        if cfg.lora_rank and (layout.sharded or cfg.offload in ("optimizer", "all")):
            raise NotImplementedError("LoRA trains on one rank, without offload: drop --nproc "
                                      "and --offload")
        began = time.monotonic()
        self.device = parallel.start(torch, layout, pick_device(cfg.device))
        self.offload = offload or choose_offload(torch, model_dir, cfg, layout, self.device,
                                                 longest)
        self.fsdp = layout.sharded or self.offload == "all"
        if self.fsdp:  # one rank that offloads it all: FSDP2 in a group of its own
            parallel.start(torch, layout, self.device, fsdp=True)
        self.seconds = {"rendezvous": time.monotonic() - began}
        self.autocast = self.device.startswith("cuda") and cfg.bf16 and \
            torch.cuda.is_bf16_supported()
        # the export engines load: the dtype the policy computes in
        self.export_dtype = torch.bfloat16 if self.autocast else torch.float32
        torch.manual_seed(cfg.seed)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        # fp32 master weights, except a LoRA run on CUDA: the frozen base can stay in bf16
        base_dtype = torch.bfloat16 if cfg.lora_rank and self.autocast else torch.float32
        # a LoRA run's adapters sit on this base, whichever round it is
        self.base = checkpoint.adapter_base(model_dir) or os.path.normpath(model_dir)
        self.model, self.optimizer = self._load(model_dir, base_dtype, trainable=True, kept=kept)
        self.check_head()
        self.trainable, self.parameters = parameter_counts(self.model)
        self.seconds["load"] = time.monotonic() - began - self.seconds["rendezvous"]
        self.anchor = None
        if cfg.kl_beta > 0 and cfg.lora_rank and \
                os.path.normpath(anchor or model_dir) == self.base:
            self.anchor = self.model  # the base is the policy with its adapter switched off
        elif cfg.kl_beta > 0:
            # bf16 where the policy computes in bf16 anyway (autocast): the same numbers in
            # half the memory of fp32
            check_local_model(anchor or model_dir)
            self.anchor, _ = self._load(anchor or model_dir, self.export_dtype, trainable=False,
                                        kept=kept_anchor)
            self.anchor.eval()

    def _load(self, model_dir: str, dtype, trainable: bool, kept: dict | None = None):
        """The model of `model_dir` on this rank, whole or sharded, filled (from `kept`, a
        resident trainer's host copy of it, if given); when `trainable`,
        with its optimizer. A LoRA checkpoint is its base with its adapter on; a LoRA run
        trains an adapter (that checkpoint's, with its AdamW state, or a new one) on a frozen
        base, never merged into it."""
        torch, cfg = self.torch, self.cfg
        lora = bool(trainable and cfg.lora_rank)
        base = checkpoint.adapter_base(model_dir)
        if trainable:
            check_start(model_dir, cfg)
        model, buffers = checkpoint.skeleton(torch, self.transformers, base or model_dir, dtype)
        model.config.use_cache = False
        model.requires_grad_(trainable and not lora)
        if trainable and cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if lora:  # the frozen embeddings' output must carry a gradient into the blocks
                model.enable_input_require_grads()
        model.loss_logprobs = functools.partial(loss_logprobs, torch, model)
        if self.fsdp:
            parallel.shard(torch, model, self.autocast, self.offload == "all")
        checkpoint.materialize(model, buffers, "cpu" if self.offload == "all" else self.device,
                               self.device)
        optimizer = self._optimizer(model) if trainable and not lora else None
        checkpoint.fill(torch, self.transformers, model, optimizer, base or model_dir,
                        self.layout, trainer_state=trainable and not lora, kept=kept)
        if lora or base:
            model = self._with_adapters(model, model_dir if base else None, trainable)
            model.to(self.device)
        if lora:
            optimizer = self._optimizer(model)
            if base:  # the run's adapter carries on with its fp32 weights and AdamW state
                checkpoint.fill(torch, self.transformers, model, optimizer, model_dir,
                                self.layout)
        return model, optimizer

    def _optimizer(self, model):
        trained = [p for p in model.parameters() if p.requires_grad]
        if self.offload == "optimizer":
            from stages.train.offload import HostAdamW

            return HostAdamW(trained, lr=self.cfg.lr, betas=self.cfg.betas,
                             weight_decay=self.cfg.weight_decay)
        return self.torch.optim.AdamW(trained, lr=self.cfg.lr, betas=self.cfg.betas,
                                      weight_decay=self.cfg.weight_decay)

    def _with_adapters(self, model, adapter_dir: str | None, trainable: bool):
        """`model` with the adapter of `adapter_dir` on it, or (None) with new adapters of
        cfg's rank on `cfg.lora_targets`."""
        try:
            import peft
        except ImportError:
            from stages.backends import BackendUnavailable

            raise BackendUnavailable("LoRA needs peft: pip install peft") from None
        # peft puts its layers into `model` itself: its loss_logprobs runs through them
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                FutureWarning)  # what peft 0.21 asks transformers 5
        if adapter_dir is None:
            model = peft.get_peft_model(model, peft.LoraConfig(
                r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, task_type="CAUSAL_LM",
                target_modules=lora_targets(self.torch, model, self.cfg.lora_targets)))
            if self.cfg.lora_targets == "auto" and wraps_experts(model):
                raise RuntimeError("peft put LoRA on MoE experts or a router although "
                                   "--lora-targets auto leaves them out: name the modules")
            return model
        return peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=trainable)

    def check_head(self) -> None:
        """loss_logprobs applies the output head to the decoder's last hidden state, which is
        what the model's own forward does for every model without a logit transform."""
        config = self.model.config
        for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
            if getattr(config, name, None) not in (None, 1, 1.0):
                raise NotImplementedError(f"train-grpo does not apply {config.model_type}'s "
                                          f"{name}; its logprobs would be wrong")

    def logprobs(self, model, packed: Packed, with_entropy: bool = False):
        """log p (and entropy) of the loss tokens of one packed micro-batch under `model`."""
        return model.loss_logprobs(packed, self.autocast, with_entropy)

    def anchor_logprobs(self, packed: Packed):
        """log p of the loss tokens under the KL anchor (a LoRA run's base: its adapter off)."""
        if self.anchor is self.model:
            with self.model.disable_adapter():
                return self.logprobs(self.model, packed)[0]
        return self.logprobs(self.anchor, packed)[0]

    def pack(self, samples: list[Sample]) -> Packed:
        return pack(self.torch, samples, self.device)

    def save(self, out: Path, state: dict) -> None:
        """Every rank takes part: `out` complete, or nothing (stages/train/checkpoint.py)."""
        torch = self.torch
        bad = next((name for name, p in self.model.named_parameters()
                    if not bool(torch.isfinite(parallel.local_tensor(p)).all())), None)
        if parallel.max_over_ranks(torch, int(bad is not None), self.layout, self.device):
            raise Diverged(f"weight {bad or '(on another rank)'} is not finite after the "
                           f"update: no checkpoint written")
        if self.cfg.lora_rank:
            state = {**state, checkpoint.BASE_KEY: self.base}
        checkpoint.save(torch, self.model, self.optimizer, self.tokenizer, out, state,
                        self.export_dtype, self.layout, self.device)

    def host_state(self) -> dict:
        return checkpoint.host_state(self.model, self.optimizer)

    def anchor_host_state(self) -> dict | None:
        """The KL anchor's shards in host memory; None without an anchor of its own."""
        if self.anchor is None or self.anchor is self.model:
            return None
        return checkpoint.host_state(self.anchor)

    def close(self) -> None:
        """Let go of the model, its KL anchor and the optimizer state; on CUDA their memory goes
        back to the device, where the next stage's engine (or a woken server) needs it."""
        from stages.backends.hf import release_device_memory

        self.model = self.anchor = self.optimizer = None
        release_device_memory(self.torch, self.device)


ROUTERS = ("gate", "router", "shared_expert_gate")  # MoE routers' names (Qwen-MoE, Mixtral, ...)


# In an MoE model peft (0.21, on transformers 5) reads these target names as the experts' fused
# weights (peft/utils/transformers_weight_conversion.py, _MOE_TARGET_MODULE_MAPPING), whichever
# module they name: "auto" leaves them out there
PEFT_EXPERT_NAMES = ("gate", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")


def lora_targets(torch, model, spec: str = "auto") -> list[str]:
    """peft's target_modules: `spec`'s comma list of module name suffixes as given, or for
    "auto" every linear layer of attention and MLPs but the output head. In an MoE model that
    leaves out its experts (fused 3-D weights in transformers 5, linear layers under `experts`
    elsewhere), its routers and, since peft would take their names for the experts', every MLP
    projection: attention only. Leaf names (q_proj, ...) where they pick exactly these layers,
    else full names."""
    if spec != "auto":
        names = [name.strip() for name in spec.split(",") if name.strip()]
        if not names:
            raise ValueError("--lora-targets: name at least one module, or auto")
        return names
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    moe = any(name.rpartition(".")[2] == "experts" for name, _ in model.named_modules())
    chosen, left_out = [], []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            parts = name.split(".")
            expert = "experts" in parts or parts[-1] in ROUTERS or \
                (moe and parts[-1] in PEFT_EXPERT_NAMES)
            (left_out if module is head or expert else chosen).append(name)
    leaves = {name.rpartition(".")[2] for name in chosen}
    if any(name.rpartition(".")[2] in leaves for name in left_out):
        return chosen
    return sorted(leaves)


def wraps_experts(model) -> bool:
    """Whether any trainable parameter of a peft model is an MoE expert's or router's."""
    return any("experts" in parts or parts[-1] in ROUTERS
               for parts in (name.split(".lora_")[0].split(".")
                             for name, p in model.named_parameters() if p.requires_grad))


def choose_offload(torch, model_dir: str, cfg: Config, layout: parallel.Layout, device: str,
                   longest: int) -> str:
    """What `cfg.offload` stands for here: itself, or for "auto" the least the memory plan
    (stages/train/plan.py) says fits the free memory of the fullest GPU of the ranks, for this
    round's longest sequence; "none" off a GPU and for LoRA."""
    if cfg.offload != "auto":
        return cfg.offload
    if not device.startswith("cuda") or cfg.lora_rank:
        return "none"
    free = -parallel.max_over_ranks(torch, -torch.cuda.mem_get_info(device)[0], layout, device)
    shape = plan.model_shape(model_dir)
    trainer = plan.Trainer(nproc=layout.world, micro_batch_tokens=cfg.micro_batch_tokens,
                           context_length=max(longest, 1), kl_beta=cfg.kl_beta,
                           gradient_checkpointing=cfg.gradient_checkpointing)
    return plan.least_offload(shape, trainer, free)


def check_start(model_dir: str, cfg: Config) -> None:
    """A LoRA checkpoint trains on only as LoRA of its own rank (ValueError otherwise)."""
    if checkpoint.adapter_base(model_dir) is None:
        return
    rank = checkpoint.adapter_rank(model_dir)
    if rank != cfg.lora_rank:
        raise ValueError(f"{model_dir} is a rank-{rank} LoRA adapter: train it on with "
                         f"--lora-rank {rank} (a run trains one adapter, and full fine-tuning "
                         f"starts from a whole model)")


def parameter_counts(model) -> tuple[int, int]:
    """(trainable, all) parameters of the model, tied ones once, sharded ones whole."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)

