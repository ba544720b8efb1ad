"""`spade show`: records as a person reads them (jq stays the tool for machines).

In: shards of any kind (files, directories, '-'); `--id` keeps the records whose id starts with
a prefix; `--limit N` stops after N records.
Out: on stdout, one view per record: a rollout as a transcript (hint, every turn's action,
observation and reward, then the outcome), an env as its verdict and its numbered source, a
validation reject as its verdict, a design as its prompt and completion, any other kind as
`key: value` lines. Rich styling on a terminal, plain text otherwise.
Guarantees: text from records (env output, model output, source) is made terminal-safe first,
so no control or escape sequence in it reaches the terminal and none is read as rich markup;
token ids and logprobs are counted, never dumped; records are read lazily, so `--limit` stops
reading early. The layout is for people and may change: scripts should use jq.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Iterable, Iterator

import typer

from spade_cli.options import Inputs
from spade_cli.terminal import terminal_safe

TOKEN_LISTS = ("prompt_ids", "completion_ids", "logprobs")


# -- a view: what to show, before deciding how ---------------------------------------------------

@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 1


@dataclass(frozen=True)
class Fields:
    pairs: list[tuple[str, str]]


@dataclass(frozen=True)
class Prose:
    label: str
    body: str


@dataclass(frozen=True)
class Code:
    label: str
    body: str


Block = Heading | Fields | Prose | Code


def register(app: typer.Typer) -> None:
    app.command("show")(show)


def show(
    inputs: Inputs = ["-"],
    id_prefix: Annotated[str | None, typer.Option(
        "--id", help="Show only records whose id starts with this (e.g. ro_3f2a).")] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Show at most this many records.")] = None,
) -> None:
    """Print records for a person to read (jq stays the tool for scripts).

    A rollout shows as a transcript (every turn's action, observation and reward, then the
    outcome), an env as its verdict and numbered source, a validation reject as its verdict, a
    design as its prompt and completion, anything else as key: value lines.

    Examples:

        spade show runs/quickstart/r00/rollout --limit 2
        spade show envs.jsonl --id env_3f2a
        spade seeds | spade validate | spade show --limit 1
    """
    import sys

    from spade_cli.errors import errors_to_exit
    from stages.shards import InputMissing, read

    with errors_to_exit("show"):
        chosen = pick(read(inputs), id_prefix, limit)
        if sys.stdout.isatty():
            from rich.console import Console

            shown = render_rich((view(record) for record in chosen), Console())
        else:
            shown = render_plain((view(record) for record in chosen), sys.stdout)
        if shown == 0 and id_prefix is not None:
            raise InputMissing(f"{', '.join(inputs)}: no record with an id starting "
                               f"{id_prefix!r}")


def pick(records: Iterable[Any], prefix: str | None, limit: int | None) -> Iterator[Any]:
    """The records whose id starts with `prefix`, at most `limit` of them, read no further."""
    shown = 0
    for record in records:
        if prefix is None or record.id.startswith(prefix):
            yield record
            shown += 1
            if limit is not None and shown >= limit:
                return


# -- views per kind -------------------------------------------------------------------------------

def view(record: Any) -> list[Block]:
    makers = {"rollout": rollout_view, "env": env_view, "validation": validation_view,
              "design": design_view}
    return makers.get(record.kind, generic_view)(record)


def rollout_view(record: Any) -> list[Block]:
    hint = record.meta.get("hint_text") if record.hint else None
    blocks: list[Block] = [
        Heading(f"rollout {record.id}  env {record.env_id}"),
        Fields([("hint", "yes" if record.hint else "no"), ("seed", str(record.seed)),
                ("round", str(record.round)), ("policy", record.policy or "-"),
                ("turns", str(len(record.turns)))])]
    if hint:
        blocks.append(Prose("hint", hint))
    for number, turn in enumerate(record.turns, 1):
        blocks.append(Heading(f"turn {number}  reward {turn.reward:+.2f}", level=2))
        if turn.completion and turn.completion != turn.action:
            blocks.append(Prose("completion", turn.completion))
        blocks += [Prose("action", turn.action), Prose("observation", turn.observation)]
    blocks.append(Fields([("outcome", outcome_line(record))]))
    return blocks


def outcome_line(record: Any) -> str:
    if not record.ok and record.error is not None:
        return f"{record.outcome}: {record.error.msg} (reward {record.reward:+.2f})"
    ending = ("terminated" if record.terminated else "truncated" if record.truncated
              else "stopped")
    verdict = "won" if record.terminated and record.reward > 0 else "not won"
    return f"{verdict}: {ending} after {len(record.turns)} turns, reward {record.reward:+.2f}"


def env_view(record: Any) -> list[Block]:
    pairs = [("verdict", "accepted: passed every validation check"),
             ("class", record.class_name), ("domain", record.domain),
             ("skill", record.skill or "-"), ("max_turns", str(record.max_turns))]
    if record.tools:
        pairs.append(("tools", ", ".join(tool_name(tool) for tool in record.tools)))
    pairs += [("parents", ", ".join(record.parents) or "-"), *file_pairs(record),
              *extra_pairs(record), *meta_pairs(record)]
    blocks: list[Block] = [Heading(f"env {record.id}"), Fields(pairs)]
    if record.hint:
        blocks.append(Prose("hint", record.hint))
    return blocks + [Code("source", record.source)]


def tool_name(tool: dict) -> str:
    function = tool.get("function")
    return str((function if isinstance(function, dict) else tool).get("name", "?"))


def validation_view(record: Any) -> list[Block]:
    message = record.error.msg if record.error else ""
    outcome = f" ({record.outcome})" if record.outcome != "ok" else ""
    pairs = [("verdict", f"rejected by {record.check}{outcome}: {message}"),
             ("domain", record.domain or "-"), ("skill", record.skill or "-"),
             ("design", ", ".join(record.parents) or "-"),
             ("round/slot/attempt", f"{record.round}/{record.slot}/{record.attempt}"),
             *file_pairs(record), *extra_pairs(record), *meta_pairs(record)]
    return [Heading(f"validation {record.id}"), Fields(pairs)]


def design_view(record: Any) -> list[Block]:
    pairs = [("domain", record.domain), ("skill", record.skill or "-"),
             ("round/slot/attempt", f"{record.round}/{record.slot}/{record.attempt}"),
             ("policy", record.policy or "-"), *token_pairs(record), *file_pairs(record),
             *extra_pairs(record), *meta_pairs(record)]
    if record.memory_ids:
        pairs.append(("memory", ", ".join(record.memory_ids)))
    blocks: list[Block] = [Heading(f"design {record.id}"), Fields(pairs)]
    if isinstance(record.prompt, str):
        blocks.append(Prose("prompt", record.prompt))
    else:
        blocks += [Prose(f"prompt ({message.get('role', '?')})", str(message.get("content", "")))
                   for message in record.prompt]
    return blocks + [Prose("completion", record.completion)]


def generic_view(record: Any) -> list[Block]:
    data = record.to_dict()
    pairs, long_texts = [], []
    for key, value in data.items():
        if key in ("kind", "v", "id", "meta"):
            continue
        if isinstance(value, str) and "\n" in value:
            long_texts.append(Prose(key, value))
        else:
            pairs += flatten(key, value)
    return [Heading(f"{record.kind} {record.id}"), Fields(pairs + meta_pairs(record)),
            *long_texts]


def flatten(key: str, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict) and value:
        return [pair for name, item in value.items() for pair in flatten(f"{key}.{name}", item)]
    return [(key, scalar(value))]


def scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 8 and all(isinstance(v, (int, float))
                                                          for v in value):
        return f"[{len(value)} numbers]"
    if isinstance(value, list):
        return ", ".join(scalar(item) for item in value) or "[]"
    return str(value)


def token_pairs(record: Any) -> list[tuple[str, str]]:
    return [(name, f"{len(getattr(record, name))} values") for name in TOKEN_LISTS
            if getattr(record, name, None)]


def file_pairs(record: Any) -> list[tuple[str, str]]:
    """The env file a record came from, for kinds that declare `source_path`."""
    path = getattr(record, "source_path", None) if "source_path" in type(record).model_fields \
        else None
    return [("file", path)] if path else []


def extra_pairs(record: Any) -> list[tuple[str, str]]:
    """Fields a newer stage or a jq annotation added that the model does not declare."""
    return [pair for key, value in (record.model_extra or {}).items()
            for pair in flatten(key, value)]


def meta_pairs(record: Any) -> list[tuple[str, str]]:
    return [pair for key, value in record.meta.items() for pair in flatten(f"meta.{key}", value)]


# -- renderers -------------------------------------------------------------------------------------

def render_plain(views: Iterable[list[Block]], out: Any) -> int:
    """Write every view as plain text; returns how many were written."""
    count = 0
    for blocks in views:
        out.write(("\n" if count else "") + "".join(plain(block) for block in blocks))
        count += 1
    return count


def plain(block: Block) -> str:
    if isinstance(block, Heading):
        text = terminal_safe(block.text)
        return f"=== {text} ===\n" if block.level == 1 else f"--- {text}\n"
    if isinstance(block, Fields):
        width = max((len(key) for key, _ in block.pairs), default=0)
        return "".join(f"{key.ljust(width)}  {terminal_safe(value)}\n"
                       for key, value in block.pairs)
    body = terminal_safe(block.body).splitlines() or [""]
    if isinstance(block, Prose) and len(body) == 1:
        return f"{block.label}: {body[0]}\n"
    if isinstance(block, Code):
        digits = len(str(len(body)))
        lines = [f"{n:>{digits}} | {line}" for n, line in enumerate(body, 1)]
    else:
        lines = body
    return f"{block.label}:\n" + "".join(f"    {line}\n" for line in lines)


def render_rich(views: Iterable[list[Block]], console: Any) -> int:
    """Print every view with rich (record text as Text, never as markup); returns the count."""
    count = 0
    for blocks in views:
        if count:
            console.print()
        for block in blocks:
            console.print(styled(block))
        count += 1
    return count


def styled(block: Block) -> Any:
    from rich.padding import Padding
    from rich.rule import Rule
    from rich.syntax import Syntax
    from rich.table import Table
    from rich.text import Text

    if isinstance(block, Heading):
        text = Text(terminal_safe(block.text), style="bold")
        return Rule(text, align="left") if block.level == 1 else text
    if isinstance(block, Fields):
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column()
        for key, value in block.pairs:
            grid.add_row(key, Text(terminal_safe(value)))
        return grid
    label = Text(f"{block.label}:", style="cyan")
    if isinstance(block, Prose) and "\n" not in block.body:
        return Text.assemble(label, " ", terminal_safe(block.body))
    if isinstance(block, Code):
        body: Any = Syntax(terminal_safe(block.body), "python", line_numbers=True,
                           word_wrap=True)
    else:
        body = Text(terminal_safe(block.body))
    grid = Table.grid()
    grid.add_row(label)
    grid.add_row(Padding(body, (0, 0, 0, 4)))
    return grid
