"""`spade train-grpo`: one GRPO update of the shared policy; writes the next checkpoint."""

from __future__ import annotations

from typing import Annotated

import typer

from spade_cli.options import Compress, Device, Inputs, Out, Overwrite, Round, Seed


def register(app: typer.Typer) -> None:
    app.command("train-grpo")(train_grpo)


def train_grpo(
    inputs: Inputs = ["-"],
    out: Out = "-",
    model: Annotated[str, typer.Option("--model", "-m", metavar="PATH",
                                       help="Model or checkpoint directory to start from.")] = ...,
    ckpt_dir: Annotated[str, typer.Option(metavar="DIR",
                                          help="Where step-NNNNNN/ checkpoints go.")] = "ckpt",
    keep_last: Annotated[int, typer.Option(
        min=0, help="Keep this many newest checkpoints in --ckpt-dir (plus the one trained "
                    "from and any an eval marked KEEP); optimizer state only in the newest. "
                    "0 keeps all.")] = 0,
    round: Round = 0,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 1e-6,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.1,
    clip_low: Annotated[float, typer.Option(help="PPO clip below 1.")] = 0.2,
    clip_high: Annotated[float, typer.Option(help="PPO clip above 1.")] = 0.28,
    kl_beta: Annotated[float, typer.Option(
        help="Weight of the k3 KL term (clamped to +-10) to --kl-anchor (0 = off).")] = 0.0,
    kl_anchor: Annotated[str, typer.Option(
        metavar="PATH", help="The model KL pulls toward; default: the model the run started "
                             "from, which every checkpoint records.")] = "",
    tis_cap: Annotated[float, typer.Option(help="Truncated importance sampling cap.")] = 2.0,
    batch_size: Annotated[int, typer.Option(
        min=0, help="Units (see --batch-unit) per optimizer step; 0 = the whole round in one "
                    "step, as the reference does.")] = 0,
    batch_unit: Annotated[str, typer.Option(
        help="episode (every turn of one play, or one design) or turn.")] = "episode",
    micro_batch_tokens: Annotated[int, typer.Option(
        min=1, help="Tokens per forward/backward: sequences are packed up to this many (one "
                    "longer gets a pass of its own).")] = 8192,
    loss_norm: Annotated[str, typer.Option(
        help="sample: a token mean within each episode or design, then the mean over them "
             "(the reference's); token: a token mean over the optimizer batch.")] = "sample",
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the samples.")] = 1,
    max_grad_norm: Annotated[float, typer.Option(help="Gradient clipping norm.")] = 1.0,
    roles: Annotated[str, typer.Option(help="agent, designer, or agent,designer.")] = "agent,designer",
    train_on_hinted: Annotated[bool, typer.Option(help="Also train on hinted plays.")] = False,
    drop_env_errors: Annotated[bool, typer.Option(
        help="Drop plays whose env step raised (program_error) from agent samples. Default: "
             "they train with reward -1 in their env's group, as the reference's env wrapper "
             "scores a step that raises; hangs, limits and load or reset failures are "
             "dropped either way.")] = False,
    mask_truncated: Annotated[bool, typer.Option(
        help="No loss on episodes that ran out of turns (reference tool-use runs).")] = False,
    mask_malformed_tool_calls: Annotated[bool, typer.Option(
        help="No loss on turns whose tool call the env could not parse (reference tool-use "
             "runs).")] = False,
    lora_rank: Annotated[int, typer.Option(
        min=0, help="LoRA rank (0 = full fine-tuning): an adapter on the frozen start model, "
                    "kept with its AdamW state from round to round, never merged.")] = 0,
    lora_targets: Annotated[str, typer.Option(
        metavar="auto|NAMES", help="The modules LoRA adapts: auto (every linear layer of "
                                   "attention and dense MLPs; not MoE experts, routers or the "
                                   "output head) or a comma list of module name suffixes.")
    ] = "auto",
    gradient_checkpointing: Annotated[bool, typer.Option(help="Trade compute for memory.")] = False,
    offload: Annotated[str, typer.Option(
        metavar="none|optimizer|all|auto",
        help="What lives in host memory: none; optimizer (AdamW's moments and its step, as "
             "the reference's --optimizer-cpu-offload: 8 bytes a parameter off the GPUs); all "
             "(FSDP2's offload of the weights, gradients and AdamW: the least GPU memory, "
             "bound by PCIe); auto (the least of these the memory plan says fits the GPUs' "
             "free memory this round).")] = "none",
    trainer: Annotated[str, typer.Option(
        metavar="JOBS", help="Train on the resident ranks of `spade trainer JOBS` instead of "
                             "in this process (their --nproc is the ranks). Exit 77 if JOBS is "
                             "another user's or others can write to it.")] = "",
    nproc: Annotated[int, typer.Option(
        min=1, help="Train on this many local ranks (FSDP2: nccl on GPUs, gloo on CPU). Under "
                    "torchrun, leave it at 1: the ranks come from torchrun.")] = 1,
    seed: Seed = 0,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Train on rollouts (agent) and regret+design records (designer); emit train records.

    The checkpoint lands in CKPT_DIR/step-NNNNNN/ with its optimizer state; rerunning with the
    same inputs finds it and does not train again.

    Example:

        spade train-grpo runs/q/r00/rollout regret.jsonl -m runs/q/model --ckpt-dir runs/q/ckpt
    """
    import sys

    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.inputs import find_inputs
    from spade_cli.options import check_model
    from spade_cli.progress import Progress
    from spade_cli.summary import summarize
    import tempfile
    from contextlib import nullcontext
    from pathlib import Path

    from stages import train as stage
    from stages.backends import check_model_files
    from stages.train import OFFLOADS, parallel
    from stages.train import ranks as train_ranks
    from stages.shards import Stats, emit, read

    with errors_to_exit("train-grpo"):
        if not model:
            raise UsageError("--model is required")
        model = check_model(model)
        check_model_files(model)
        if batch_unit not in stage.BATCH_UNITS:
            raise UsageError(f"--batch-unit must be one of {', '.join(stage.BATCH_UNITS)}")
        if loss_norm not in stage.LOSS_NORMS:
            raise UsageError(f"--loss-norm must be one of {', '.join(stage.LOSS_NORMS)}")
        if not lora_targets.strip(" ,"):
            raise UsageError("--lora-targets: auto, or a comma list of module names")
        chosen = tuple(r.strip() for r in roles.split(",") if r.strip())
        if not chosen or set(chosen) - {"agent", "designer"}:
            raise UsageError("--roles takes agent, designer or both, comma-separated")
        cfg = stage.Config(lr=lr, weight_decay=weight_decay, clip_low=clip_low,
                           clip_high=clip_high, kl_beta=kl_beta,
                           kl_anchor=check_model(kl_anchor) if kl_anchor else None,
                           tis_cap=tis_cap,
                           batch_size=batch_size, batch_unit=batch_unit,
                           micro_batch_tokens=micro_batch_tokens,
                           loss_norm=loss_norm, epochs=epochs,
                           max_grad_norm=max_grad_norm, roles=chosen,
                           train_on_hinted=train_on_hinted, drop_env_errors=drop_env_errors,
                           mask_truncated=mask_truncated,
                           mask_malformed_tool_calls=mask_malformed_tool_calls,
                           lora_rank=lora_rank, lora_targets=lora_targets,
                           offload=offload,
                           gradient_checkpointing=gradient_checkpointing, seed=seed,
                           device=device)
        try:
            stage.check_start(model, cfg)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        layout = parallel.from_environment()
        if trainer and layout.sharded:
            raise UsageError("--trainer under torchrun: the trainer has its own ranks")
        if layout.sharded and nproc > 1:
            raise UsageError("--nproc under torchrun: torchrun already gives the ranks")
        if layout.sharded and "-" in inputs:
            raise UsageError("under torchrun, name the input shards: ranks cannot share stdin")
        if offload not in OFFLOADS:
            raise UsageError(f"--offload must be one of {', '.join(OFFLOADS)}")
        if lora_rank and (nproc > 1 or layout.sharded or offload in ("optimizer", "all")):
            raise UsageError("--lora-rank trains on one rank, without offload: drop --nproc "
                             "and --offload")
        kinds = {"rollout", "judgement", "regret", "design"}
        shards = find_inputs("train-grpo", inputs, kinds, "rollout, regret and design records")
        records = list(read([s.path for s in shards], kinds))
        stats = Stats(read=len(records))
        if trainer:
            world, _ = train_ranks.ready(Path(trainer))
            if nproc not in (1, world):
                raise UsageError(f"--nproc {nproc}: the trainer over {trainer} has {world} "
                                 f"ranks")
            trained, checkpoint, info = train_ranks.submit(Path(trainer), records, model,
                                                           ckpt_dir, cfg, round)
        elif nproc > 1:
            with tempfile.TemporaryDirectory(prefix="spade-train-ranks-") as work:
                trained, checkpoint, info = train_ranks.launch(nproc, records, model, ckpt_dir,
                                                               cfg, round, Path(work))
        else:
            shown = Progress("train-grpo", "steps") if layout.main else nullcontext()
            with shown as progress:
                trained, checkpoint, info = stage.run(
                    records, model, ckpt_dir, cfg, round=round, layout=layout,
                    on_step=progress.reached if progress else None)
        if not layout.main:  # the main rank writes the records; the others only trained
            return
        stats.extra["train"] = info
        if keep_last and checkpoint is not None:
            protect = [model, cfg.kl_anchor or stage.start_model(model)]
            pruned = stage.prune_checkpoints(ckpt_dir, keep_last, protect=protect)
            stats.extra["pruned"] = [p.name for p in pruned]
        config = {"model": model, "ckpt": str(checkpoint), "inputs": [s.digest() for s in shards]}
        emit("train-grpo", out, lambda _journal: iter(trained), config, stats, overwrite, f".{compress}")
        where = f"-> {checkpoint}" if checkpoint else "(no samples: no checkpoint)"
        parts = [f"{info['samples']} samples {info['roles']}, {len(trained)} steps {where}"]
        if info.get("parameters"):
            parts.append(f"trainable {count(info['trainable_parameters'])} of "
                         f"{count(info['parameters'])} parameters "
                         f"({info['trainable_parameters'] / info['parameters']:.2%})")
        if info["per_turn_fallbacks"]:
            parts.append(f"{info['per_turn_fallbacks']} plays trained turn by turn")
        if info.get("from_memory"):
            parts.append(f"started from the trainer's memory ({', '.join(info['from_memory'])})")
        parts += [f"{part} {t:.1f} s" for part, t in info.get("seconds", {}).items()]
        if info["skipped"]:
            parts.append("skipped " + ", ".join(f"{k} {v}" for k, v in info["skipped"].items()))
        summarize("train-grpo", stats, "; ".join(parts))
        if checkpoint is None:
            print("train-grpo: nothing to train on", file=sys.stderr)


def count(n: int) -> str:
    """1234567 -> 1.23M"""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
