"""train-grpo's update: the optimizer steps over a round's samples, and the run that reads a
model and writes the next checkpoint.

In: records (turned into samples by stages/train/samples.py), the current model directory, the
checkpoint root, a Config and the round; on several ranks, this rank's layout
(stages/train/parallel.py); in a resident trainer (stages/train/ranks.py), what it kept.
Out: an HF checkpoint `step-NNNNNN/` (model, tokenizer, optimizer state, trainer_state.json) and
one `train` record per optimizer step (loss, clip fraction, approx KL, entropy, grad norm, what
the step cost in tokens, advantage stats per role, TIS weights; timings and peak memory in meta),
with info (samples, skips, per-turn fallbacks, parameters, where the seconds went).
Guarantees:
- whole episodes are the batch unit and, by default, one optimizer step takes the whole round
  (the reference: one step per rollout over its episodes); `batch_size` units per step and
  `batch_unit = "turn"` are options; which samples make which step is a function of `seed` and
  the step the run starts from;
- the loss (stages/train/grpo.py) is against the policy at the start of the update, with an
  optional KL to `kl_anchor`, by default the model the run started from (every checkpoint
  records it): the start log p
  of the first step's samples come from that step's own forward, the others' from a no-grad
  pass before it;
- micro-batches are packed by tokens (`micro_batch_tokens`, no padding), and logits exist only
  at loss positions, a chunk at a time (stages/train/packing.py); on several ranks each takes a
  share of a step's micro-batches by tokens and replays one at weight 0 to keep in step with
  the busiest, and every rank returns the same records;
- a non-finite loss or gradient norm stops the update with Diverged (exit 65) before anything is
  written (a non-finite weight too: stages/train/policy.py);
- a rerun of a step with the same inputs finds the checkpoint it wrote and returns its records
  without training (`resumed`);
- `prune_checkpoints` keeps the newest, those marked KEEP and those it is told to protect;
  optimizer state stays only in the newest.
The loop is ours, not TRL's GRPOTrainer: that consumes offline, multi-role, multi-turn samples
only through an experimental hook and recomputes advantages.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from stages.records import Record, Train, content_hash
from stages.train import checkpoint, parallel
from stages.train.config import Config
from stages.train.grpo import kl_k3, loss_weights, token_loss
from stages.train.packing import micro_batches
from stages.train.policy import Diverged, Policy
from stages.train.samples import Sample, build_samples


log = logging.getLogger(__name__)
STATE_FILE = checkpoint.STATE_FILE


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


STEP_SUMS = ("loss", "entropy", "clip_frac", "approx_kl", "tis_weight", "tis_clamped")


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
    """What a resident trainer (stages/train/ranks.py) keeps between runs, in host memory: this
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

