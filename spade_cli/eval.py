"""`spade eval`: score a model on an offline suite; eval records out, a summary table on stderr."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from spade_cli.options import (ApiKey, BackendName, BaseUrl, Compress, ContextLength, Device,
                               Out, Overwrite, PolicyName, PromptsDir, Round, SamplingSeed,
                               SamplingSeedMode, Seed, backend_spec)

SUITES = ("rg-hard", "rg-quick", "aime", "gpqa", "lcb", "bfcl-mt", "envs", "file")
DATA_SUITES = ("aime", "gpqa", "lcb", "file")
PROTOCOL = " (default: the suite's protocol)"


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)


def eval_command(
    suite: Annotated[str | None, typer.Option(
        "--suite", "-s", help=f"{', '.join(SUITES[:-1])} or {SUITES[-1]}.")] = None,
    inputs: Annotated[list[str] | None, typer.Argument(
        help="envs suite: env shards or directories ('-' for stdin).")] = None,
    out: Out = "-",
    data: Annotated[str | None, typer.Option(
        "--data", metavar="PATH",
        help="aime, gpqa, lcb, file: the local file in the benchmark's own format.")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="With --data: the suite name in records (default: the file's stem).")
    ] = None,
    compare: Annotated[tuple[str, str] | None, typer.Option(
        "--compare", metavar="BASE TRAINED",
        help="Compare two finished evals (output dirs or shards of the same suites): the "
             "paper's table, with paired 95% CIs. Runs no model.")] = None,
    episodes: Annotated[int | None, typer.Option(
        "--episodes", "-n", min=1, help="Samples per item" + PROTOCOL + ".")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, help="At most this many items per category.")] = None,
    sample: Annotated[int | None, typer.Option(
        "--sample", min=1, metavar="N",
        help="envs suite: play N of the input envs, drawn by --seed (the same envs for the "
             "same inputs and seed, in any order; a larger N keeps a smaller one's).")] = None,
    category: Annotated[list[str] | None, typer.Option(
        "--category", help="Keep only this category (repeatable): Math, base, a skill.")] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Conversations per model call (hf; vllm and openai take "
                                    "them all at once).")] = 32,
    max_steps: Annotated[int, typer.Option(
        "--max-steps", min=1, help="bfcl-mt: tool-calling replies per user turn before the "
                                   "entry is force-quit (BFCL uses 20).")] = 20,
    call_timeout: Annotated[float, typer.Option(
        "--call-timeout", help="Seconds one scoring or simulated-API request may take.")] = 30.0,
    sandbox: Annotated[str, typer.Option(
        help="envs, lcb: nsjail, or none (NOT a security boundary).")] = "nsjail",
    turn_timeout: Annotated[float, typer.Option(
        help="envs suite: seconds one env step may take.")] = 10.0,
    round: Round = 0,
    backend: BackendName = "hf",
    model: Annotated[str, typer.Option(
        "--model", "-m", metavar="PATH",
        help="Model directory (hf, vllm; a cached hub id `org/name` also works) or the "
             "server's model name (openai). Required, except with --compare.")] = "",
    policy: PolicyName = None,
    temperature: Annotated[float | None, typer.Option(
        help="Sampling temperature (0 = greedy)" + PROTOCOL + ".")] = None,
    top_p: Annotated[float | None, typer.Option(
        help="Nucleus sampling threshold" + PROTOCOL + ".")] = None,
    top_k: Annotated[int | None, typer.Option(
        help="Top-k sampling (0 = off)" + PROTOCOL + ".")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        help="Most tokens one completion may have" + PROTOCOL + ".")] = None,
    context_length: ContextLength = None,
    seed: Seed = 0,
    sampling_seed: SamplingSeed = SamplingSeedMode.request,
    prompts: PromptsDir = None,
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Evaluate a model on an offline suite: one eval record per item, roll-ups per category.

    Each suite runs under the reference's protocol (episodes, sampling) unless options say
    otherwise. --compare prints two finished evals side by side instead.

    Examples:

        spade eval --suite rg-quick -m runs/q/model -o runs/q/eval
        spade eval --suite envs held-out/ -m runs/q/model
        spade eval --suite envs --sample 32 runs/q/r00/hint -m runs/q/ckpt/step-000400
        spade eval --suite aime --data aime-2025.jsonl --name aime2025 -m M -o out/aime2025
        spade eval --compare base/eval-rg-hard runs/q/r399/eval-rg-hard
        spade eval --compare base/eval-rg-hard runs/q/r399/eval-rg-hard -o compare.json

    With --compare, `-o FILE` writes the comparison there instead of stdout (atomically): as
    JSON for a .json file (base, trained and one object per column), else the table as text.
    """
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.summary import summarize
    from stages.shards import Stats, emit

    with errors_to_exit("eval"):
        if compare:
            if suite or inputs or data:
                raise UsageError("--compare reads two finished evals: no --suite, --data or "
                                 "inputs")
            return print_comparison(*compare, out=out)
        if suite is None:
            raise UsageError("--suite is required (or --compare BASE TRAINED)")
        if suite not in SUITES:
            raise UsageError(f"--suite must be one of {', '.join(SUITES)}, not {suite!r}")
        if suite in DATA_SUITES and not data:
            raise UsageError(f"--suite {suite} needs --data PATH (a local file in the "
                             "benchmark's format; nothing is downloaded)")
        if suite not in DATA_SUITES and (data or name):
            raise UsageError(f"--data and --name belong to --suite {', '.join(DATA_SUITES)}")
        if inputs and suite != "envs":
            raise UsageError(f"positional inputs are env shards for --suite envs, not {suite}")
        if sample is not None and suite != "envs":
            raise UsageError(f"--sample draws env records for --suite envs, not {suite}")
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        if not model:
            raise UsageError("--model is required")
        spec = backend_spec(backend, model, base_url, api_key, device, context_length, policy)

        from dataclasses import replace

        from sandbox.jail import Limits, Sandbox
        from spade_cli.options import StageBackend
        from stages import evaluate as stage
        from stages import rollout
        from stages.records import seeded_sample
        from stages.shards import find_shards, read, unique

        stage.check_available(suite)  # exit 69 before a model is loaded
        protocol = stage.PROTOCOLS[suite]
        given = {"temperature": temperature, "top_p": top_p, "top_k": top_k,
                 "max_tokens": max_tokens}
        sampling = replace(protocol.sampling, per_request_seed=sampling_seed.per_request,
                           **{k: v for k, v in given.items() if v is not None})
        cfg = stage.Config(
            suite=suite, episodes=episodes, limit=limit, categories=tuple(category or ()),
            round=round, seed=seed, batch_size=batch_size, prompts_dir=prompts, data=data,
            name=name, max_steps=max_steps, call_timeout=call_timeout, sampling=sampling,
            rollout=rollout.Config(sandbox=Sandbox(mode=sandbox,
                                                   limits=Limits(call_timeout=turn_timeout))))
        if data:
            find_shards([data])  # exit 66 for a missing file before a model is loaded
        stats = Stats()
        records = []
        model_backend = StageBackend(spec)

        def produce(_journal):
            envs = None
            if suite == "envs":
                envs = list(unique(read(inputs or ["-"], kinds={"env"}), stats))
                stats.read = len(envs)
                if sample is not None:
                    envs = seeded_sample(envs, sample, seed)
            for record in stage.run(model_backend.get(), cfg, envs, stats):
                records.append(record)
                yield record

        config = {"suite": suite, "data": data, "name": name, "episodes": cfg.n_episodes,
                  "limit": limit, "category": sorted(category or ()), "max_steps": max_steps,
                  "round": round, "backend": backend, "model": model,
                  "temperature": sampling.temperature, "top_p": sampling.top_p,
                  "top_k": sampling.top_k, "max_tokens": sampling.max_tokens, "seed": seed,
                  **sampling_seed.config(), "prompts": prompts,
                  "inputs": [s.digest() or s.path for s in find_shards(
                      inputs or ([data] if data else []))]}
        if sample is not None:  # only when given: an eval made before --sample still resumes
            config["sample"] = sample
        with model_backend:
            emit("eval", out, produce, config, stats, overwrite=overwrite,
                 suffix=f".{compress}")
        keep_evaluated(model, out, suite)
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


