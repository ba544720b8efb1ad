"""`spade score-regret`: regret, win rate and the designer reward per env; memory update."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.options import Compress, Inputs, Out, Overwrite, Round


def register(app: typer.Typer) -> None:
    app.command("score-regret")(score_regret)


def score_regret(
    inputs: Inputs = ["-"],
    out: Out = "-",
    round: Round = 0,
    window: Annotated[int, typer.Option(min=1, help="k: rounds an env set lives; win is "
                                                     "measured over this many rounds.")] = 4,
    variant: Annotated[str, typer.Option(help="blend, solve_rate, regret or "
                                              "learning_potential.")] = "blend",
    regret_scale: Annotated[float, typer.Option(help="regret_n = clip(regret / this, 0, 1).")] = 0.15,
    regret_weight: Annotated[float, typer.Option(help="Blend weight of regret_n.")] = 0.4,
    plateau_weight: Annotated[float, typer.Option(help="Blend weight of plateau(win).")] = 0.6,
    variance_term: Annotated[bool, typer.Option(
        help="Add the solver-variance term exp(-(var - 0.25)^2 / 0.02) of the window's rewards "
             "to the designer's raw reward (the reference's tool-use 4B run).")] = False,
    band: Annotated[tuple[float, float], typer.Option(metavar="LOW HIGH", help="Win band where plateau is 1.")] = (0.4, 0.6),
    ramp: Annotated[tuple[float, float], typer.Option(metavar="LOW HIGH", help="Wins where plateau reaches 0.")] = (0.15, 0.85),
    chance_adjusted: Annotated[bool, typer.Option(
        "--chance-adjusted", help="Score the plateau on the win above the env's chance level "
                                  "(its blind win rate, from validation): (win - chance) / "
                                  "(1 - chance). An ablation: the paper scores the win itself.")] = False,
    invalid_penalty: Annotated[float, typer.Option(help="Designer reward of an env whose "
                                                        "plays mostly broke.")] = 0.0,
    reject_penalty: Annotated[float | None, typer.Option(
        help="Score rejected designs with this reward (they are then trained); by default "
             "they are discarded, as in the paper.")] = None,
    train_repairs: Annotated[bool, typer.Option(
        "--train-repairs", help="An env that a repair turn made pays the whole design "
                                "conversation its reward (loss on every designer turn); by "
                                "default it pays the turn-1 design 0, as the reference does.")] = False,
    scale_cap: Annotated[float, typer.Option(help="Cap of the designer advantage scale.")] = 50.0,
    memory: Annotated[str | None, typer.Option(metavar="PATH", help="Memory shard to update (needs the env "
                                                    "records among the inputs).")] = None,
    memory_out: Annotated[str | None, typer.Option(
        metavar="PATH", help="Write the updated memory here instead of in place (keeps rounds replayable); "
             "without --memory, the memory starts empty.")] = None,
    memory_cap: Annotated[int, typer.Option(help="Most entries the memory keeps.")] = 200,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Score each env from its hinted and no-hint plays; reads rollouts, envs, rejects.

    Writes one regret record per env (and per rejected design): regret, win rate, plateau,
    the designer's reward and advantage. With --memory, updates the designer's memory.

    Example:

        spade score-regret runs/q/r00/hint runs/q/r00/rollout* -o regret.jsonl
    """
    import os

    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.inputs import find_inputs
    from spade_cli.summary import summarize
    from stages import memory as store
    from stages import score_regret as stage
    from stages.records import Env
    from stages.rewards import VARIANTS, RewardConfig
    from stages.shards import Stats, emit, encode, read, unique, write_atomic

    with errors_to_exit("score-regret"):
        if variant not in VARIANTS:
            raise UsageError(f"--variant must be one of {', '.join(VARIANTS)}")
        rewards = RewardConfig(variant=variant, regret_scale=regret_scale,
                               regret_weight=regret_weight, plateau_weight=plateau_weight,
                               variance_term=variance_term, chance_adjusted=chance_adjusted,
                               band_low=band[0], band_high=band[1], ramp_low=ramp[0],
                               ramp_high=ramp[1], invalid_penalty=invalid_penalty,
                               reject_penalty=reject_penalty,
                               scale_cap=scale_cap)
        cfg = stage.Config(round=round, window=window, rewards=rewards,
                           train_repairs=train_repairs)
        kinds = {"rollout", "judgement", "env", "validation", "regret"}
        shards = find_inputs("score-regret", inputs, kinds,
                             "rollout, env, validation and regret records")
        stats = Stats()
        records = list(unique(read([s.path for s in shards], kinds), stats))
        stats.read = len(records)
        regrets, diagnostics = stage.run(records, cfg)
        stats.extra["diagnostics"] = diagnostics.as_dict()
        if diagnostics.internal:
            stats.reasons["internal_error"] = diagnostics.internal
        config = {"round": round, "window": window, "rewards": rewards.__dict__,
                  "train_repairs": train_repairs,
                  "inputs": [s.digest() for s in shards]}
        emit("score-regret", out, lambda _journal: iter(regrets), config, stats, overwrite,
             f".{compress}")
        if memory or memory_out:  # --memory-out alone starts from an empty memory
            envs = {r.id: r for r in records if isinstance(r, Env)}
            existing = list(read([memory], kinds={"memory"})) \
                if memory and os.path.exists(memory) else []
            # an env whose hint leaks, or that pays a shortcut, is no example to follow
            updated = store.update(existing, envs, [r for r in regrets
                                                    if r.env_id and not r.hint_leaks
                                                    and not r.shortcut], memory_cap)
            target = Path(memory_out or memory)
            target.parent.mkdir(parents=True, exist_ok=True)  # the run's first memory write
            write_atomic(target, encode(updated))
        d = diagnostics
        summarize("score-regret", stats,
                  f"{len(regrets)} envs scored, mean win {d.mean_win:.2f}, learnable "
                  f"{d.learnable_share:.0%}, regret mean {d.regret_mean:+.3f}, flat groups "
                  f"{d.zero_variance_share:.0%}, invalid {d.invalid}, hint leaks {d.hint_leaks}, "
                  f"shortcuts {d.shortcuts}, "
                  f"at chance {d.at_chance}")

