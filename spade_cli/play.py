"""`spade play`: a person plays an env in the terminal, turn by turn, in the agent's jail.

In: an env program (a `.py` file) or a shard holding env records (`--id` picks one by id
prefix); actions on stdin, one line per turn. A game line is sent as `\\boxed{line}` unless it
already holds a `\\boxed{...}` (then as a rollout sends it). A tool-use line is one of
    name key=value key2="some text"   a call of the env's tool `name` (shlex-split; a value is
                                      JSON when it parses as JSON, else text, and always text
                                      for a parameter of type string); checked against the
                                      tool's parameters first: a missing required or unknown
                                      argument is a one-line message, and no turn is spent
    {"name": ..., "arguments": {...}} raw JSON, sent as `<tool_call>{...}</tool_call>`
    done                              sent as `<answer>done</answer>` (unless a tool is so named)
    anything else                     sent as typed (`<tool_call>...</tool_call>`,
                                      `<answer>done</answer>`, or text the env will judge)
Out: on stdout the first observation (with the record's hint under `--hint`, as a hinted rollout
shows it), a tool-use env's tools, then per turn the env's observation, reward and flags, and
at the end the episode reward as `spade rollout` scores it (the last reward if the env
terminated, else 0).
Guarantees: the env runs only inside a jailed Worker with the rollout's limits (its lifetime
raised to an hour, for a person's pace); env text is made terminal-safe before it is printed;
the episode ends at termination, truncation, max_turns or the end of input. Exit codes: 0 the
episode ended, 2 usage, 65 the env failed (raised, hung, ran out of memory, broke the step
contract), 66 no such file or id, 69 no jail can start here, 130 interrupted.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from typing import IO, Annotated, Any

import typer

from spade_cli.terminal import terminal_safe

PLAY_LIFETIME = 3600  # seconds a play's jail lives: a person thinks slower than a model


class EnvFailed(Exception):
    """The env did not answer as the contract says (exit 65)."""


class BadLine(ValueError):
    """A typed tool call that does not fit the tool's parameters: said, not sent, no turn."""


@dataclass(frozen=True)
class Playable:
    name: str  # the file or the env id, for messages
    source: str
    hint: str | None


def register(app: typer.Typer) -> None:
    app.command("play")(play)


def play(
    env: Annotated[str, typer.Argument(metavar="ENV", help="A .py env file, or a shard (file "
                                            "or directory) holding env records.")],
    id_prefix: Annotated[str | None, typer.Option(
        "--id", help="Which env record of the shard to play (an id prefix is enough).")] = None,
    hint: Annotated[bool, typer.Option(
        "--hint/--no-hint", help="Append the record's hint to the first observation.")] = False,
    seed: Annotated[int, typer.Option(help="Seed passed to the env's reset.")] = 0,
    sandbox: Annotated[str, typer.Option(
        help="nsjail, or none (NOT a security boundary).")] = "nsjail",
) -> None:
    """Play an env yourself: read its observations, type one action per line (Ctrl-D stops).

    The env runs in the jail rollouts use. A game line is sent as `\\boxed{line}` unless it
    holds a `\\boxed{...}`. A tool-use line is `name key=value key2="some text"` (values
    parsed as JSON when they parse), raw `{"name": ..., "arguments": {...}}` JSON, `done`, or
    text sent as typed (`<tool_call>{...}</tool_call>`, `<answer>done</answer>`). Exit 0 when
    the episode ends, 65 when the env breaks.

    Examples:

        spade play docs/examples/guess_number.py --seed 3
        spade play runs/quickstart/r00/hint --id env_3f2a --hint
        printf 'list_rooms min_capacity=6\\ndone\\n' | spade play room_calendar.py
        printf '500\\n250\\n' | spade play docs/examples/guess_number.py
    """
    from dataclasses import replace

    from sandbox.jail import Sandbox, Worker
    from spade_cli.errors import DATA, UsageError, errors_to_exit
    from stages.rollout import Config

    with errors_to_exit("play"):
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        playable = load_playable(env, id_prefix)
        if hint and not playable.hint:
            raise UsageError(f"--hint: {playable.name} has no hint (env records get one from "
                             "`spade hint`)")
        limits = replace(Config().sandbox.limits, lifetime=PLAY_LIFETIME)
        try:
            with Worker(Sandbox(mode=sandbox, limits=limits)) as worker:
                Session(worker, sys.stdin, sys.stdout).play(playable, hint, seed)
        except EnvFailed as exc:
            print(terminal_safe(f"spade play: error: {playable.name}: {exc}"), file=sys.stderr)
            raise SystemExit(DATA) from None


