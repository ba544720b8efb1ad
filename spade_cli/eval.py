"""`spade eval`: score a model on an offline suite; eval records out, a summary table on stderr."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from spade_cli.options import (ApiKey, BackendName, BaseUrl, Compress, Device, MaxTokens, Model,
                               Out, Overwrite, PromptsDir, Round, Seed, Temperature, TopK, TopP,
                               backend_spec)

SUITES = ("rg-hard", "rg-quick", "bfcl-mt", "envs", "file")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)


def eval_command(
    suite: Annotated[str, typer.Option(
        "--suite", "-s", help="rg-hard, rg-quick, bfcl-mt, envs, or file.")],
    inputs: Annotated[list[str] | None, typer.Argument(
        help="envs suite: env shards or directories ('-' for stdin).")] = None,
    out: Out = "-",
    data: Annotated[str | None, typer.Option(
        "--data", help="file suite: a local JSONL with question and answer fields.")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="file suite: the suite name in records (default: the file's stem).")] = None,
    episodes: Annotated[int | None, typer.Option(
        "--episodes", "-n", min=1, help="Samples per item (default: rg-hard 8, rg-quick 2, "
                                        "envs 8, others 1).")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, help="At most this many items per category.")] = None,
    category: Annotated[list[str] | None, typer.Option(
        "--category", help="Keep only this category (repeatable): Math, base, a skill.")] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Conversations per model call.")] = 32,
    max_steps: Annotated[int, typer.Option(
        "--max-steps", min=1, help="bfcl-mt: tool-calling replies per user turn before the "
                                   "entry is force-quit (BFCL uses 20).")] = 20,
    call_timeout: Annotated[float, typer.Option(
        "--call-timeout", help="Seconds one scoring or simulated-API request may take.")] = 30.0,
    sandbox: Annotated[str, typer.Option(
        help="envs suite: nsjail, or none (NOT a security boundary).")] = "nsjail",
    turn_timeout: Annotated[float, typer.Option(
        help="envs suite: seconds one env step may take.")] = 10.0,
    round: Round = 0,
    backend: BackendName = "hf",
    model: Model = ...,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    max_tokens: MaxTokens = 1024,
    seed: Seed = 0,
    prompts: PromptsDir = None,
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Evaluate a model on an offline suite: one eval record per item, roll-ups per category.

    Examples:

        spade eval --suite rg-quick -m runs/q/model -o runs/q/eval
        spade eval --suite envs held-out/ -m runs/q/model
    """
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.summary import summarize
    from stages.shards import Stats, emit

    with errors_to_exit("eval"):
        if suite not in SUITES:
            raise UsageError(f"--suite must be one of {', '.join(SUITES)}, not {suite!r}")
        if suite == "file" and not data:
            raise UsageError("--suite file needs --data PATH (a JSONL with question and answer)")
        if suite != "file" and (data or name):
            raise UsageError("--data and --name belong to --suite file")
        if inputs and suite != "envs":
            raise UsageError(f"positional inputs are env shards for --suite envs, not {suite}")
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        spec = backend_spec(backend, model, base_url, api_key, device)

        from sandbox.jail import Limits, Sandbox
        from stages import evaluate as stage
        from stages import rollout
        from stages.backends import Sampling, load_backend
        from stages.shards import find_shards, read

        stage.check_available(suite)  # exit 69 before a model is loaded
        cfg = stage.Config(
            suite=suite, episodes=episodes, limit=limit, categories=tuple(category or ()),
            round=round, seed=seed, batch_size=batch_size, prompts_dir=prompts, data=data,
            name=name, max_steps=max_steps, call_timeout=call_timeout,
            sampling=Sampling(temperature=temperature, top_p=top_p, top_k=top_k,
                              max_tokens=max_tokens),
            rollout=rollout.Config(sandbox=Sandbox(mode=sandbox,
                                                   limits=Limits(call_timeout=turn_timeout))))
        stats = Stats()
        records = []

        def produce():
            envs = None
            if suite == "envs":
                envs = list(read(inputs or ["-"], kinds={"env"}))
                stats.read = len(envs)
            for record in stage.run(load_backend(spec), cfg, envs, stats):
                records.append(record)
                yield record

        config = {"suite": suite, "data": data, "name": name, "episodes": cfg.n_episodes,
                  "limit": limit, "category": sorted(category or ()), "max_steps": max_steps,
                  "round": round, "backend": backend, "model": model,
                  "temperature": temperature, "top_p": top_p, "top_k": top_k,
                  "max_tokens": max_tokens, "seed": seed, "prompts": prompts,
                  "inputs": [s.digest() or s.path for s in find_shards(inputs or [])]}
        emit("eval", out, produce, config, stats, overwrite=overwrite, suffix=f".{compress}")
        if not records and os.path.isdir(out):  # a rerun that found the work done
            records = list(read([out], kinds={"eval"}))
        rows = stage.summary_rows(records)
        print_table(rows)
        items = sum(1 for r in records if r.task)
        overall = next((r for r in rows if r[1] == stage.OVERALL), None)
        headline = f"{cfg.suite_name}: {items} items"
        if overall:
            headline += f", overall {overall[3]:.3f}"
        summarize("eval", stats, headline)


def print_table(rows) -> None:
    """The roll-ups as a table on stderr."""
    if not rows:
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from spade_cli.terminal import terminal_safe

    table = Table(title="spade eval", title_justify="left")
    for column, justify in (("suite", "left"), ("category", "left"), ("n", "right"),
                            ("score", "right"), ("95% CI", "right")):
        table.add_column(column, justify=justify)
    for suite, category, n, score, low, high in rows:
        ci = "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"
        # Text cells: a category can be an env's skill, never to be read as rich markup
        table.add_row(*(Text(terminal_safe(cell)) for cell in (
            suite, category, str(n), f"{score:.3f}", ci)))
    Console(stderr=True, soft_wrap=True).print(table)