def keep_evaluated(model: str, out: str, suite: str) -> None:
    """Mark a train-grpo checkpoint an eval used, so `train-grpo --keep-last` never prunes it."""
    from pathlib import Path

    from stages.train import KEEP_FILE, STATE_FILE

    if out != "-" and (Path(model) / STATE_FILE).exists():
        with open(Path(model) / KEEP_FILE, "a") as fh:
            fh.write(f"eval {suite}: {out}\n")


def print_comparison(base: str, trained: str, out: str = "-") -> None:
    """The paper's table: a column per benchmark and the average; rows base, trained, their
    difference and its paired 95% CI (percentile bootstrap over items). On stdout, or with
    `out` a file: written there atomically (JSON for `.json`, else the table as text)."""
    import io
    import json
    import sys
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from spade_cli.errors import UsageError
    from spade_cli.terminal import terminal_safe
    from stages import evaluate as stage
    from stages.shards import write_atomic

    if out != "-" and os.path.isdir(out):
        raise UsageError(f"-o {out}: --compare writes one file (.json, or the table as text), "
                         f"not a directory")
    columns = stage.compare(stage.read_runs(base), stage.read_runs(trained))
    if out != "-" and out.endswith(".json"):
        data = {"base": base, "trained": trained,
                "columns": [asdict(c) | {"difference": c.difference} for c in columns]}
        write_atomic(out, [json.dumps(data, indent=2).encode() + b"\n"])
        print(f"spade eval: comparison written to {out}", file=sys.stderr)
        return
    table = Table(title="spade eval --compare: scores in %, trained - base with a paired 95% "
                        "CI (bootstrap over items)", title_justify="left")
    table.add_column("")
    for column in columns:
        table.add_column(Text(terminal_safe(column.benchmark)), justify="right")
    rows = [(f"base: {base}", [f"{100 * c.base:.1f}" for c in columns]),
            (f"trained: {trained}", [f"{100 * c.trained:.1f}" for c in columns]),
            ("difference", [f"{100 * c.difference:+.1f}" for c in columns]),
            ("95% CI", [f"[{100 * c.low:+.1f}, {100 * c.high:+.1f}]" for c in columns]),
            ("items paired", [str(c.items) for c in columns]),
            ("items unpaired", [str(c.unpaired) for c in columns])]
    for label, cells in rows:
        table.add_row(*(Text(terminal_safe(cell)) for cell in (label, *cells)))
    if out == "-":
        Console(soft_wrap=True).print(table)
        return
    text = io.StringIO()
    Console(file=text, soft_wrap=True, width=200, color_system=None).print(table)
    write_atomic(out, [text.getvalue().encode()])
    print(f"spade eval: comparison written to {out}", file=sys.stderr)


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
