"""train-grpo's settings: one frozen `Config` for a run, however it was asked for.

In: the options of `spade train-grpo` (spade_cli/train_grpo.py), or the JSON of a job a resident
trainer reads (`Config.from_dict`, stages/train/ranks.py).
Out: a frozen dataclass that every other module of stages/train reads.
Guarantees: frozen, so a run's settings never change under it; the comments on the fields say
which defaults are the reference's (one optimizer step per round over whole episodes, the
"sample" loss norm, reward -1 for a play whose env step raised); `from_dict(asdict(cfg))` equals
`cfg`, and `asdict(cfg)` is part of what a rerun of a step is recognised by
(stages/train/loop.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stages import rewards


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
        """The config `asdict` gave (a resident trainer's job, stages/train/ranks.py)."""
        return cls(**{**data, "betas": tuple(data["betas"]), "roles": tuple(data["roles"]),
                      "rewards": rewards.RewardConfig(**data["rewards"])})

