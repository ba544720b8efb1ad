"""`spade validate`: check designed env programs in the jail; accepted envs out, rejects too."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from spade_cli.options import Address, Compress, ExecutorName, Out, Overwrite

log = logging.getLogger("spade.validate")
READS = "design records and .py files"


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def validate(
    inputs: Annotated[list[str], typer.Argument(
        metavar="INPUT", help="Design shards (.jsonl, .jsonl.gz, .jsonl.zst) or directories "
                                 "of them, hand-written .py env files or directories of them, "
                                 "or '-' for stdin.")] = ["-"],
    out: Out = "-",
    workers: Annotated[int, typer.Option("--workers", "-w", min=1,
                                         help="Envs validated at once (two jails each); across the "
                                              "cluster with --executor ray.")] = 2,
    sandbox: Annotated[str, typer.Option(
        help="nsjail (default), or none: plain subprocesses, NOT a security boundary.")] = "nsjail",
    call_timeout: Annotated[float, typer.Option(help="Seconds one env call may take.")] = 5.0,
    memory_mb: Annotated[int, typer.Option(help="Memory limit per env worker (MiB).")] = 512,
    budget: Annotated[int, typer.Option(min=1, help="Seconds (wall and CPU) all checks of one "
                                                    "env may take together.")] = 60,
    seed: Annotated[int | None, typer.Option(
        help="Base of the validation seeds, for a reproducible validation (default: fresh "
             "seeds for every design, recorded in each record's meta.validation.seed).")] = None,
    allow_all_rejected: Annotated[bool, typer.Option(
        "--allow-all-rejected", help="Exit 0 even when every design is rejected (`spade run` "
                                     "sets it: rejects are data for the designer).")] = False,
    executor: ExecutorName = "local",
    address: Address = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Validate design records (or hand-written .py env files) in the jail.

    Each input design becomes one `env` record (accepted) or one `validation` record naming
    the first failing check: extract, parse, structure, load, reset, determinism, garbage,
    step_types, oracle, trivial, resources, reset_gate. Each record lists the seeds it was
    validated with; `--seed` with its meta.validation.seed replays that validation. A
    hand-written file's verdict is also one line on stderr, and its records name it in
    `meta.source_file`.

    Exit status: 0 when an env is accepted (or there was nothing to read); 65 when every design
    is rejected, so `spade validate my_env.py && ...` stops at a broken env (the rejects are
    still written).

    Examples:

        spade validate my_env.py
        spade seeds | spade validate -o runs/seeds/
        spade validate runs/q/r00/design-a0 -o runs/q/r00/validate-a0 --allow-all-rejected
        spade validate designs/ -o envs/ --executor ray --address head:6379 -w 64
    """
    from spade_cli.errors import DATA, UsageError, errors_to_exit
    from spade_cli.options import open_jail_executor
    from spade_cli.progress import Progress
    from spade_cli.summary import summarize
    from sandbox.jail import Limits, Sandbox
    from stages import validate as stage
    from stages.shards import Stats, run_stage

    with errors_to_exit("validate"):
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        limits = Limits(call_timeout=call_timeout, memory_mb=memory_mb, lifetime=budget,
                        cpu_seconds=budget)
        if executor == "local" and sandbox == "nsjail":
            from sandbox.pool import fit_concurrency
            from spade_cli.summary import log_line

            fitted, warning = fit_concurrency(workers, memory_mb, jails_each=2, what="--workers")
            if warning:
                log_line(f"spade validate: warning: {warning}", echo=True)
                workers = fitted  # the config digest does not hold workers: resumes
        cfg = stage.Config(workers=workers, sandbox=Sandbox(mode=sandbox, limits=limits),
                           seed=seed)
        shards = input_shards(inputs, stage.designs_from_files)
        shown = logging.getLogger().getEffectiveLevel() <= logging.INFO
        stats = Stats()
        config = {"sandbox": sandbox, "call_timeout": call_timeout, "memory_mb": memory_mb,
                  "budget": budget, "seed": seed}
        progress = Progress("validate", "designs")
        jobs = open_jail_executor(executor, address, workers)

        def transform(designs):
            designs = list(designs)
            progress.add_total(len(designs))
            for design, record in zip(designs, stage.run(designs, cfg, stats, jobs)):
                progress.advance()
                if shown and "source_file" in design.meta:
                    print(verdict(design.meta["source_file"], record), file=sys.stderr)
                yield record

        with jobs, progress:
            run_stage("validate", shards, out, transform, config, stats, kinds={"design"},
                      overwrite=overwrite, suffix=f".{compress}")
        no_oracle = stats.extra.get("envs_without_oracle", 0)
        summarize("validate", stats, f"{stats.read} designs -> {stats.written['env']} envs"
                  f"{f' ({no_oracle} with oracle: none)' if no_oracle else ''}, "
                  f"{stats.written['validation']} rejected{turn_yields(stats)}")
        accepted, rejected = output_counts(out, stats)
        if rejected and not accepted and not allow_all_rejected:
            print(f"spade validate: error: every design was rejected ({rejected}); "
                  f"--allow-all-rejected exits 0 instead", file=sys.stderr)
            raise SystemExit(DATA)


def turn_yields(stats) -> str:
    """`; accepted by designer turn: 1 0/2, 2 2/2` when repairs were validated, else nothing."""
    by_turn = stats.extra.get("by_turn", {})
    if set(by_turn) <= {"1"}:
        return ""
    return "; accepted by designer turn: " + ", ".join(
        f"{turn} {c['envs']}/{c['designs']}" for turn, c in sorted(by_turn.items(),
                                                                 key=lambda kv: int(kv[0])))


def verdict(source_file: str, record) -> str:
    """One line per hand-written env: `my_env.py: rejected by oracle: <why>`."""
    from spade_cli.terminal import terminal_safe

    if record.kind == "env" and record.meta.get("oracle") == "none":
        return terminal_safe(f"{source_file}: accepted ({record.id}; oracle: none, it has no "
                             "solution())")
    if record.kind == "env":
        return terminal_safe(f"{source_file}: accepted ({record.id})")
    why = " ".join((record.error.msg if record.error else record.outcome).split())
    return terminal_safe(f"{source_file}: rejected by {record.check}: {why[:300]}")


def output_counts(out: str, stats) -> tuple[int, int]:
    """(accepted, rejected) in the whole output, shards finished by an earlier run included."""
    from stages.shards import MANIFEST

    if not stats.skipped_shards:
        return stats.written["env"], stats.written["validation"]
    counts: Counter = Counter()
    manifest = json.loads((Path(out) / MANIFEST).read_text())
    for shard in manifest["shards"].values():
        for name, lines in shard["outputs"].items():
            counts[name.split("-", 1)[0]] += lines
    return counts["env"], counts["validation"]


def input_shards(inputs: list[str], from_files):
    """Shards from paths, plus one in-memory shard for any hand-written .py env files."""
    from spade_cli.inputs import find_inputs
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
    shards = find_inputs("validate", shard_paths, {"design"}, READS,
                         others=bool(py_files)) if shard_paths else []
    if py_files:
        shards.append(Shard(path=str(py_files[0].parent), index=len(shards),
                            records=tuple(from_files(py_files))))
    return shards