def load_playable(path: str, id_prefix: str | None) -> Playable:
    from pathlib import Path

    from spade_cli.errors import UsageError
    from stages.shards import InputMissing, find_shards, read_shard

    if path == "-":
        raise UsageError("play reads your actions from stdin: give the env as a file")
    if path.endswith(".py"):
        if id_prefix is not None:
            raise UsageError("--id picks an env record from a shard, not from a .py file")
        if not Path(path).is_file():
            raise InputMissing(f"{path}: no such file")
        return Playable(path, Path(path).read_text(), None)
    envs = [record for shard in find_shards([path], {"env"}) for record in read_shard(shard)
            if record.kind == "env" and (id_prefix is None or record.id.startswith(id_prefix))]
    if not envs:
        which = f" with an id starting {id_prefix!r}" if id_prefix else ""
        raise InputMissing(f"{path}: no env record{which}")
    if len(envs) > 1:
        raise UsageError(f"{path}: {len(envs)} env records match; pick one with --id (e.g. "
                         f"--id {envs[0].id})")
    return Playable(envs[0].id, envs[0].source, envs[0].hint)


class Session:
    """One episode between a person (lines on `stdin`) and a jailed env."""

    def __init__(self, worker: Any, stdin: IO[str], stdout: IO[str]):
        self.worker, self.stdin, self.stdout = worker, stdin, stdout

    def play(self, playable: Playable, hint: bool, seed: int) -> None:
        from stages.rollout import MAX_TURNS_CAP

        facts = self.call("load", source=playable.source)
        domain = facts.get("domain", "game")
        turns = facts.get("max_turns")
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            turns = MAX_TURNS_CAP
        max_turns = min(turns, MAX_TURNS_CAP)
        observation, _info = self.call("reset", seed=seed)
        if hint:
            observation = f"{observation}\n\nHINT: {playable.hint}"
        how = ("a line is sent as \\boxed{line} unless it holds a \\boxed{...}" if domain == "game"
               else "type a call as: name key=value ...")
        self.say(f"{facts.get('class_name', '?')}: {domain}, seed {seed}, at most {max_turns} "
                 f"turns; {how}; Ctrl-D stops.\n")
        self.say(observation)
        self.tools: list[dict] = []
        if domain == "tool_use":
            self.tools = self.call("tools")
            self.say(tools_text(self.tools))
        self.finish(*self.turns(domain, max_turns))

    def turns(self, domain: str, max_turns: int) -> tuple[int, float, bool, str]:
        """Play until the episode ends; (turns played, last reward, terminated, why it ended)."""
        reward, played = 0.0, 0
        while played < max_turns:
            line = self.read_line(f"\nturn {played + 1}/{max_turns}> ")
            if line is None:
                return played, reward, False, "end of input"
            try:
                action = tool_action(line, self.tools) if domain == "tool_use" \
                    else game_action(line)
            except BadLine as exc:
                self.say(f"(not sent: {exc})")
                continue
            if action != line:
                self.say(f"(sent {action})")
            observation, reward, terminated, truncated, _info = self.call("step", action=action)
            played += 1
            self.say(observation)
            self.say(f"reward {reward:+.2f}  terminated {yes(terminated)}  truncated "
                     f"{yes(truncated)}")
            if terminated:
                return played, reward, True, "terminated"
            if truncated:
                return played, reward, False, "truncated by the env"
        return played, reward, False, f"max_turns ({max_turns}) reached"

    def finish(self, played: int, reward: float, terminated: bool, why: str) -> None:
        episode_reward = max(-1.0, min(1.0, reward)) if terminated else 0.0
        verdict = "won" if terminated and episode_reward > 0 else "not won"
        self.say(f"\nepisode over after {played} turns ({why}): {verdict}, episode reward "
                 f"{episode_reward:+.2f}")

    # -- talking to the env and to the person -------------------------------------------------
    def call(self, op: str, **fields: Any) -> Any:
        """The result of one request; the Worker has checked its types (sandbox/replies.py)."""
        from sandbox.jail import SandboxUnavailable

        reply = self.worker.call(op, **fields)
        error = reply.error or {}
        if reply.outcome == "sandbox_failure":
            raise SandboxUnavailable(error.get("msg", "sandbox failure"))
        if not reply.ok:
            detail = f"{error.get('type', '')}: {error.get('msg', '')}".strip(": ")
            raise EnvFailed(f"{op} failed ({reply.outcome}): {terminal_safe(detail)}")
        return reply.result

    def read_line(self, prompt: str) -> str | None:
        """The next non-blank line of input (without its newline), or None at its end."""
        while True:
            self.stdout.write(prompt)
            self.stdout.flush()
            line = self.stdin.readline()
            if not line:
                self.stdout.write("\n")
                return None
            if not self.stdin.isatty():  # piped input: show what was read, as a terminal would
                self.stdout.write(line if line.endswith("\n") else line + "\n")
            line = line.rstrip("\r\n")
            if line.strip():
                return line

    def say(self, text: str) -> None:
        self.stdout.write(terminal_safe(str(text)) + "\n")


