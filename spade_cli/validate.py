"""`spade validate`: check designed env programs in the jail; accepted envs out, rejects too."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from spade_cli.options import Compress, Inputs, Out, Overwrite

log = logging.getLogger("spade.validate")


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def validate(
    inputs: Inputs = ["-"],
    out: Out = "-",
    workers: Annotated[int, typer.Option("--workers", "-w", min=1,
                                         help="Envs validated at once (one jail each).")] = 2,
    sandbox: Annotated[str, typer.Option(
        help="nsjail (default), or none: plain subprocesses, NOT a security boundary.")] = "nsjail",
    call_timeout: Annotated[float, typer.Option(help="Seconds one env call may take.")] = 5.0,
    memory_mb: Annotated[int, typer.Option(help="Memory limit per env worker (MiB).")] = 512,
    budget: Annotated[int, typer.Option(min=1, help="Seconds (wall and CPU) all checks of one "
                                                    "env may take together.")] = 60,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Validate design records (or hand-written .py env files) in the jail.

    Each input design becomes one `env` record (accepted) or one `validation` record naming
    the first failing check: extract, parse, structure, load, reset, determinism, garbage,
    step_types, oracle, trivial, resources, reset_gate.
    """
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.summary import summarize
    from sandbox.jail import Limits, Sandbox
    from stages import validate as stage
    from stages.shards import Stats, run_stage

    with errors_to_exit("validate"):
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        limits = Limits(call_timeout=call_timeout, memory_mb=memory_mb, lifetime=budget,
                        cpu_seconds=budget)
        cfg = stage.Config(workers=workers, sandbox=Sandbox(mode=sandbox, limits=limits))
        shards = input_shards(inputs, stage.designs_from_files)
        stats = Stats()
        config = {"sandbox": sandbox, "call_timeout": call_timeout, "memory_mb": memory_mb,
                  "budget": budget}
        run_stage("validate", shards, out, lambda designs: stage.run(designs, cfg, stats),
                  config, stats, kinds={"design"}, overwrite=overwrite, suffix=f".{compress}")
        accepted, rejected = stats.written["env"], stats.written["validation"]
        summarize("validate", stats, f"{stats.read} designs -> {accepted} envs, {rejected} "
                  f"rejected")


def input_shards(inputs: list[str], from_files):
    """Shards from paths, plus one in-memory shard for any hand-written .py env files."""
    from stages.shards import Shard, find_shards

    py_files: list[Path] = []
    shard_paths: list[str] = []
    for item in inputs:
        path = Path(item)
        if item.endswith(".py") and path.is_file():
            py_files.append(path)
        elif path.is_dir() and not find_shards([item]) and list(path.glob("*.py")):
            py_files.extend(sorted(path.glob("*.py")))
        else:
            shard_paths.append(item)
    shards = find_shards(shard_paths, {"design"}) if shard_paths else []
    if py_files:
        shards.append(Shard(path=str(py_files[0].parent), index=len(shards),
                            records=tuple(from_files(py_files))))
    return shards
