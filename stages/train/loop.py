"""train-grpo: one GRPO update of the shared policy from both roles' samples.

In: `rollout` records (agent samples: the no-hint plays; not those of an env a `judgement`
found a shortcut, stages/judge.py), `regret` records (designer
advantages) with the `design` records they score (designer samples, usually from k rounds
earlier), and the current model directory.
Out: an HF checkpoint `step-NNNNNN/` (model, tokenizer, optimizer state, trainer_state.json) and
one `train` record per optimizer step (loss, clip fraction, approx KL, entropy, grad norm, what
the step cost in tokens, advantage stats per role, TIS weights; timings and peak memory in meta).
Guarantees:
- loss = PPO-clip with asymmetric bounds (1 - clip_low, 1 + clip_high) against the policy at the
  start of the update, optional k3 KL (clamped to +-10) to the model the run started from,
  normalised as `loss_norm` says: "sample"
  (the reference's: a token mean within each episode or design, then a mean over them) or
  "token" (a token mean over the optimizer batch);
- one sequence per episode: when every turn's prompt ids extend the previous turn's prompt and
  completion token for token, a play is one sequence whose completion tokens carry loss and
  whose observations and tool results are context; otherwise (a template that rewrites earlier
  turns) each turn is its own sample, the prompt the model really saw, and the play is counted
  as a per-turn fallback. Both give the same per-token logprobs;
- micro-batches are packed by tokens (`micro_batch_tokens`, no padding), and logits exist only
  at loss positions, a chunk at a time (stages/packing.py);
- whole episodes are the batch unit and, by default, one optimizer step takes the whole round
  (the reference: one step per rollout over its episodes); `batch_size` units per step and
  `batch_unit = "turn"` are options;
- truncated importance sampling: every token is weighted by min(exp(logp_start - logp_sampled),
  tis_cap) from the stored sampling logprobs, which corrects both sampler/trainer mismatch and
  the k-round staleness of delayed designer samples;
- agent advantage: z-score of episode rewards within one env's plays; designer advantage: as
  score-regret computed it (skill-centred, scaled);
- plays the env broke: one whose step raised after the agent acted (`program_error` with a
  turn of model tokens) trains as an ordinary play with reward `rewards.failed_play_reward`
  (-1), in its env's group, as the reference's env wrapper turns the exception into reward -1
  and completes the trajectory; every other `ok: false` play (hangs, limits, load or reset
  failures, blacklisted, internal errors) is dropped and counted, as the reference drops its
  FAILED plays. `drop_env_errors` drops the crashed ones too (spade's earlier rule);
- samples without token ids (openai backend) are skipped and counted, never guessed;
- LoRA (`lora_rank`): one adapter on the frozen start model, carried with its AdamW state from
  round to round and never merged (a LoRA checkpoint is the adapter folder:
  stages/checkpoint.py); `lora_targets` "auto" leaves MoE experts, routers and the head alone;
- no checkpoint holds a non-finite weight: a non-finite reward, advantage, temperature or
  logprob in the inputs is a RecordError, and a non-finite loss, gradient norm or weight stops
  the update with Diverged (exit 65) before anything is written.
The loop is ours, not TRL's GRPOTrainer: that consumes offline, multi-role, multi-turn samples
only through an experimental hook and recomputes advantages.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import random
import re
import shutil
import time
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from stages import checkpoint, parallel, plan, rewards
from stages.packing import Packed, loss_logprobs, micro_batches, pack
from stages.judge import condemned
from stages.records import (Design, Judgement, Record, RecordError, Regret, Rollout, Train,
                            content_hash)

log = logging.getLogger(__name__)
STATE_FILE = checkpoint.STATE_FILE


class Diverged(ArithmeticError):
    """The update made a non-finite loss, gradient norm or weight; no checkpoint was written."""


@dataclass(frozen=True)
class Config:
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.1
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_beta: float = 0.0
    # the model the KL term pulls toward; None: the model the run started from (each
    # checkpoint records it), as the reference's trainer anchors to its initial model
    kl_anchor: str | None = None
    tis_cap: float = 2.0
    # The reference takes one optimizer step per round over whole episodes (its global batch
    # of 192 is the round's plays), with an lr tuned for that: batch_size 0 = all in one step.
    batch_unit: str = "episode"  # "episode": all turns of a play (or one design); "turn"
    batch_size: int = 0  # units per optimizer step; 0 = the whole round in one step
    # tokens per forward/backward (gradient accumulation): packed sequences, one longer than
    # this gets a micro-batch of its own
    micro_batch_tokens: int = 8192
    loss_norm: str = "sample"  # "sample": the reference's (slime's default); "token"
    epochs: int = 1
    max_grad_norm: float = 1.0
    train_on_hinted: bool = False
    # False (the reference): a play whose env step raised trains with reward -1 (see
    # `trained_reward`); True: every play the env broke is dropped from agent samples
    drop_env_errors: bool = False
    # tool-use launchers of the reference: no loss on episodes that ran out of turns (the
    # budget ended them, not the policy) nor on turns whose tool call could not be parsed
    mask_truncated: bool = False
    mask_malformed_tool_calls: bool = False
    roles: tuple[str, ...] = ("agent", "designer")
    lora_rank: int = 0  # 0 = full fine-tuning
    # "auto": every linear layer of attention and dense MLPs (`lora_targets`); else a comma
    # list of module name suffixes, as peft's target_modules takes them
    lora_targets: str = "auto"
    # where the training state lives (plan.OFFLOADS): "none", all on the GPUs; "optimizer",
    # AdamW's moments and its step in host memory (the reference's --optimizer-cpu-offload);
    # "all", FSDP2's offload of the weights, gradients and AdamW; "auto", the least of those
    # the memory plan says fits the GPUs' free memory, for this round's longest sequence
    offload: str = "none"
    lora_alpha: int = 32
    bf16: bool = True  # only used on CUDA
    gradient_checkpointing: bool = False
    seed: int = 0
    device: str | None = None
    rewards: rewards.RewardConfig = field(default_factory=rewards.RewardConfig)

    @classmethod
    def from_dict(cls, data: dict) -> "Config":
        """The config `asdict` gave (a resident trainer's job, stages/train_ranks.py)."""
        return cls(**{**data, "betas": tuple(data["betas"]), "roles": tuple(data["roles"]),
                      "rewards": rewards.RewardConfig(**data["rewards"])})


@dataclass
class Sample:
    """One training sequence: a whole play, one turn of it, or one design."""

    role: str
    ids: list[int]  # what the model read and wrote, in order
    loss_positions: list[int]  # positions in `ids` of the tokens that carry loss
    sampled_logprobs: list[float]  # the sampler's log p of each of those tokens
    advantage: float
    temperature: float = 1.0
    source: str = ""  # the play or design: the batch unit, and the "sample" of loss_norm
    per_turn: bool = False  # a turn of a play that could not be one sequence

    @classmethod
    def of_turn(cls, role: str, prompt_ids: list[int], completion_ids: list[int],
                logprobs: list[float], advantage: float, temperature: float = 1.0,
                source: str = "", per_turn: bool = False) -> "Sample":
        start = len(prompt_ids)
        return cls(role, prompt_ids + completion_ids,
                   list(range(start, start + len(completion_ids))),
                   list(logprobs[:len(completion_ids)]), advantage, temperature, source, per_turn)


# -- building samples ------------------------------------------------------------------------

def build_samples(records: Iterable[Record], cfg: Config) -> tuple[list[Sample], dict[str, int]]:
    """Agent samples from rollouts, designer samples from regret + design records."""
    plays: dict[str, list[tuple[Rollout, float]]] = defaultdict(list)
    designs: dict[str, Design] = {}
    regrets: list[Regret] = []
    skipped: dict[str, int] = defaultdict(int)
    records = list(records)
    shortcuts = condemned(r for r in records if isinstance(r, Judgement))
    for record in records:
        if isinstance(record, Rollout) and record.env_id in shortcuts:
            skipped["agent_shortcut_env_dropped"] += 1  # its winners win any seed: a trick
        elif isinstance(record, Rollout):
            if (record.hint and not cfg.train_on_hinted) or "agent" not in cfg.roles:
                continue
            reward = trained_reward(record, cfg)
            if reward is None:
                skipped[f"agent_{record.outcome}_dropped"] += 1
                continue
            plays[f"{record.env_id}:{int(record.hint)}:{record.round}"].append((record, reward))
        elif isinstance(record, Design):
            designs[record.id] = record
        elif isinstance(record, Regret):
            regrets.append(record)
    samples: list[Sample] = []
    if "agent" in cfg.roles:
        for group in plays.values():
            for play, reward in group:
                _require_finite([reward], play, "reward")
            advantages = rewards.agent_advantages([reward for _, reward in group], cfg.rewards)
            for (play, _), advantage in zip(group, advantages):
                samples += play_samples(play, advantage, cfg, skipped)
    if "designer" in cfg.roles:
        for regret in regrets:
            samples += designer_samples(regret, designs, skipped)
    return samples, dict(skipped)


def designer_samples(regret: Regret, designs: dict[str, Design],
                     skipped: dict[str, int]) -> list[Sample]:
    """The design a regret record pays, or with `designer_sample = "conversation"` every
    designer turn of its repair conversation: one sequence when the turns extend each other
    token for token, else one sample per turn."""
    turns = design_conversation(designs, regret.design_id or "") \
        if regret.designer_sample == "conversation" else \
        [designs[regret.design_id]] if regret.design_id in designs else []
    if not turns:
        skipped["designer_without_design_record"] += 1
        return []
    if any(not d.completion_ids or d.prompt_ids is None or not d.logprobs for d in turns):
        skipped["designer_no_token_ids"] += 1
        return []
    _require_finite([regret.designer_advantage], regret, "designer_advantage")
    for design in turns:
        _require_finite(design.logprobs, design, "logprobs")
    advantage, temperature, source = regret.designer_advantage, _temperature(turns[0]), turns[-1].id
    if len(turns) > 1 and turns_extend(turns) and \
            len({_temperature(d) for d in turns}) == 1:
        return [conversation_sample("designer", turns, [True] * len(turns), advantage,
                                    temperature, source)]
    return [Sample.of_turn("designer", d.prompt_ids, d.completion_ids, d.logprobs, advantage,
                           _temperature(d), source, per_turn=len(turns) > 1) for d in turns]


def design_conversation(designs: dict[str, Design], last: str) -> list[Design]:
    """The designs of a repair conversation, turn 1 first, walking back from `last` through
    `repairs`; empty when one of them is not among `designs`."""
    turns: list[Design] = []
    design_id: str | None = last
    while design_id is not None:
        if design_id not in designs:
            return []
        turns.append(designs[design_id])
        design_id = turns[-1].repairs
    return turns[::-1]


# The env outcome of a play whose step raised (or whose worker died or replied garbage) while
# it took the agent's action: the reference's env wrapper (spade/core/envs/
# synthetic_game_env.py, `step`) turns such an exception into reward -1 and ends the episode,
# which then trains as any other. Hangs (`timeout`, `env_budget`), limits (`oom`,
# `output_limit`) and load or reset failures are FAILED plays there, never trained.
STEP_CRASH = "program_error"


def crashed_step(play: Rollout) -> bool:
    """Whether the env raised on a step after the agent acted: a `program_error` play with a
    turn of model tokens (a load or reset that failed leaves none)."""
    return not play.ok and play.outcome == STEP_CRASH and \
        any(turn.completion_ids for turn in play.turns)


def trained_reward(play: Rollout, cfg: Config) -> float | None:
    """The reward a play trains the agent with; None: not trained (the env broke the play,
    not the agent)."""
    if play.ok:
        return play.reward
    if crashed_step(play) and not cfg.drop_env_errors:
        return cfg.rewards.failed_play_reward
    return None


def play_samples(play: Rollout, advantage: float, cfg: Config,
                 skipped: dict[str, int]) -> list[Sample]:
    """One sequence for the play when its turns extend each other token for token, else one
    sample per turn (`per_turn`); turns without token ids or masked by cfg carry no loss."""
    temperature = _temperature(play)
    trained = []  # (turn, carries loss)
    for index, turn in enumerate(play.turns):
        if not turn.completion_ids or turn.prompt_ids is None or not turn.logprobs:
            skipped["agent_no_token_ids"] += 1
            continue
        if cfg.mask_truncated and play.truncated:
            skipped["agent_truncated_masked"] += 1
            continue
        loss = not (cfg.mask_malformed_tool_calls and malformed_tool_call(turn.completion))
        if not loss:
            skipped["agent_malformed_tool_call_masked"] += 1
        _require_finite(turn.logprobs, play, f"turns.{index}.logprobs")
        trained.append((turn, loss))
    if not any(loss for _, loss in trained):
        return []
    if len(trained) == len(play.turns) and turns_extend(play.turns):
        return [episode_sample(play, advantage, temperature, [loss for _, loss in trained])]
    return [Sample.of_turn("agent", turn.prompt_ids, turn.completion_ids, turn.logprobs,
                           advantage, temperature, play.id, per_turn=len(play.turns) > 1)
            for turn, loss in trained if loss]


def turns_extend(turns: list) -> bool:
    """Whether each turn's prompt starts with the previous turn's prompt and completion."""
    for previous, turn in zip(turns, turns[1:]):
        seen = previous.prompt_ids + previous.completion_ids
        if turn.prompt_ids[:len(seen)] != seen:
            return False
    return True


def episode_sample(play: Rollout, advantage: float, temperature: float,
                   carries_loss: list[bool]) -> Sample:
    """The play as one sequence (conversation_sample over its turns)."""
    return conversation_sample("agent", play.turns, carries_loss, advantage, temperature,
                               play.id)


def conversation_sample(role: str, turns: list, carries_loss: list[bool], advantage: float,
                        temperature: float, source: str) -> Sample:
    """Turns that extend each other as one sequence: the last prompt (which holds every
    earlier turn) and the last completion, with loss on each turn's completion tokens that
    `carries_loss` keeps."""
    last = turns[-1]
    positions: list[int] = []
    sampled: list[float] = []
    for turn, loss in zip(turns, carries_loss):
        if loss:
            start = len(turn.prompt_ids)
            positions += range(start, start + len(turn.completion_ids))
            sampled += turn.logprobs[:len(turn.completion_ids)]
    return Sample(role, last.prompt_ids + last.completion_ids, positions, sampled,
                  advantage, temperature, source)


TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def malformed_tool_call(completion: str) -> bool:
    """A turn that tried to call a tool in a form the env rejects as a format error (the rule
    of sandbox/tool_base.py): unclosed, not JSON, no name, or arguments that are no object."""
    if "<tool_call>" not in completion:
        return False
    calls = TOOL_CALL_RE.findall(completion)
    if not calls:
        return True
    for raw in calls:
        try:
            call = json.loads(raw)
            arguments = call.get("arguments", {}) if isinstance(call, dict) else None
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            return True
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) \
                or not isinstance(arguments, dict):
            return True
    return False


