"""`spade registry index|export` and `spade lineage`: the cross-run registry on the command line.

In: run directories to index, an id to trace, filters to export by; the registry is
`--db PATH`, by default $SPADE_REGISTRY or `./spade-registry.db`.
Out: `index` a one-line summary on stderr; `lineage` the chain of one id as text (or `--json`)
on stdout; `runs` each run's spade version, validator and reward digests and where they changed; `export` an env shard (`-o DIR` gives `env-00000.jsonl` and `_manifest.json`).
Guarantees: exit codes as in spade_cli/errors.py; an id the registry does not hold is one
line on stderr and exit 2; a registry that does not exist (lineage, export) is exit 66.
"""

from __future__ import annotations

from contextlib import closing
from typing import Annotated, Any

import typer

from spade_cli.options import Out

registry_app = typer.Typer(no_args_is_help=True,
                           help="Index runs into one SQLite registry; export its envs.")

Db = Annotated[str | None, typer.Option(
    "--db", metavar="PATH",
    help="The registry database (default: $SPADE_REGISTRY, else ./spade-registry.db).")]


def register(app: typer.Typer) -> None:
    app.add_typer(registry_app, name="registry")
    app.command("lineage")(lineage)


@registry_app.command("index")
def index(
    run_dirs: Annotated[list[str], typer.Argument(metavar="RUN_DIR",
                                                  help="Run directories (runs/<name>).")],
    db: Db = None,
) -> None:
    """Index run directories: designs, envs, validations, hints, plays, regrets, train steps,
    checkpoints and evals, with their lineage.

    Only complete shards are read (their manifest lists them); a shard still being written is
    left for the next `index`, which also skips everything already indexed, so it is safe to
    run again and again beside a running `spade run`. An env or design whose id is not its
    content's (`path:line: id does not match its content`) stops the index, exit 65, before
    its shard is stored. The registry is `--db`, by default
    $SPADE_REGISTRY, else ./spade-registry.db: one registry for every run you index.

    Examples:

        spade registry index runs/quickstart
        spade registry index runs/a runs/b --db ~/spade-registry.db
    """
    from spade_cli.errors import errors_to_exit
    from spade_cli.summary import log_line
    from stages.registry import connect, default_db
    from stages.registry.index import index_runs

    with errors_to_exit("registry index"):
        path = db or default_db()
        with closing(connect(path)) as con:
            report = index_runs(con, run_dirs)
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(report.records.items()))
        log_line(f"registry index: {report.indexed} shards indexed ({kinds or 'no records'}), "
                 f"{report.unchanged} unchanged, {report.pending} not complete yet -> {path}",
                 echo=True)


