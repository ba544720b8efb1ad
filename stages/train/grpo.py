"""GRPO's objective, token by token: PPO-clip with truncated importance sampling, the k3 KL to
an anchor, and the weight of each token in a step's loss.

In: tensors over the loss tokens of a micro-batch: log p under the policy being trained
(`logp`), under the policy at the start of the update (`old`), under the sampler (`sampled`),
under the KL anchor (`anchored`), and each token's advantage; for the weights, the samples of
the whole optimizer step (stages/train/samples.py).
Out: per-token loss terms with their diagnostics (`token_loss`), per-token KL (`kl_k3`), and a
weight per sample for its tokens (`loss_weights`).

The loss of one optimizer step over its samples s, each with loss tokens t and advantage A_s:

    r_t    = exp(logp_t - old_t)
    tis_t  = min(exp(old_t - sampled_t), tis_cap)                  (no gradient)
    ppo_t  = -tis_t * min(r_t * A_s, clip(r_t, 1 - clip_low, 1 + clip_high) * A_s)
    d_t    = min(anchored_t - logp_t, KL_RATIO_CAP)
    kl_t   = clamp(exp(d_t) - d_t - 1, -KL_CLAMP, KL_CLAMP)         (k3; only with kl_beta > 0)
    loss   = sum_s w_s * sum_t (ppo_t + kl_beta * kl_t)
    w_s    = 1 / (S * n(source of s))   "sample": S sources (episodes or designs) in the step,
                                        n their loss tokens; a mean of per-source token means
    w_s    = 1 / N                      "token": N loss tokens in the step; a token mean

Guarantees:
- PPO-clip with asymmetric bounds (1 - clip_low, 1 + clip_high) against the policy at the start
  of the update: outside them, on the side the advantage pushes toward, a token has no gradient;
- truncated importance sampling: every token is weighted by min(exp(logp_start -
  logp_sampled), tis_cap) from the stored sampling logprobs, which corrects both sampler/trainer
  mismatch and the k-round staleness of delayed designer samples;
- the KL is k3 to the anchor, clamped to +-KL_CLAMP as slime's `low_var_kl` is, and never
  overflows (KL_RATIO_CAP);
- the weights are the whole optimizer step's ("sample": the reference's, a token mean within
  each episode or design, then a mean over them; or "token"), never a micro-batch's, and a
  per-turn fallback's turns share their play's weight: micro-batching, ranks and the layout of
  a play change no loss;
- arithmetic only: torch comes in as an argument; no model, no ranks, no FSDP or
  torch.distributed here.
"""

from __future__ import annotations

from collections import defaultdict

from stages.train.config import Config
from stages.train.samples import Sample


LOSS_NORMS = ("sample", "token")
# slime's `low_var_kl` (slime/utils/ppo_utils.py:47-49, the trainer of the reference) clamps
# its k3 estimate to [-10, 10]; so does `kl_k3`. k3 is never negative, so only the upper bound
# bites: a token past it adds 10 to the KL term and no gradient.
KL_CLAMP = 10.0
# a log-ratio past which k3 exceeds KL_CLAMP anyway (k3(20) = e^20 - 21); capping it there
# changes no value or gradient and keeps exp() from overflowing into inf * 0 = NaN gradients
KL_RATIO_CAP = 20.0


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