def _require_finite(values: Iterable[float], record: Record, field: str) -> None:
    """Records read from shards are finite; records handed over in memory may not be."""
    if not all(map(math.isfinite, values)):
        raise RecordError(f"field '{field}': a non-finite number; nothing trained", record.id)


def _temperature(record: Record) -> float:
    value = record.meta.get("temperature", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        raise RecordError(f"field 'meta.temperature': expected a finite number, got {value!r}",
                          record.id)
    return float(value)


# -- the model side ---------------------------------------------------------------------------

class Policy:
    """The model being trained, its optimizer, and log p of packed samples, on one rank of
    `layout` (stages/parallel.py: the whole model on one process, or FSDP2 shards); how it is
    read and written is stages/checkpoint.py."""

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
            from stages.offload import HostAdamW

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
        """Every rank takes part: `out` complete, or nothing (stages/checkpoint.py)."""
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
    (stages/plan.py) says fits the free memory of the fullest GPU of the ranks, for this
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


def _stats(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {f"{prefix}_mean": mean, f"{prefix}_std": std, f"{prefix}_min": min(values),
            f"{prefix}_max": max(values), f"{prefix}_n": float(len(values))}


BATCH_UNITS = ("episode", "turn")


def plan_steps(samples: list[Sample], cfg: Config, seed: int) -> list[list[int]]:
    """The sample indices of each optimizer step, over all epochs. Units (episodes: every turn
    of one play, or one design; or single turns) are shuffled, then `batch_size` of them make
    a step, so an episode never straddles two steps."""
    if cfg.batch_unit not in BATCH_UNITS:
        raise ValueError(f"batch_unit must be one of {', '.join(BATCH_UNITS)}")
    units: dict[object, list[int]] = {}
    for index, sample in enumerate(samples):
        key = sample.source if cfg.batch_unit == "episode" else index
        units.setdefault(key, []).append(index)
    order = list(units.values())
    random.Random(seed).shuffle(order)
    size = cfg.batch_size or len(order)
    steps = [[i for unit in order[first:first + size] for i in unit]
             for first in range(0, len(order), size)]
    return steps * cfg.epochs


def update(policy: Policy, samples: list[Sample], steps: list[list[int]], cfg: Config,
           step0: int) -> Iterator[Train]:
    """Run the optimizer steps planned by `plan_steps`; yield one Train record per step."""
    # The first optimizer batch sees the start policy itself: its training forward gives the
    # start logprobs for free. Only later batches need a separate no-grad pass (and every
    # batch does when dropout would make the two forwards differ).
    # (On several ranks a sample's start is known only where it was trained: with more than
    # one epoch, where it comes back, it may be another rank's.)
    reused = policy.layout.sharded and cfg.epochs > 1
    free = set() if _has_dropout(policy) or reused else set(steps[0])
    start_logps: list = [None] * len(samples)
    later = [i for i in dict.fromkeys(i for chosen in steps for i in chosen) if i not in free]
    for index, logp in zip(later, _start_logprobs(policy, [samples[i] for i in later], cfg)):
        start_logps[index] = logp
    for offset, chosen in enumerate(steps, 1):
        yield _optimizer_step(policy, samples, chosen, start_logps, cfg, step0 + offset)


def _has_dropout(policy: Policy) -> bool:
    model, dropout = policy.model, policy.torch.nn.Dropout
    config = getattr(model, "config", None)
    return any(isinstance(m, dropout) and m.p > 0 for m in model.modules()) or \
        float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0


def _rank_passes(samples: list[Sample], chosen: list[int], cfg: Config,
                 layout: parallel.Layout) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches of samples[chosen], shared among ranks by tokens, each with
    whether it counts: a rank with fewer replays its first (or the step's first) at weight 0,
    so every rank makes as many passes (and collectives) as the busiest."""
    groups = [[chosen[g] for g in group] for group in
              micro_batches([len(samples[i].ids) for i in chosen], cfg.micro_batch_tokens)]
    if not groups:
        return []
    shares = parallel.assign([sum(len(samples[i].ids) for i in g) for g in groups], layout.world)
    mine = [(groups[g], True) for g in shares[layout.rank]]
    spare = mine[0][0] if mine else groups[0]
    return mine + [(spare, False)] * (max(map(len, shares)) - len(mine))


def _start_logprobs(policy: Policy, samples: list[Sample], cfg: Config) -> list:
    """log p of each sample's loss tokens under the policy before this update (no grad); on
    several ranks each scores its share and every rank gets them all."""
    torch = policy.torch
    out: dict[int, list[float]] = {}
    policy.model.eval()
    with torch.no_grad():
        for rows, counts in _rank_passes(samples, list(range(len(samples))), cfg,
                                         policy.layout):
            packed = policy.pack([samples[i] for i in rows])
            logp, _ = policy.logprobs(policy.model, packed)
            if counts:
                for index, values in zip(rows, logp.cpu().split(packed.counts)):
                    out[index] = values
    policy.model.train()
    out = parallel.gather_dicts(out, policy.layout)
    return [out[i] for i in range(len(samples))]


LOSS_NORMS = ("sample", "token")
# slime's `low_var_kl` (slime/utils/ppo_utils.py:47-49, the trainer of the reference) clamps
# its k3 estimate to [-10, 10]; so does `kl_k3`. k3 is never negative, so only the upper bound
# bites: a token past it adds 10 to the KL term and no gradient.
KL_CLAMP = 10.0
# a log-ratio past which k3 exceeds KL_CLAMP anyway (k3(20) = e^20 - 21); capping it there
# changes no value or gradient and keeps exp() from overflowing into inf * 0 = NaN gradients
KL_RATIO_CAP = 20.0
STEP_SUMS = ("loss", "entropy", "clip_frac", "approx_kl", "tis_weight", "tis_clamped")


def loss_weights(batch: list[Sample], norm: str) -> list[float]:
    """The weight of each loss token of each sample: the step's loss is the weighted sum.

    "token": every loss token of the batch weighs the same (TRL's bnpo/dapo). "sample": every
    episode or design weighs the same, and its tokens equally within it: the mean over them of
    their token means (the reference's slime default, TRL's grpo). A per-turn fallback's turns
    share their play's weight, so both layouts of a play give the same loss."""
    if norm not in LOSS_NORMS:
        raise ValueError(f"loss_norm must be one of {', '.join(LOSS_NORMS)}")
    if norm == "token":
        return [1.0 / sum(len(s.loss_positions) for s in batch)] * len(batch)
    per_source: dict[str, int] = defaultdict(int)
    for sample in batch:
        per_source[sample.source] += len(sample.loss_positions)
    return [1.0 / (len(per_source) * per_source[s.source]) for s in batch]


class PeakMemory:
    """The peak memory of a span: the CUDA allocator's peak on a GPU; elsewhere the process's
    resident high-water mark (VmHWM), which Linux resets through /proc/self/clear_refs."""

    def __init__(self, torch, device: str):
        self.torch, self.device = torch, device
        self.cuda = device.startswith("cuda")

    def reset(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass

    def read(self) -> int | None:
        if self.cuda:
            return int(self.torch.cuda.max_memory_allocated(self.device))
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return None
        found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
        return int(found.group(1)) * 1024 if found else None


def _optimizer_step(policy: Policy, samples: list[Sample], chosen: list[int], start: list,
                    cfg: Config, step: int) -> Train:
    """One optimizer step over samples[chosen]; fills in `start` where it was still None."""
    torch = policy.torch
    peak = PeakMemory(torch, policy.device)
    peak.reset()
    began = time.monotonic()
    batch = [samples[i] for i in chosen]
    weight_of = dict(zip(chosen, loss_weights(batch, cfg.loss_norm)))
    loss_tokens = sum(len(s.loss_positions) for s in batch)
    # the same keys on every rank: they are summed over ranks in this order
    sums = dict.fromkeys(STEP_SUMS + (("kl_ref",) if policy.anchor is not None else ()), 0.0)
    forward_tokens = real_tokens = 0
    policy.optimizer.zero_grad(set_to_none=True)
    for rows, counts in _rank_passes(samples, chosen, cfg, policy.layout):
        chunk = [samples[i] for i in rows]
        weights = [weight_of[i] if counts else 0.0 for i in rows]
        loss, entropy, parts = _micro_batch(policy, chunk, rows, start, weights, cfg)
        if not counts:  # a replay that keeps this rank in step with the others: weight 0
            continue
        tokens = sum(len(s.ids) for s in chunk)  # packed side by side: no padding
        forward_tokens += tokens
        real_tokens += tokens
        sums["loss"] += loss
        sums["entropy"] += entropy
        for key, value in parts.items():
            sums[key] += value
    sums = parallel.sum_over_ranks(torch, dict(sums, forward=forward_tokens, real=real_tokens),
                                   policy.layout, policy.device)
    forward_tokens, real_tokens = sums.pop("forward"), sums.pop("real")
    grad_norm = parallel.full_tensor(torch.nn.utils.clip_grad_norm_(
        [p for p in policy.model.parameters() if p.requires_grad], cfg.max_grad_norm))
    if not (math.isfinite(sums["loss"]) and math.isfinite(float(grad_norm))):
        raise Diverged(f"step {step}: loss {sums['loss']:g}, gradient norm {float(grad_norm):g}: "
                       f"not finite, so no checkpoint written (extreme advantages or logprobs "
                       f"in the samples, or a learning rate too high)")
    policy.optimizer.step()
    seconds = time.monotonic() - began
    # `loss` is the objective as normalised; the rest are token means over the step
    stats = {key: value / loss_tokens for key, value in sums.items() if key != "loss"}
    stats.update(loss=sums["loss"], grad_norm=float(grad_norm),
                 loss_tokens=float(loss_tokens), forward_tokens=float(forward_tokens),
                 padding_share=(forward_tokens - real_tokens) / forward_tokens,
                 per_turn_fallbacks=float(len({s.source for s in batch if s.per_turn})),
                 lr=cfg.lr)
    for role in ("agent", "designer"):
        stats.update(_stats([s.advantage for s in batch if s.role == role], f"{role}_adv"))
    stats = {k: v for k, v in stats.items() if math.isfinite(v)}
    # timings and memory vary between identical reruns: they live in `meta`, outside the id
    meta = {"seconds": round(seconds, 4),
            "tokens_per_s": round(loss_tokens / seconds, 2) if seconds > 0 else 0.0}
    peak_bytes = parallel.max_over_ranks(torch, peak.read() or 0, policy.layout, policy.device)
    if peak_bytes:
        meta["peak_memory_bytes"] = peak_bytes  # the largest of any rank
    return Train(step=step, role="+".join(sorted({s.role for s in batch})), stats=stats,
                 parents=sorted({s.source for s in batch})[:1000], meta=meta)


def _micro_batch(policy: Policy, chunk: list[Sample], rows: list[int], start: list,
                 weights: list[float], cfg: Config) -> tuple[float, float, dict]:
    """One micro-batch's forward and backward, with each sample's loss weighted as `weights`
    says: (its loss, entropy sum, loss parts). A replay pass (weights 0) runs exactly this,
    every forward included, so every rank issues the same collectives (FSDP2's all-gathers of
    the policy and of the KL anchor) in every pass. Fills in `start` where it is still None:
    the first optimizer step's samples, whose start is the policy of this very forward."""
    torch = policy.torch
    packed = policy.pack(chunk)
    logp, entropy = policy.logprobs(policy.model, packed, with_entropy=True)
    for row, values in zip(rows, logp.detach().cpu().split(packed.counts)):
        if start[row] is None:
            start[row] = values

    def per_token(per_sample: list[float]):
        return torch.tensor([v for s, v in zip(chunk, per_sample) for _ in s.loss_positions],
                            device=logp.device, dtype=logp.dtype)

    old = torch.cat([start[i] for i in rows]).to(logp.device)
    sampled = torch.tensor([lp for s in chunk for lp in s.sampled_logprobs],
                           device=logp.device, dtype=logp.dtype)
    loss_terms, parts = token_loss(torch, logp, old, sampled,
                                   per_token([s.advantage for s in chunk]), cfg)
    if policy.anchor is not None:
        with torch.no_grad():
            anchored = policy.anchor_logprobs(packed)
        kl = kl_k3(torch, logp, anchored)
        loss_terms = loss_terms + cfg.kl_beta * kl
        parts["kl_ref"] = float(kl.detach().sum())
    loss = (loss_terms * per_token(weights)).sum()
    loss.backward()
    return float(loss.detach()), float(entropy.sum()), parts


def token_loss(torch, logp, old, sampled, advantages, cfg: Config):
    """Per-token PPO-clip loss with asymmetric clipping and truncated importance weights."""
    ratio = torch.exp(logp - old)
    tis = torch.clamp(torch.exp(old - sampled), max=cfg.tis_cap).detach()
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high) * advantages
    loss = -tis * torch.minimum(unclipped, clipped)
    parts = {"clip_frac": float((unclipped != clipped).float().sum()),
             "approx_kl": float((0.5 * (logp - old) ** 2).detach().sum()),
             "tis_weight": float(tis.sum()),
             "tis_clamped": float((torch.exp(old - sampled) > cfg.tis_cap).float().sum())}
    return loss, parts


def kl_k3(torch, logp, anchored):
    """Per-token k3 estimate of KL(policy || anchor), clamped to +-KL_CLAMP as slime's
    `low_var_kl` is: with r = anchored - logp, exp(r) - r - 1."""
    log_ratio = torch.clamp(anchored - logp, max=KL_RATIO_CAP)
    k3 = torch.exp(log_ratio) - log_ratio - 1
    return torch.clamp(k3, min=-KL_CLAMP, max=KL_CLAMP)


# -- the stage --------------------------------------------------------------------------------

KEEP_FILE = "KEEP"  # a checkpoint holding it is never pruned (spade eval leaves one)


def prune_checkpoints(ckpt_root: str, keep_last: int, protect: Iterable[str] = ()) -> list[Path]:
    """Delete all but the newest `keep_last` step-NNNNNN checkpoints, sparing those marked KEEP
    and `protect` (the model a train step started from, so a rerun of that step still finds
    it); optimizer state stays only in the newest. Returns what was deleted."""
    steps = sorted(Path(ckpt_root).glob("step-[0-9]*"))
    steps = [p for p in steps if p.is_dir() and not p.name.endswith(".tmp")]
    spared = {os.path.realpath(p) for p in protect}
    deleted = []
    for index, path in enumerate(steps):
        newest = index == len(steps) - 1
        if not newest:
            checkpoint.prune_trainer_state(path)
        if index < len(steps) - keep_last and not (path / KEEP_FILE).exists() \
                and os.path.realpath(path) not in spared:
            shutil.rmtree(path)
            deleted.append(path)
    return deleted


def trainer_state(model_dir: str) -> dict:
    state = Path(model_dir) / STATE_FILE
    return json.loads(state.read_text()) if state.exists() else {}


def previous_step(model_dir: str) -> int:
    return trainer_state(model_dir).get("step", 0)


def start_model(model_dir: str) -> str:
    """The model the run started from: recorded in every checkpoint; a model directory without
    trainer state is that start itself."""
    return trainer_state(model_dir).get("start_model") or os.path.normpath(model_dir)


@dataclass
class Resident:
    """What a resident trainer (stages/train_ranks.py) keeps between runs, in host memory: this
    rank's shards of the checkpoint it wrote last (weights and AdamW state), for the run that
    trains from it, and of the KL anchor, which every run of a recipe anchors to."""

    checkpoint: str | None = None
    structure: tuple = ()  # the settings the state's shapes depend on
    offload: str | None = None  # what the setting stood for when the state was kept
    state: dict | None = None
    anchor: str | None = None
    anchor_state: dict | None = None

    def take(self, model_dir: str, cfg: Config) -> dict | None:
        """The kept state if `model_dir` is that checkpoint (and no longer kept: the policy
        it fills holds it from now on)."""
        state, self.state = self.state, None
        fits = self.checkpoint == os.path.normpath(model_dir) and \
            self.structure == _structure(cfg)
        return state if fits else None

    def take_anchor(self, anchor: str, cfg: Config) -> dict | None:
        """The kept anchor if it is `anchor`'s, likewise handed over."""
        state, self.anchor_state = self.anchor_state, None
        fits = self.anchor == os.path.normpath(anchor) and self.structure == _structure(cfg)
        return state if fits else None

    def keep(self, out: Path, cfg: Config, policy: "Policy", anchor: str) -> None:
        if not cfg.lora_rank:  # LoRA runs have no server mode, so no resident trainer
            self.checkpoint, self.structure = os.path.normpath(out), _structure(cfg)
            self.offload, self.state = policy.offload, policy.host_state()
            self.anchor, self.anchor_state = os.path.normpath(anchor), \
                policy.anchor_host_state()

    def close(self) -> None:
        self.state = self.anchor_state = None
        parallel.stop()


def _structure(cfg: Config) -> tuple:
    return cfg.lora_rank, cfg.offload, cfg.gradient_checkpointing


def run(records: Iterable[Record], model_dir: str, ckpt_root: str, cfg: Config,
        round: int = 0, on_step: Callable[[int, int, int], None] | None = None,
        layout: parallel.Layout | None = None,
        resident: Resident | None = None) -> tuple[list[Train], Path | None, dict]:
    """Train on the records; returns (train records, checkpoint dir or None, info).

    `on_step(steps done, steps in all, tokens of the step)` is called once the number of steps
    is known (done 0) and after every optimizer step: progress for whoever shows it. `layout`:
    this process's rank, by default the one torchrun's environment gives (none: one process);
    every rank returns the same records. `resident`: ranks that outlive this run keep the
    state of the checkpoint it writes, and start from the one kept if it is `model_dir`."""
    layout = layout or parallel.from_environment()
    records = list(records)
    samples, skipped = build_samples(records, cfg)
    info = {"samples": len(samples), "skipped": skipped,
            "roles": {role: sum(s.role == role for s in samples) for role in cfg.roles},
            "per_turn_fallbacks": len({s.source for s in samples if s.per_turn})}
    if not samples:
        return [], None, info
    step0 = previous_step(model_dir)
    digest = content_hash([sorted(r.id for r in records), asdict(cfg), step0,
                           os.path.normpath(model_dir)])
    plan = plan_steps(samples, cfg, cfg.seed + step0)
    steps = len(plan)
    report = on_step or (lambda done, total, tokens: None)
    report(0, steps, 0)
    out = Path(ckpt_root) / f"step-{step0 + steps:06d}"
    state_path = out / STATE_FILE
    if state_path.exists() and json.loads(state_path.read_text()).get("inputs") == digest:
        done = json.loads(state_path.read_text())
        info.update({key: value for key, value in done.get("info", {}).items()
                     if key.endswith("parameters")}, resumed=True)
        return [Train.model_validate(t) for t in done["train"]], out, info
    start = start_model(model_dir)
    anchor = cfg.kl_anchor or start
    kept = resident.take(model_dir, cfg) if resident else None
    # the anchor's kept shards are laid out as the policy's were: both from memory, or neither
    kept_anchor = resident.take_anchor(anchor, cfg) if resident and cfg.kl_beta > 0 and \
        kept is not None else None
    # the policy empties what it was handed as it fills: no second host copy stays
    policy = Policy(model_dir, cfg, anchor, layout, kept, kept_anchor,
                    offload=resident.offload if kept is not None else None,
                    longest=max(len(s.ids) for s in samples))
    info.update(trainable_parameters=policy.trainable, parameters=policy.parameters,
                from_memory=[part for part, state in (("policy", kept),
                                                      ("KL anchor", kept_anchor))
                             if state is not None])
    try:
        trained = []
        began = time.monotonic()
        for step in update(policy, samples, plan, cfg, step0):
            trained.append(step)
            report(len(trained), steps, int(step.stats.get("loss_tokens", 0)))
        seconds = {**policy.seconds, "train": time.monotonic() - began}
        began = time.monotonic()
        Path(ckpt_root).mkdir(parents=True, exist_ok=True)
        policy.save(out, {"step": step0 + steps, "round": round, "inputs": digest,
                          "parent": os.path.normpath(model_dir),
                          "start_model": start, "kl_anchor": anchor,
                          "info": info,
                          "train": [t.to_dict() for t in trained]})
        # where a round's trainer time goes (it varies between reruns: not in the state)
        info["seconds"] = {**seconds, "save": time.monotonic() - began}
        if resident:
            resident.keep(out, cfg, policy, anchor)
    finally:
        policy.close()
        if resident:  # no rank reports done while another still holds its GPU (the engine
            parallel.barrier(layout)  # wakes into that memory next)
        else:
            parallel.stop()
    return [t.model_copy(update={"policy": str(out)}) for t in trained], out, info