def lineage(
    some_id: Annotated[str, typer.Argument(
        metavar="ID", help="An env, design or eval id, or a checkpoint's directory or name.")],
    db: Db = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Where an env, design, checkpoint or eval came from and what it fed, both ways.

    An env: its designs (corpus doc, prompt, attempt), validation verdict and checks, hints,
    plays per round and policy, regret and designer reward per round, the train steps its plays
    fed, those checkpoints and their evals. A checkpoint: the train steps that made it, the
    envs and rounds they trained on, its evals, the checkpoints after it. An id the
    registry does not hold: exit 2.

    Examples:

        spade lineage env_588d5a95682d612b
        spade lineage runs/quickstart/ckpt/step-000012 --json | jq '.trained_on_envs'
    """
    import orjson

    from spade_cli.errors import UsageError, errors_to_exit
    from stages.registry import connect, default_db
    from stages.registry.lineage import UnknownId, lineage as trace

    with errors_to_exit("lineage"):
        with closing(connect(db or default_db(), create=False)) as con:
            try:
                found = trace(con, some_id)
            except UnknownId as exc:
                raise UsageError(str(exc)) from None
        if as_json:
            print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
        else:
            print("\n".join(render(found)))


@registry_app.command("runs")
def runs(
    db: Db = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array on stdout.")] = False,
) -> None:
    """Which spade version, validator and reward judged and scored each run, and where they
    changed: `changed` names what differs from the run listed before it, `mixed` what changed
    within the run (resumed under other code or settings).

    The validator and reward are digests of the code and settings that decide a verdict or a
    score (stages/provenance.py), stamped in every shard's manifest entry; two runs with the
    same digests were judged and scored alike.

    Examples:

        spade registry runs
        spade registry runs --json | jq '.[] | select(.changed | index("reward"))'
    """
    import orjson

    from spade_cli.errors import errors_to_exit
    from stages.registry import connect, default_db
    from stages.registry.runs import run_provenance

    with errors_to_exit("registry runs"):
        with closing(connect(db or default_db(), create=False)) as con:
            found = run_provenance(con)
        if as_json:
            print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
        elif found:
            from spade_cli.terminal import terminal_safe

            rows = [{key: ",".join(value) or "-" if isinstance(value, list) else value
                     for key, value in run.items() if key != "path"} for run in found]
            print("\n".join(terminal_safe(line) for line in _table(rows, "")))


@registry_app.command("export")
def export(
    out: Out = "-",
    min_regret: Annotated[float | None, typer.Option(
        "--min-regret", metavar="X", help="Only envs whose mean regret is at least X.")] = None,
    skill: Annotated[str | None, typer.Option(help="Only envs of this skill.")] = None,
    domain: Annotated[str | None, typer.Option(help="Only game or tool_use envs.")] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, metavar="N", help="At most N envs (highest regret first).")] = None,
    rounds: Annotated[str | None, typer.Option(
        metavar="A-B", help="Only envs first accepted in these rounds (A-B, or N).")] = None,
    sample: Annotated[int | None, typer.Option(
        min=1, metavar="N", help="N envs drawn by --seed (instead of --limit).")] = None,
    seed: Annotated[int, typer.Option(help="The seed of --sample.")] = 0,
    db: Db = None,
) -> None:
    """Accepted envs, one per program, with their statistics in `meta.registry`, as an env
    shard any stage plays (`spade rollout OUT`).

    An env's round is the earliest round directory holding one of its env records. `--sample
    N --seed S` draws the same N envs from the same registry contents, whatever order they were
    indexed in: e.g. the early envs a later checkpoint plays again (`spade eval --suite envs`).
    A bad --rounds, or --limit with --sample, is exit 2.

    Examples:

        spade registry export --min-regret 0.2 --domain game --limit 50 -o hard-envs
        spade rollout --model MODEL --no-hint -o plays hard-envs
        spade registry export --rounds 0-3 --sample 16 --seed 0 -o early-envs
        spade eval --suite envs --model runs/quickstart/ckpt/step-000012 -o retained early-envs
    """
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.summary import summarize
    from stages.registry import connect, default_db
    from stages.registry.export import Filters, export_envs, parse_rounds
    from stages.shards import Stats, emit

    with errors_to_exit("registry export"):
        try:
            filters = Filters(min_regret, skill, domain, limit,
                              parse_rounds(rounds) if rounds is not None else None, sample, seed)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        with closing(connect(db or default_db(), create=False)) as con:
            envs = list(export_envs(con, filters))
        stats = Stats()
        config = {"db": db, "min_regret": min_regret, "skill": skill, "domain": domain,
                  "limit": limit, "rounds": filters.rounds, "sample": sample, "seed": seed}
        emit("registry-export", out, lambda _journal: iter(envs), config, stats, overwrite=True)
        summarize("registry export", stats, f"{stats.written['env']} envs")


def render(found: dict[str, Any], indent: str = "") -> list[str]:
    """A lineage dict as terminal text: a heading per section, a table per list of rows."""
    from spade_cli.terminal import terminal_safe

    lines = [f"{indent}{found['kind']} {found['id']}"]
    for name, value in found.items():
        if name not in ("kind", "id"):
            lines.extend(_section(name, value, indent + "  "))
    return [terminal_safe(line) for line in lines]


def _section(name: str, value: Any, indent: str) -> list[str]:
    if isinstance(value, dict) and value.get("kind") and value.get("id"):  # a nested lineage
        return [f"{indent}{name}:"] + render(value, indent + "  ")
    if isinstance(value, dict):
        nested = {k: v for k, v in value.items() if isinstance(v, list) and v
                  and isinstance(v[0], dict)}
        flat = {k: v for k, v in value.items() if k not in nested}
        return [f"{indent}{name}: {_fields(flat)}"] + [
            line for key, rows in nested.items() for line in _section(key, rows, indent + "  ")]
    if not isinstance(value, list):
        return [f"{indent}{name}: {_short(value)}"]
    if not value:
        return [f"{indent}{name}: none"]
    head = f"{indent}{name} ({len(value)}):"
    if all(isinstance(v, dict) and not v.get("kind") for v in value):
        return [head] + _table(value, indent + "  ")
    lines = [head]
    for item in value:
        lines.extend(render(item, indent + "  ") if isinstance(item, dict)
                     else [f"{indent}  {_short(item)}"])
    return lines


def _table(rows: list[dict[str, Any]], indent: str) -> list[str]:
    """Rows of scalars as aligned columns; nested values (a verdict's checks) on their line."""
    columns = [key for key in rows[0] if any(
        row.get(key) is not None and not isinstance(row.get(key), (dict, list)) for row in rows)]
    cells = [[_short(row.get(key), 40) if row.get(key) is not None else "-" for key in columns]
             for row in rows]
    widths = [max(len(key), *(len(row[i]) for row in cells)) for i, key in enumerate(columns)]
    lines = [indent + "  ".join(key.ljust(w) for key, w in zip(columns, widths)).rstrip()]
    for row, cell in zip(rows, cells):
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip())
        extra = {k: v for k, v in row.items() if isinstance(v, (dict, list)) and v}
        if extra:
            lines.append(f"{indent}  {_fields(extra)}")
    return lines


def _fields(row: dict[str, Any]) -> str:
    return "  ".join(f"{key}={_short(value)}" for key, value in row.items()
                     if value is not None and value != [] and value != {})


def _short(value: Any, width: int = 100) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        import orjson

        value = orjson.dumps(value).decode()
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[:width - 1] + "…"