def game_action(line: str) -> str:
    """What the env receives for a typed game line: a rollout's `\\boxed{}` normalisation."""
    from stages.rollout import game_action as boxed, last_boxed

    return boxed(line) if last_boxed(line) is not None else f"\\boxed{{{line.strip()}}}"


def tools_text(tools: list[dict]) -> str:
    """The tools as signature lines, and how to call one. Each tool is {"type": "function",
    "function": {"name": str, ...}} (the Worker checked that much); the rest is env data."""
    lines = ["\nTools:"]
    for tool in tools:
        spec = tool["function"]
        parameters = spec.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        required = parameters.get("required") if isinstance(parameters, dict) else None
        arguments = ", ".join(
            argument(name, schema, isinstance(required, list) and name in required)
            for name, schema in (properties.items() if isinstance(properties, dict) else []))
        lines.append(f"  {spec['name']}({arguments})  {spec.get('description', '')}")
    example = json.dumps({"name": "NAME", "arguments": {"key": "value"}})
    lines.append('Call one as: NAME key=value key2="some text" (or as '
                 f"<tool_call>{example}</tool_call>); finish with: done.")
    return "\n".join(lines)


def tool_action(line: str, tools: list[dict]) -> str:
    """What the env receives for a typed tool-use line (see the module docstring); raises
    BadLine for a `name key=value` call that does not fit the tool's parameters."""
    text = line.strip()
    if "<tool_call>" in text or "<answer>" in text:
        return line
    specs = {tool["function"]["name"]: tool["function"] for tool in tools}
    if text.startswith("{"):
        try:
            call = json.loads(text)
        except ValueError:
            return line  # not JSON after all: the env judges it, as a model's text
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            return tool_call(call["name"], call.get("arguments", {}))
        return line
    try:
        words = shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        raise BadLine(f"{exc}: quote a value with spaces, e.g. note=\"two words\"") from None
    if not words:
        return line
    if words[0] not in specs:
        return "<answer>done</answer>" if words == ["done"] else line
    return tool_call(words[0], typed_arguments(specs[words[0]], words[1:]))


def typed_arguments(spec: dict, words: list[str]) -> dict[str, Any]:
    """`key=value` words as a tool's arguments, checked against its parameter schema."""
    parameters = spec.get("parameters") if isinstance(spec.get("parameters"), dict) else {}
    properties = parameters.get("properties")
    properties = properties if isinstance(properties, dict) else None
    required = parameters.get("required")
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    name, arguments = spec["name"], {}
    for word in words:
        key, equals, raw = word.partition("=")
        if not equals or not key:
            raise BadLine(f"{name}: {word!r} is not key=value")
        if properties is not None and key not in properties:
            raise BadLine(f"{name} has no argument {key!r} (it takes "
                          f"{', '.join(properties) or 'none'})")
        schema = properties.get(key) if properties is not None else None
        arguments[key] = raw if isinstance(schema, dict) and schema.get("type") == "string" \
            else json_or_text(raw)
    missing = [key for key in required if key not in arguments]
    if missing:
        raise BadLine(f"{name} needs {', '.join(f'{key}=...' for key in missing)}")
    return arguments


def json_or_text(raw: str) -> Any:
    """`3` -> 3, `true` -> True, `[1, 2]` -> [1, 2]; anything that is not JSON stays text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def tool_call(name: str, arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def argument(name: str, schema: Any, required: bool) -> str:
    kind = schema.get("type", "?") if isinstance(schema, dict) else "?"
    return f"{name}: {kind}" if required else f"[{name}: {kind}]"


def yes(flag: Any) -> str:
    return "yes" if flag is True else "no"
