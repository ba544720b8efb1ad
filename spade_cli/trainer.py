"""`spade trainer`: train-grpo's ranks kept up across rounds, in the foreground, until stopped."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("trainer")(trainer)


def trainer(
    jobs: Annotated[str, typer.Argument(metavar="JOBS",
                                        help="A folder the ranks take jobs from (emptied).")],
    nproc: Annotated[int, typer.Option(min=1, help="Local ranks (FSDP2: nccl on GPUs, gloo on "
                                                   "CPU).")] = 1,
) -> None:
    """Keep train-grpo's ranks up: `spade train-grpo --trainer JOBS ...` trains on them.

    A round then costs no process start, rendezvous or checkpoint read: the ranks keep the state
    of the checkpoint they wrote last in host memory (the GPUs are left to the engine between
    rounds) and start the next round from it when it trains from that checkpoint, else from
    disk. The records are those a new `spade train-grpo` process writes. `spade run` starts one
    in server mode. Stops on Ctrl-C or when JOBS/stop appears; exit 69 if the ranks die.

    JOBS is made 0700, and jobs and outcomes are JSON (no pickles): a JOBS folder another user
    owns, or that its group or everyone can write to, is refused with exit 77, here and by
    `train-grpo --trainer JOBS`.

    Examples:

        spade trainer runs/q/trainer --nproc 8 &
        spade train-grpo runs/q/r00/rollout -m runs/q/model --ckpt-dir runs/q/ckpt --trainer runs/q/trainer
    """
    from pathlib import Path

    from spade_cli.errors import errors_to_exit
    from stages.train import ranks as train_ranks

    with errors_to_exit("trainer"):
        ranks = train_ranks.start(nproc, Path(jobs))
        try:
            code = ranks.wait()
        finally:
            train_ranks.stop(ranks, Path(jobs))
        if code:
            raise train_ranks.RanksFailed(f"the trainer's ranks exited with code {code}")
