"""Recipes: a TOML file that chains the stage commands into SPADE's co-training loop.

In: `recipe.toml` (schema `spade.recipe/v1`): `name`, `run_dir`, `rounds`, `seed`, `[model]`,
`[defaults]`, optionally `[serve]` and `[designer]` (below), an ordered `[[stage]]` list whose
keys are the subcommand's own options (plus the runner's keys `command`, `every`, `attempts`,
`args`, on the design stage `repair`, and on the eval stage `retention`).
Out: per round, the `spade ...` command lines the loop needs, wired through the run directory:
`RUN/r<NN>/<stage>/` shard dirs, `RUN/ckpt/step-NNNNNN/`, `RUN/memory/`, `RUN/recipe.json`.
Guarantees: a recipe never does what the CLI can't: `--dry-run` prints exactly the commands the
runner executes (in server mode also `spade serve` and, as curl lines, the HTTP calls that put
the engine to sleep and load each new checkpoint); every command resumes from its own manifests
and the runner skips finished rounds (`r<NN>/_round.json`, written only once every stage the
round called left a complete manifest in its output folder: `Loop.outputs`), and every input
of a round is the output of an earlier command
(memory snapshots per round), so a killed run, run again, ends with the records an
uninterrupted run writes.

A recipe is a file someone else may have written: a stage's `args` are read as its command
reads them and may not set what the runner sets (the wired options in any spelling, `-o` as
`--out`, or one more input): exit 65, as for a stage key. What it may do only when the `spade
run` command line consents (`check_consent`): play envs without a jail (`sandbox = "none"`:
--unsafe-no-sandbox) and bind its server off loopback (`[serve] args`: --allow-remote).

The loop (k = the design stage's `every`): a round r starts an env set when r % k == 0: design
(with up to `attempts` design/validate passes: later passes redesign only rejected slots,
afresh, or with `repair = true` as the next turn of each rejected design's conversation),
validate, hint, hinted rollouts. Every round: no-hint rollouts, score-regret (regret from the
set's hinted round, win over the window), train-grpo (agent samples of this round; a set's
designer samples at round t + k, k rounds after they were drawn, with the score of the set's
last round; the final round flushes the open set). Eval every
`every` rounds of the eval stage.

Retention (`retention = N` on the eval stage): at every eval point the runner also runs
`spade eval --suite envs --sample N` over the envs round 0 played (its hinted set, or its
accepted envs and the start pool), drawn by the recipe's seed, with that round's model, into
RUN/r<NN>/eval-retention/ (with the recipe's [defaults]; the eval stage's own options are its
suite's). Round 0's envs are never rewritten and the sample depends on their ids and the seed
alone, so every eval point plays the same envs, and the report can draw how the first envs are
played as training goes on.

A separate designer (a `[designer]` table: `backend` openai, vllm or hf, `base-url` for openai,
`model`, `api-key-env`): design, hint and audit ask that model (`--backend B [--base-url URL]
--model M --policy NAME`, so their records name it) instead of the run's model or server, and
never the key: the runner hands the stage the key as OPENAI_API_KEY in its environment, read
from the variable `api-key-env` names (spade_cli/run.py). Rollout, train-grpo and eval keep
the run's model. Such a designer is frozen: train-grpo gets `--roles agent` and no design
shards, so no designer sample trains.

Server mode (a `[serve]` table: `python`, `port`, `args`, `sleep`, `start-timeout`,
`restarts`, `request-timeout`, and the engine's layout `data-parallel`, `tensor-parallel`, `expert-parallel`): one
vLLM server holds the policy for the whole run; every generating stage (but those a
`[designer]` answers) reaches it with `--backend openai --base-url URL --model spade-policy
--policy CKPT` instead of loading its own engine, and train-grpo still trains the checkpoint directory in-process. The layout: the engine
uses data-parallel x tensor-parallel GPUs (replicas of tensor-parallel GPUs each, vLLM's
`--data-parallel-size` and `--tensor-parallel-size`), and `expert-parallel = true` spreads a MoE
model's experts over all of them (`--enable-expert-parallel`); it is said there only, never also
in `args`. Every sleep and reload reaches every replica (stages/serve.py). The runner owns the
server (spade_cli/run.py); the Loop only wires the stages' arguments. The paper recipes serve by
default, over the 8 GPUs of one node as the reference lays out its engines.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cache
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Callable, Union, get_args, get_origin, get_type_hints

from stages.records import RecordError

SCHEMA = "spade.recipe/v1"
# what a recipe may say outside its [[stage]] tables: top-level keys, and the tables' keys
TOP_KEYS = ("schema", "name", "run_dir", "rounds", "seed", "start_pool", "memory", "memory_seed")
TABLES = ("model", "defaults", "serve", "designer", "stage")
MODEL_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "init": (lambda v: isinstance(v, str) and v != "", "a model name or directory"),
    "path": (lambda v: isinstance(v, str) and v != "", "a directory"),
    "seed": (lambda v: _int(v), "an integer"),
    "hidden": (lambda v: _positive_int(v), "an integer of at least 1"),
    "layers": (lambda v: _positive_int(v), "an integer of at least 1"),
}
BUILTIN_MODELS = ("tiny", "smollm2", "coder")  # `[model] init` values `spade model` builds
RUNNER_KEYS = {"command", "every", "attempts", "args", "retention", "repair"}
RETENTION = "retention"  # the eval stage's runner key
REPAIR = "repair"  # the design stage's runner key: later attempts repair, not retry
COMMANDS = ("design", "validate", "audit", "hint", "rollout", "score-regret", "train-grpo",
            "eval")
# Options the runner sets itself, per command: a recipe must not set them.
WIRED = {"design": {"round", "every", "model", "out", "retry", "memory"},
         "validate": {"out", "allow-all-rejected"}, "audit": {"designs", "model", "out"},
         "hint": {"model", "out"},
         "rollout": {"round", "model", "out", "hint", "blacklist-from"},
         "score-regret": {"round", "window", "out", "memory", "memory-out"},
         "train-grpo": {"round", "model", "out", "ckpt-dir", "trainer"},
         "eval": {"round", "model", "out"}}
TRAINER_JOBS = "trainer"  # RUN/trainer: where, in server mode, train-grpo's resident ranks wait
# The stages that generate: in server mode they reach the run's server, so the runner sets how.
GENERATING = ("design", "audit", "hint", "rollout", "eval")
SERVER_WIRED = {"backend", "base-url", "api-key", "policy"}
# The stages a `[designer]` table answers for, and what the runner then sets itself: how they
# reach the designer, and train-grpo's roles (a separate designer is frozen: the agent alone)
DESIGNER_COMMANDS = ("design", "hint", "audit")
DESIGNER_WIRED = {**{command: {"backend", "base-url", "api-key", "policy"}
                     for command in DESIGNER_COMMANDS}, "train-grpo": {"roles"}}
KEY_VARIABLE = "OPENAI_API_KEY"  # what the stages' --api-key defaults to (spade_cli/options.py)
DESIGNER_BACKENDS = ("openai", "vllm", "hf")
# [designer] key -> (whether a value fits, what fits, said in an error)
DESIGNER_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "backend": (lambda v: isinstance(v, str) and v in DESIGNER_BACKENDS,
                f"one of {', '.join(DESIGNER_BACKENDS)}"),
    "base-url": (lambda v: isinstance(v, str) and re.match(r"https?://.", v) is not None,
                 "an http:// or https:// URL"),
    "model": (lambda v: isinstance(v, str) and v != "",
              "the server's model name (openai) or a model directory (hf, vllm)"),
    # a name only, never the key; a shell name, since --dry-run prints it as "$NAME"
    "api-key-env": (lambda v: isinstance(v, str)
                    and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) is not None,
                    "the name of an environment variable"),
}
# [serve] key -> (whether a value fits, what fits, said in an error)
SERVE_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "python": (lambda v: isinstance(v, str), "a string"),
    "port": (lambda v: _int(v) and 0 <= v <= 65535, "an integer from 0 to 65535"),
    "args": (lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
             "a list of strings"),
    "sleep": (lambda v: isinstance(v, bool), "true or false"),
    "start-timeout": (lambda v: (_int(v) or isinstance(v, float)) and v > 0,
                      "a number of seconds above 0"),
    "restarts": (lambda v: _int(v) and v >= 0, "an integer from 0 up"),
    "request-timeout": (lambda v: (_int(v) or isinstance(v, float)) and v > 0,
                        "a number of seconds above 0"),
    "data-parallel": (lambda v: _positive_int(v), "an integer of at least 1 (replicas)"),
    "tensor-parallel": (lambda v: _positive_int(v), "an integer of at least 1 (GPUs a replica)"),
    "expert-parallel": (lambda v: isinstance(v, bool), "true or false"),
}


@dataclass(frozen=True)
class Serve:
    """A recipe's `[serve]` table: one vLLM server for the run (see spade_cli/run.py)."""

    python: str | None = None  # the interpreter that has vLLM; None: the one running spade
    port: int = 0  # 0: a free port on 127.0.0.1
    args: tuple[str, ...] = ()  # more vLLM server arguments
    sleep: bool | None = None  # sleep mode around train steps; None: where a CUDA device is
    start_timeout: float = 600.0
    restarts: int = 2  # a server that dies is started again this often per stage, then exit 69
    # how long a stage waits for one reply ($SPADE_REQUEST_TIMEOUT); None: the backend's 600 s.
    # A CPU server makes a few tokens a second per request: a long design needs far more.
    request_timeout: float | None = None
    data_parallel: int = 1  # engine replicas, vLLM balancing requests over them
    tensor_parallel: int = 1  # GPUs each replica is split over
    expert_parallel: bool = False  # a MoE model's experts over all data_parallel x tensor_parallel

    @property
    def gpus(self) -> int:
        """The GPUs the engine uses."""
        return self.data_parallel * self.tensor_parallel

    @property
    def layout(self):
        from stages.serve import Layout

        return Layout(self.data_parallel, self.tensor_parallel, self.expert_parallel)


@dataclass(frozen=True)
class Designer:
    """A recipe's `[designer]` table: the model design, hint and audit ask instead of the run's
    own. It is never trained (frozen)."""

    backend: str  # DESIGNER_BACKENDS
    model: str  # the server's model name (openai), else a model directory
    base_url: str | None = None  # openai only
    api_key_env: str | None = None  # the NAME of the variable holding the key, never the key

    @property
    def policy(self) -> str:
        """What its records name as their policy: `URL#model` as the openai backend names a
        server's model, or the model directory."""
        return f"{self.base_url}#{self.model}" if self.base_url else self.model

    def args(self) -> list[str]:
        """How design, hint and audit reach it (its key goes by environment: key_name)."""
        where = ["--base-url", self.base_url] if self.base_url else []
        return ["--backend", self.backend, *where, "--model", self.model, "--policy", self.policy]

    def key_name(self, command: str) -> str | None:
        """The variable whose value `spade command` gets as OPENAI_API_KEY, if any."""
        return self.api_key_env if command in DESIGNER_COMMANDS else None

    def __str__(self) -> str:
        """`MODEL (frozen, openai at URL)`: run.log and --dry-run say it so."""
        where = f" at {self.base_url}" if self.base_url else ""
        return f"{self.model} (frozen, {self.backend}{where})"


@dataclass(frozen=True)
class Stage:
    command: str
    options: dict[str, Any]
    every: int = 1
    attempts: int = 1
    args: tuple[str, ...] = ()
    retention: int | None = None  # eval only: envs of the first set played at each eval point
    repair: bool = False  # design only: later attempts go on with each rejected conversation


@dataclass(frozen=True)
class Recipe:
    path: str
    name: str
    run_dir: str
    rounds: int
    seed: int
    model: dict[str, Any]
    defaults: dict[str, Any]
    stages: tuple[Stage, ...]
    start_pool: str | None = None
    memory: bool = True  # false: the no-memory ablation (design prompts without examples)
    memory_seed: str | None = None  # env shards that fill the memory before round 0
    serve: Serve | None = None  # server mode: one engine for the run
    designer: Designer | None = None  # a separate, frozen designer for design, hint and audit
    raw: dict[str, Any] = field(default_factory=dict)
    # `spade run --allow-remote`: the command line's consent to a [serve] bound off loopback
    # (check_consent); never read from the file, which someone else may have written
    allow_remote: bool = False

    def stage(self, command: str, hint: bool | None = None) -> Stage | None:
        for stage in self.stages:
            if stage.command == command and (hint is None or
                                              bool(stage.options.get("hint", False)) == hint):
                return stage
        return None

    @property
    def window(self) -> int:
        design = self.stage("design")
        return design.every if design else self.rounds


def option_names(command: str) -> set[str]:
    """The long option names (without dashes) a spade subcommand accepts."""
    return set(option_params(command))


@cache
def option_flags(command: str) -> dict[str, tuple[str, int]]:
    """Every way to write an option of `spade command` (`--out`, `-o`, `--no-hint`) -> (its
    key, as a recipe names it, and how many values follow it)."""
    from spade_cli import commands

    flags = {}
    for param in commands.group().commands[command].params:
        if param.param_type_name != "option":
            continue
        key = next(opt[2:] for opt in param.opts if opt.startswith("--"))
        takes = 0 if param.is_flag or param.count else param.nargs
        for flag in (*param.opts, *param.secondary_opts):
            flags[flag] = (key, takes)
    return flags


@cache
def option_params(command: str) -> dict[str, str]:
    """Long option name (without dashes) -> the parameter of the command's function."""
    from spade_cli import commands

    names = {}
    for param in commands.group().commands[command].params:
        # a flag pair `--x/--no-x` is the key `x`; a lone flag `--no-x` is the key `no-x`
        for opt in param.opts:
            if opt.startswith("--"):
                names[opt[2:]] = param.name
    return names


def check_type(command: str, key: str, value: Any) -> str | None:
    """Why `value` cannot be the `--key` of `spade command` (None when it can), judged by the
    type and range the command's own signature declares."""
    from spade_cli import commands

    hints = get_type_hints(commands.functions()[command], include_extras=True)
    annotation, bounds = hints[option_params(command)[key]], None
    if get_origin(annotation) is Annotated:
        annotation, *extras = get_args(annotation)
        bounds = next((e for e in extras if hasattr(e, "min")), None)
    if get_origin(annotation) in (Union, UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    got = json.dumps(value)
    if get_origin(annotation) is list:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in items):
            return f"expected a string or a list of strings, got {got}"
        return None
    if get_origin(annotation) is tuple:
        size = len(get_args(annotation))
        if not (isinstance(value, list) and len(value) == size and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            return f"expected a list of {size} numbers, got {got}"
        return None
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        choices = [member.value for member in annotation]
        return None if value in choices else f"expected one of {', '.join(choices)}, got {got}"
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    accepted = {bool: (bool,), int: (int,), float: (int, float), str: (str, int, float)}
    kinds = accepted.get(annotation, (object,))
    if not isinstance(value, kinds) or (isinstance(value, bool) and annotation is not bool):
        return f"expected {expected[annotation]}, got {got}"
    if bounds is not None and annotation in (int, float):
        if bounds.min is not None and value < bounds.min:
            return f"expected at least {bounds.min}, got {got}"
        if bounds.max is not None and value > bounds.max:
            return f"expected at most {bounds.max}, got {got}"
    return None


def load(path: str, rounds: int | None = None) -> Recipe:
    """Parse and check a recipe; errors name the file and the offending key (exit 65)."""
    try:
        text = Path(path).read_text()
        raw = tomllib.loads(text)
    except FileNotFoundError:
        from stages.shards import InputMissing

        raise InputMissing(f"{path}: no such recipe") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecordError(f"invalid TOML: {exc}", path) from None
    check_names(raw, text, path)
    if raw.get("schema") != SCHEMA:
        raise RecordError(f"schema must be {SCHEMA!r}, got {raw.get('schema')!r}", path)
    for key in ("name", "run_dir", "rounds"):
        if key not in raw:
            raise RecordError(f"missing top-level key {key!r}", path)
    if not _positive_int(raw["rounds"]):
        raise RecordError(f"rounds: expected an integer of at least 1, got "
                          f"{json.dumps(raw['rounds'])}", path)
    if not isinstance(raw.get("seed", 0), int) or isinstance(raw.get("seed"), bool):
        raise RecordError(f"seed: expected an integer, got {json.dumps(raw['seed'])}", path)
    serve = load_serve(raw["serve"], f"{path}: serve") if "serve" in raw else None
    designer = load_designer(raw["designer"], f"{path}: designer") if "designer" in raw else None
    stages = []
    for index, table in enumerate(raw.get("stage", []), 1):
        command = table.get("command")
        where = f"{path}: stage {index}"
        if command not in COMMANDS:
            raise RecordError(f"command must be one of {', '.join(COMMANDS)}, got {command!r}",
                              where)
        where = f"{path}: stage {command}"
        options = {k.replace("_", "-"): v for k, v in table.items() if k not in RUNNER_KEYS}
        known = option_names(command)
        for key, value in options.items():
            if key not in known:
                raise RecordError(f"'{key}' is not an option of `spade {command}`"
                                  f"{_suggest(key, sorted(known | RUNNER_KEYS))}", where)
            if key in WIRED[command] and not (command == "rollout" and key == "hint"):
                raise RecordError(f"'{key}' is set by the runner for `spade {command}`", where)
            if designer and key in DESIGNER_WIRED.get(command, ()):
                raise RecordError(f"'{key}' is set by the runner with a separate designer "
                                  f"([designer])", where)
            if serve and command in GENERATING and key in SERVER_WIRED:
                raise RecordError(f"'{key}' is set by the runner in server mode ([serve])",
                                  where)
            problem = check_type(command, key, value)
            if problem:
                raise RecordError(f"{key}: {problem}", where)
        if command == "train-grpo":
            from stages.train import refuse_lora_in_server_mode

            refuse_lora_in_server_mode(serve is not None, options, where)
        for key in ("every", "attempts"):
            if not _positive_int(table.get(key, 1)):
                raise RecordError(f"{key}: expected an integer of at least 1, got "
                                  f"{json.dumps(table[key])}", where)
        args = table.get("args", [])
        if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
            raise RecordError(f"args: expected a list of strings, got {json.dumps(args)}", where)
        check_args(command, args, wired_keys(command, serve is not None, designer is not None),
                   where)
        check_retention(table, command, where)
        check_repair(table, command, where)
        stages.append(Stage(command, options, table.get("every", 1), table.get("attempts", 1),
                            tuple(args), table.get(RETENTION), table.get(REPAIR, False)))
    defaults = {k.replace("_", "-"): v for k, v in raw.get("defaults", {}).items()}
    check_defaults(defaults, f"{path}: defaults")
    model = dict(raw.get("model", {}))
    model["path"] = model_path(raw["run_dir"], model.get("path"), path, text)
    return Recipe(path=path, name=raw["name"], run_dir=raw["run_dir"],
                  rounds=rounds if rounds is not None else int(raw["rounds"]),
                  seed=int(raw.get("seed", 0)), model=model,
                  defaults=defaults, stages=tuple(stages), start_pool=raw.get("start_pool"),
                  memory=bool(raw.get("memory", True)), memory_seed=raw.get("memory_seed"),
                  serve=serve, designer=designer, raw=raw)


def wired_keys(command: str, served: bool, designer: bool) -> set[str]:
    """The options of `spade command` the runner sets itself: always WIRED's, in server mode a
    generating stage's server options, with a [designer] what it wires."""
    wired = WIRED[command]
    if served and command in GENERATING:
        wired = wired | SERVER_WIRED
    if designer:
        wired = wired | DESIGNER_WIRED.get(command, set())
    return wired


def args_options(command: str, args: list[str] | tuple[str, ...],
                 where: str) -> list[tuple[str, str, list[str]]]:
    """(key, the flag as written, its values) of each option in a stage's `args`, read as
    click reads them (`--out=X`, `-oX`, `-o X`). An argument that is not an option would be
    one more input, which the runner sets: RecordError, as is an unknown option (how many
    values follow it is unknown)."""
    flags, found, index = option_flags(command), [], 0
    while index < len(args):
        arg = args[index]
        if arg in flags:
            flag, attached = arg, None
        elif arg.startswith("--") and "=" in arg:
            flag, attached = arg.split("=", 1)
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
            flag, attached = arg[:2], arg[2:]
        elif arg == "-" or arg == "--" or not arg.startswith("-"):
            raise RecordError(f"args: {arg!r} would be an input: the runner sets the inputs",
                              where)
        else:
            flag, attached = arg, None
        if flag not in flags:
            raise RecordError(f"args: {flag!r} is not an option of `spade {command}`", where)
        key, takes = flags[flag]
        if attached is not None and takes == 0:
            raise RecordError(f"args: {arg!r}: {flag} takes no value", where)
        values = [attached] if attached is not None else list(args[index + 1:index + 1 + takes])
        if len(values) < takes:
            raise RecordError(f"args: {flag!r} needs a value", where)
        found.append((key, flag, values))
        index += 1 + (takes if attached is None else 0)
    return found


def check_args(command: str, args: list[str], wired: set[str], where: str) -> None:
    """A stage's `args` may not set what the runner sets (`-o`, inputs, `--model`, ...), in any
    spelling: RecordError (exit 65), as for a stage key."""
    for key, flag, _values in args_options(command, args, where):
        if key in wired:
            raise RecordError(f"args: {flag!r} is set by the runner", where)


def unsandboxed(recipe: Recipe) -> str | None:
    """The first stage that would play envs outside a jail (`sandbox = "none"`, from
    [defaults], its own keys or its `args`), as `path: stage NAME`; None if every one jails."""
    for stage in recipe.stages:
        known = option_names(stage.command)
        if "sandbox" not in known:
            continue
        said = {**{k: v for k, v in recipe.defaults.items() if k in known}, **stage.options}
        modes = [said.get("sandbox")] + [values[0] for key, _flag, values in
                                         args_options(stage.command, stage.args, recipe.path)
                                         if key == "sandbox"]
        if "none" in modes:
            return f"{recipe.path}: stage {stage.command}"
    return None


def check_consent(recipe: Recipe, allow_remote: bool, unsafe_no_sandbox: bool) -> Recipe:
    """What a recipe may only do when the `spade run` command line says so (a recipe is a
    file someone else may have written): play envs without a jail (`--unsafe-no-sandbox`) and
    bind its server off loopback (`--allow-remote`); RecordError (exit 65) naming the flag.
    Returns the recipe with the consent the runner passes on."""
    where = unsandboxed(recipe)
    if where and not unsafe_no_sandbox:
        raise RecordError('sandbox = "none" plays generated env code as plain processes, '
                          'with no jail: add --unsafe-no-sandbox to `spade run` to allow it',
                          where)
    if recipe.serve:
        from stages.serve import exposure

        exposure("127.0.0.1", recipe.serve.args, allow_remote, f"{recipe.path}: serve: args")
    return replace(recipe, allow_remote=allow_remote)


def check_retention(table: dict[str, Any], command: str, where: str) -> None:
    """`retention`: on the eval stage only, a number of envs of at least 1 (exit 65)."""
    if RETENTION not in table:
        return
    if command != "eval":
        raise RecordError(f"'{RETENTION}' is a runner key of the eval stage only", where)
    if not _positive_int(table[RETENTION]):
        raise RecordError(f"{RETENTION}: expected an integer of at least 1 (envs), got "
                          f"{json.dumps(table[RETENTION])}", where)


def check_repair(table: dict[str, Any], command: str, where: str) -> None:
    """`repair`: on the design stage only, true or false (exit 65)."""
    if REPAIR not in table:
        return
    if command != "design":
        raise RecordError(f"'{REPAIR}' is a runner key of the design stage only", where)
    if not isinstance(table[REPAIR], bool):
        raise RecordError(f"{REPAIR}: expected true or false, got {json.dumps(table[REPAIR])}",
                          where)


def check_names(raw: dict[str, Any], text: str, path: str) -> None:
    """Every name outside the [[stage]] tables is one the runner reads: an unknown top-level
    key or table, or an unknown key of [model], stops the run (exit 65) as
    `path:line: unknown table [default] (did you mean [defaults]?)`."""
    shown = [*TOP_KEYS, *(f"[{t}]" if t != "stage" else "[[stage]]" for t in TABLES)]
    for key, value in raw.items():
        if key in TOP_KEYS or key in TABLES:
            continue
        if isinstance(value, dict):
            what = f"[{key}]"
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            what = f"[[{key}]]"
        else:
            what = key
        where = _where(path, text, None, key) if what == key else _where(path, text, key, None)
        kind = "key" if what == key else "table"
        raise RecordError(f"unknown top-level {kind} {what if kind == 'table' else repr(key)}"
                          f"{_suggest(what, shown)}", where)
    for table in ("model", "defaults"):
        if table in raw and not isinstance(raw[table], dict):
            raise RecordError(f"{table}: expected a table, got {json.dumps(raw[table])}",
                              _where(path, text, None, table))
    if not isinstance(raw.get("stage", []), list) or not all(
            isinstance(t, dict) for t in raw.get("stage", [])):
        raise RecordError("stage: expected [[stage]] tables", _where(path, text, None, "stage"))
    for key, value in raw.get("model", {}).items():
        where = _where(path, text, "model", key)
        if key not in MODEL_KEYS:
            hint = _suggest(key, list(MODEL_KEYS)) or f" (keys: {', '.join(MODEL_KEYS)})"
            raise RecordError(f"[model]: unknown key {key!r}{hint}", where)
        fits, expected = MODEL_KEYS[key]
        if not fits(value):
            raise RecordError(f"[model] {key}: expected {expected}, got {json.dumps(value)}",
                              where)
    for key in ("name", "run_dir", "start_pool", "memory_seed"):
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            raise RecordError(f"{key}: expected a string, got {json.dumps(raw[key])}",
                              _where(path, text, None, key))
    if "memory" in raw and not isinstance(raw["memory"], bool):
        raise RecordError(f"memory: expected true or false, got {json.dumps(raw['memory'])}",
                          _where(path, text, None, "memory"))


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {close[0] if close[0].startswith('[') else repr(close[0])}?)"


_HEADER = re.compile(r"^\s*\[\[?\s*([^\[\]]+?)\s*\]\]?")
_KEY = re.compile(r"""^\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*=""")


def _where(path: str, text: str, table: str | None, key: str | None) -> str:
    """`path:line` of a key (in `table`; None: the top level), or with key None of the table's
    header; `path` alone when the line is not found."""
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        found = _KEY.match(line)
        if found is None:
            header = _HEADER.match(line)
            if header:
                current = header.group(1).strip().strip("\"'")
                if key is None and current == table:
                    return f"{path}:{number}"
            continue
        name = next(group for group in found.groups() if group is not None)
        if key is not None and current == table and name == key:
            return f"{path}:{number}"
    return path


def model_path(run_dir: str, path: str | None, recipe_path: str = "", text: str = "") -> str:
    """Where `[model] path` puts the run's initial model: inside the run directory, so that two
    runs never share one. A relative path is read against `run_dir` (`path = "model"` is
    RUN/model, the default); one that already starts with `run_dir` (as the shipped recipes
    write it, `runs/quickstart/model`) names that place; an absolute path is taken as it is.
    A relative path that leaves the run directory is a RecordError (exit 65)."""
    if path is None:
        return f"{run_dir}/model"
    path = os.path.expanduser(path)
    if os.path.isabs(path):
        return path
    run, given = os.path.normpath(run_dir), os.path.normpath(path)
    if given == run or given.startswith(run.rstrip(os.sep) + os.sep):
        return path
    if given == ".." or given.startswith(".." + os.sep):
        raise RecordError(f"[model] path: {path!r} leaves the run directory: a relative path is "
                          f"read against run_dir ({run_dir!r}); give an absolute path, or name "
                          f"an existing model with `init`",
                          _where(recipe_path, text, "model", "path") if text else recipe_path)
    return f"{run_dir.rstrip('/')}/{given}"


def check_init(recipe: Recipe) -> None:
    """Before round 0 of a real run: a `[model] init` that is not a builtin name must be a
    model here (InputMissing, exit 66, or BackendUnavailable, 69, from check_model), not a
    failure at the design stage."""
    init = recipe.model.get("init", "tiny")
    if init in BUILTIN_MODELS:
        return
    from spade_cli.options import check_model
    from stages.backends import check_model_files
    from stages.shards import InputMissing

    try:
        check_model_files(check_model(init))
    except InputMissing as exc:
        raise InputMissing(f"{recipe.path}: [model] init: {exc}") from None


def load_serve(table: Any, where: str) -> Serve:
    """The `[serve]` table, checked: unknown keys and wrong types stop the run (exit 65)."""
    if not isinstance(table, dict):
        raise RecordError(f"expected a table, got {json.dumps(table)}", where)
    settings = {}
    for key, value in table.items():
        key = key.replace("_", "-")
        if key not in SERVE_KEYS:
            raise RecordError(f"'{key}' is not a serve setting ({', '.join(SERVE_KEYS)})", where)
        fits, expected = SERVE_KEYS[key]
        if not fits(value):
            raise RecordError(f"{key}: expected {expected}, got {json.dumps(value)}", where)
        settings[key.replace("-", "_")] = value
    if "python" in settings:
        settings["python"] = os.path.expanduser(settings["python"])
    if "args" in settings:
        from stages.serve import layout_flag

        settings["args"] = tuple(settings["args"])
        said = layout_flag(settings["args"])
        if said:
            raise RecordError(f"args: {said[0]!r} sets the engine's layout: say it with "
                              f"`{said[1]}` instead", where)
    return Serve(**settings)


def load_designer(table: Any, where: str) -> Designer:
    """The `[designer]` table, checked: unknown keys, wrong types, a missing backend or model,
    and a base-url or api-key-env that the backend cannot use stop the run (exit 65)."""
    if not isinstance(table, dict):
        raise RecordError(f"expected a table, got {json.dumps(table)}", where)
    settings = {}
    for key, value in table.items():
        key = key.replace("_", "-")
        if key not in DESIGNER_KEYS:
            raise RecordError(f"'{key}' is not a designer setting ({', '.join(DESIGNER_KEYS)})",
                              where)
        fits, expected = DESIGNER_KEYS[key]
        if not fits(value):
            raise RecordError(f"{key}: expected {expected}, got {json.dumps(value)}", where)
        settings[key] = value
    for key in ("backend", "model"):
        if key not in settings:
            raise RecordError(f"{key}: missing ({DESIGNER_KEYS[key][1]})", where)
    served = settings["backend"] == "openai"
    if served and "base-url" not in settings:
        raise RecordError("base-url: required with backend openai", where)
    for key in ("base-url", "api-key-env"):
        if key in settings and not served:
            raise RecordError(f"{key}: for backend openai only, not {settings['backend']}", where)
    model = settings["model"] if served else os.path.expanduser(settings["model"])
    return Designer(settings["backend"], model, settings.get("base-url"),
                    settings.get("api-key-env"))


def check_designer(recipe: Recipe) -> None:
    """Before round 0 of a real run: the variable `api-key-env` names is set
    (BackendUnavailable, exit 69), and a local designer's model is a model here (exit 66 or 69,
    as check_init)."""
    designer = recipe.designer
    if designer is None:
        return
    designer_environment(recipe, "design")  # the key is there
    if designer.backend == "openai":
        return
    from spade_cli.options import check_model
    from stages.backends import check_model_files
    from stages.shards import InputMissing

    try:
        check_model_files(check_model(designer.model))
    except InputMissing as exc:
        raise InputMissing(f"{recipe.path}: [designer] model: {exc}") from None


def designer_environment(recipe: Recipe, command: str) -> dict[str, str]:
    """What `spade command` gets in its environment for the recipe's designer: the key as
    OPENAI_API_KEY, read now from the variable `api-key-env` names (BackendUnavailable, exit
    69, when it is unset or empty); nothing for other commands or without a key."""
    name = recipe.designer.key_name(command) if recipe.designer else None
    if name is None:
        return {}
    key = os.environ.get(name)
    if not key:
        from stages.backends import BackendUnavailable

        raise BackendUnavailable(f"{recipe.path}: designer: api-key-env: ${name} is not set: "
                                 f"export the designer's API key as {name}")
    return {KEY_VARIABLE: key}


def check_defaults(defaults: dict[str, Any], where: str) -> None:
    """A default applies to every stage command that has the option: it must suit them all."""
    for key, value in defaults.items():
        users = [command for command in COMMANDS if key in option_names(command)]
        if not users:
            raise RecordError(f"'{key}' is not an option of any stage command", where)
        for command in users:
            problem = check_type(command, key, value)
            if problem:
                raise RecordError(f"{key}: {problem} (an option of `spade {command}`)", where)


def _positive_int(value: Any) -> bool:
    return _int(value) and value >= 1


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def render_option(key: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        if key.startswith("no-"):  # a lone flag such as --no-corpus: false means leave it out
            return [f"--{key}"] if value else []
        return [f"--{key}" if value else f"--no-{key}"]
    if isinstance(value, list):
        if value and all(isinstance(v, (int, float)) for v in value) and len(value) == 2 \
                and key in ("band", "ramp"):
            return [f"--{key}", *map(str, value)]
        return [part for item in value for part in (f"--{key}", str(item))]
    return [f"--{key}", str(value)]


class Loop:
    """Builds each round's command lines; `call` runs (or prints) them in order."""

    def __init__(self, recipe: Recipe, call: Callable[[list[str], str], None],
                 model_after_train: Callable[[str, str], str],
                 produced: Callable[[str, str | None], bool],
                 server: list[str] | None = None):
        """`server`: in server mode, the arguments that point a generating stage at the run's
        server (`--backend openai --base-url URL --model NAME`), given in place of `--model`."""
        self.recipe = recipe
        self.run = recipe.run_dir
        self.call = call
        self.model_after_train = model_after_train
        self.produced = produced
        self.server = server
        # server mode keeps train-grpo's ranks up across rounds too (`spade trainer`)
        self.trainer = f"{self.run}/{TRAINER_JOBS}" if recipe.serve else None
        self.outputs: list[str] = []  # the output dirs of the stages this round called

    def call_stage(self, argv: list[str], label: str, out: str) -> None:
        """Call one stage whose output directory is `out`: a round is done only once every
        such directory holds a complete manifest (the runner checks; spade_cli/run.py)."""
        self.outputs.append(out)
        self.call(argv, label)

    def engine(self, model: str) -> list[str]:
        """How a generating stage reaches the policy: its own engine on `model`, or the
        run's server, which then holds `model` (so records name it as their policy)."""
        return [*self.server, "--policy", model] if self.server else ["--model", model]

    def designer(self, model: str) -> list[str]:
        """How design, hint and audit reach the designer: the recipe's separate one, else the
        policy itself (as `engine`)."""
        return self.recipe.designer.args() if self.recipe.designer else self.engine(model)

    def wired(self, command: str) -> set[str]:
        return wired_keys(command, bool(self.server), self.recipe.designer is not None)

    def template(self, text: str, round: int) -> str:
        return text.format(run_dir=self.run, round=round, **shipped_shards())

    def argv(self, stage: Stage, round: int, wired: list[str], inputs: list[str]) -> list[str]:
        known = option_names(stage.command)
        options = {k: v for k, v in self.recipe.defaults.items()
                   if k in known and k not in self.wired(stage.command)}
        if "seed" in known:
            options.setdefault("seed", self.recipe.seed)
        options.update({k: v for k, v in stage.options.items()
                        if not (stage.command == "rollout" and k == "hint")})
        argv = [stage.command]
        for key, value in options.items():
            value = self.template(value, round) if isinstance(value, str) else value
            argv += render_option(key, value)
        args = [self.template(a, round) for a in stage.args]
        return argv + wired + inputs + args

    def dir(self, round: int, name: str) -> str:
        return f"{self.run}/r{round:02d}/{name}"

    def design_round(self, round: int) -> int:
        return round - round % self.recipe.window

    def memory_in(self, design_round: int) -> list[str]:
        """`--memory` for the set starting at `design_round`: the memory written at the previous
        regeneration step (the reference writes it once per set, at the set's first round),
        or before round 0 the seeded memory if the recipe asks for one."""
        if not self.recipe.memory:
            return []
        if design_round >= self.recipe.window:
            return ["--memory", f"{self.run}/memory/r{design_round - self.recipe.window:02d}.jsonl"]
        return ["--memory", f"{self.run}/memory/seed.jsonl"] if self.recipe.memory_seed else []

    @property
    def attempts(self) -> int:
        design = self.recipe.stage("design")
        return design.attempts if design else 0

    def round(self, round: int, model: str) -> str:
        """Emit one round's commands; returns the model for the next round."""
        self.outputs = []
        start = self.design_round(round)
        first = round == start
        if first:
            self.design_and_validate(round, model)
        checked = [self.dir(start, f"{check}-a{a}") for a in range(self.attempts)
                   for check in self.checks]
        accepted = [self.dir(start, f"{self.checks[-1]}-a{a}") for a in range(self.attempts)]
        envs = self.env_set(round, start, model, accepted, first)
        self.rollouts(round, start, model, envs, first)
        self.score(round, start, envs, checked)
        model = self.train(round, start, model)
        self.evaluate(round, model)
        return model

    @property
    def checks(self) -> list[str]:
        """The stages that judge designs, in order: validate, then the optional model audit."""
        return ["validate"] + (["audit"] if self.recipe.stage("audit") else [])

    def design_and_validate(self, round: int, model: str) -> None:
        """Up to `attempts` passes; later ones redesign only the slots still rejected."""
        design, validate = self.recipe.stage("design"), self.recipe.stage("validate")
        if not (design and validate):
            return
        for attempt in range(self.attempts):
            retry = [] if attempt == 0 else self.retry_args(round, attempt, design.repair)
            out, checked = self.dir(round, f"design-a{attempt}"), self.dir(round, f"validate-a{attempt}")
            label = f"attempt {attempt + 1}/{self.attempts}"
            wired = ["--round", str(round), "--every", str(self.recipe.window),
                     *self.designer(model), *self.memory_in(round), "-o", out, *retry]
            self.call_stage(self.argv(design, round, wired, []), f"design {label}", out)
            self.call_stage(self.argv(validate, round, ["--allow-all-rejected", "-o", checked],
                                      [out]), f"validate {label}", checked)
            audit, audited = self.recipe.stage("audit"), self.dir(round, f"audit-a{attempt}")
            if audit and self.produced(checked, "env"):
                wired = ["--designs", out, *self.designer(model), "-o", audited]
                self.call_stage(self.argv(audit, round, wired, [checked]), f"audit {label}",
                                audited)
            if not any(self.produced(self.dir(round, f"{check}-a{attempt}"), "validation")
                       for check in self.checks):
                break  # every slot has an accepted env: no attempt left to make

    def retry_args(self, round: int, attempt: int, repair: bool) -> list[str]:
        """--retry the last attempt's rejects; a repair also reads the designs they judged."""
        judged = [self.dir(round, f"{check}-a{attempt - 1}") for check in self.checks]
        if repair:
            judged += [self.dir(round, f"design-a{attempt - 1}")]
        return [arg for path in judged for arg in ("--retry", path)] + \
            (["--repair"] if repair else [])

    def env_set(self, round: int, start: int, model: str, checked: list[str],
                first: bool) -> list[str]:
        """The env shards this set plays (hinted by the designer in its first round)."""
        pool = [path for path in checked if self.produced(path, "env")]
        if self.recipe.start_pool and start == 0:
            pool.append(self.template(self.recipe.start_pool, start))
        hint = self.recipe.stage("hint")
        if not hint:
            return pool
        envs = [self.dir(start, "hint")]
        if first and pool:
            self.call_stage(self.argv(hint, round, [*self.designer(model), "-o", envs[0]],
                                      pool), "hint", envs[0])
        return envs

    def rollouts(self, round: int, start: int, model: str, envs: list[str], first: bool) -> None:
        if not any(self.produced(e, "env") for e in envs):
            return
        for hinted in (True, False):
            stage = self.recipe.stage("rollout", hint=hinted)
            if stage and (first or not hinted):
                out = self.dir(round, "rollout-hint" if hinted else "rollout")
                wired = ["--hint" if hinted else "--no-hint", "--round", str(round),
                         *self.engine(model), "-o", out, *self.stalled_in(round, start, hinted)]
                self.call_stage(self.argv(stage, round, wired, envs),
                                f"rollout {'with' if hinted else 'without'} hint", out)

    def stalled_in(self, round: int, start: int, hinted: bool) -> list[str]:
        """`--blacklist-from` the set's plays so far, so that an env which ran out the clock
        in one of them is not played again for the rest of its set."""
        earlier = ([] if hinted else [self.dir(start, "rollout-hint")]) + [
            self.dir(r, "rollout") for r in range(start, round)]
        return [arg for path in earlier if self.produced(path, "rollout")
                for arg in ("--blacklist-from", path)]

    def score(self, round: int, start: int, envs: list[str], checked: list[str]) -> None:
        score = self.recipe.stage("score-regret")
        if not score:
            return
        rollouts = [self.dir(start, "rollout-hint")] + [self.dir(r, "rollout")
                                                        for r in range(start, round + 1)]
        history = [self.dir(r, "score-regret") for r in range(round)]
        wired = ["--round", str(round), "--window", str(self.recipe.window)]
        if round == start and self.recipe.memory:  # memory is written at regeneration steps
            wired += [*self.memory_in(start), "--memory-out",
                      f"{self.run}/memory/r{round:02d}.jsonl"]
        out = self.dir(round, "score-regret")
        wired += ["-o", out]
        # rejects are read so that a recipe's `reject-penalty` can score them (default: discarded)
        inputs = [p for p in [*envs, *checked, *rollouts, *history] if self.produced(p, None)]
        if inputs:
            self.call_stage(self.argv(score, round, wired, inputs), "score-regret", out)

    def train(self, round: int, start: int, model: str) -> str:
        """Agent samples of this round; designer samples k rounds after they were drawn."""
        train = self.recipe.stage("train-grpo")
        if not train:
            return model
        inputs = [self.dir(round, "rollout")]
        for set_start in self.designer_sets_due(round, start):
            inputs += [self.dir(set_start + self.recipe.window - 1, "score-regret")
                       if set_start < start else self.dir(round, "score-regret")]
            inputs += [self.dir(set_start, f"design-a{a}") for a in range(self.attempts)]
        inputs = [p for p in inputs if self.produced(p, None)]
        if not inputs:
            return model
        out = self.dir(round, "train-grpo")
        resident = ["--trainer", self.trainer] if self.trainer else []
        # a separate designer is frozen: the train records count agent samples alone
        frozen = ["--roles", "agent"] if self.recipe.designer else []
        wired = ["--model", model, "--ckpt-dir", f"{self.run}/ckpt", "--round", str(round),
                 "-o", out, *resident, *frozen]
        self.call_stage(self.argv(train, round, wired, inputs), "train-grpo", out)
        return self.model_after_train(out, model)

    def designer_sets_due(self, round: int, start: int) -> list[int]:
        """Env sets whose designer samples train this round: the set drawn at t trains at t + k
        (the reference's delay), scored over its whole window; the last round flushes the set
        still open, scored over the rounds it had."""
        if not self.recipe.stage("design"):
            return []  # a fixed pool (the fixed-env baseline): no designer samples to train
        if self.recipe.designer:
            return []  # a separate designer is frozen: its designs never train the policy
        k = self.recipe.window
        due = [start - k] if round == start and start >= k else []
        return due + ([start] if round == self.recipe.rounds - 1 else [])

    def evaluate(self, round: int, model: str) -> None:
        evaluate = self.recipe.stage("eval")
        if evaluate and (round % evaluate.every == evaluate.every - 1
                         or round == self.recipe.rounds - 1):
            out = self.dir(round, f"eval-{evaluate.options.get('suite', 'eval')}")
            wired = ["--round", str(round), *self.engine(model), "-o", out]
            self.call_stage(self.argv(evaluate, round, wired, []), "eval", out)
            if evaluate.retention:
                self.retention(round, model, evaluate.retention)

    def retention(self, round: int, model: str, size: int) -> None:
        """A seeded sample of the first env set, played again by this round's model: `--sample`
        draws by the recipe's seed from round 0's envs, which no later round rewrites, so every
        eval point plays the same envs."""
        from stages.report.data import RETENTION_DIR  # where the report looks for them

        envs = self.first_env_set()
        if envs:
            # the recipe's [defaults] apply; the eval stage's options are for its own suite
            stage, out = Stage("eval", {"suite": "envs", "sample": size}), \
                self.dir(round, RETENTION_DIR)
            wired = ["--round", str(round), *self.engine(model), "-o", out]
            self.call_stage(self.argv(stage, round, wired, envs), "eval retention", out)

    def first_env_set(self) -> list[str]:
        """The env shards round 0 played, as env_set wires them (nothing is run here)."""
        accepted = [self.dir(0, f"{self.checks[-1]}-a{a}") for a in range(self.attempts)]
        return [path for path in self.env_set(0, 0, "", accepted, first=False)
                if self.produced(path, "env")]


def resolved(recipe: Recipe) -> dict[str, Any]:
    """The recipe as JSON (TOML has no null), with the run's effective settings."""
    return {**recipe.raw, "rounds": recipe.rounds, "window": recipe.window,
            "resolved_from": str(Path(recipe.path).resolve())}


# [serve] settings that change how a run is served, not what it computes (the layout too: the
# same run on a box with other GPUs keeps its finished rounds)
SERVE_OPERATIONAL = ("python", "port", "sleep", "start-timeout", "restarts", "request-timeout",
                     "data-parallel", "tensor-parallel", "expert-parallel")


def digest(resolved: dict[str, Any]) -> str:
    """What a finished round's marker pins: the resolved recipe, less where it was read from and
    the operational [serve] settings (more restarts after a crash never redo finished rounds)."""
    from stages.records import content_hash

    pinned = resolved | {"resolved_from": None}
    if isinstance(pinned.get("serve"), dict):
        pinned["serve"] = {key: value for key, value in pinned["serve"].items()
                           if key.replace("_", "-") not in SERVE_OPERATIONAL}
    return content_hash(pinned)


def changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two resolved recipes: `stage train-grpo: lr 1e-06 -> 0.001`."""
    old, new = _settings(before), _settings(now)
    return [f"{key} {_shown(old.get(key))} -> {_shown(new.get(key))}"
            for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]


def _settings(resolved: dict[str, Any]) -> dict[str, Any]:
    """A resolved recipe flattened to `label: key` -> value (stages labelled by command)."""
    flat = {}
    for key, value in resolved.items():
        if key == "stage" or key == "resolved_from":
            continue
        if isinstance(value, dict):
            flat.update({f"{key}: {k}": v for k, v in value.items()})
        else:
            flat[key] = value
    seen: dict[str, int] = {}
    for table in resolved.get("stage", []):
        label = f"stage {table.get('command')}"
        if table.get("command") == "rollout":
            label += " (hint)" if table.get("hint") else " (no hint)"
        seen[label] = seen.get(label, 0) + 1
        label += f" #{seen[label]}" if seen[label] > 1 else ""
        flat.update({f"{label}: {k}": v for k, v in table.items() if k != "command"})
    return flat


def _shown(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value)


def shell_line(argv: list[str]) -> str:
    return "spade " + " ".join(shlex.quote(a) for a in argv)


def model_init_commands(recipe: Recipe) -> tuple[str, list[list[str]]]:
    """The initial model path and the commands that build it (empty for a given path)."""
    init = recipe.model.get("init", "tiny")
    path = recipe.model.get("path") or model_path(recipe.run_dir, None)
    if init == "tiny":
        extra = [a for k in ("seed", "hidden", "layers") if k in recipe.model
                 for a in (f"--{k}", str(recipe.model[k]))]
        return path, [["model", "tiny", path, *extra]]
    if init in BUILTIN_MODELS:
        return path, [["model", init, path]]
    return init, []


def memory_seed_command(recipe: Recipe) -> list[str]:
    source = recipe.memory_seed.format(run_dir=recipe.run_dir, round=0, **shipped_shards())
    return ["memory", "seed", source, "-o", f"{recipe.run_dir}/memory/seed.jsonl"]


def shipped_shards() -> dict[str, str]:
    """The env shards a recipe names as `{seeds}` (the seed library), `{starter}` (the starter
    tier) and `{examples}` (the examples tier), relative like every other path of a pipeline when they lie under the working
    directory (a checkout), else absolute (an installed package)."""
    from stages import seed_library

    shards = {"seeds": seed_library.ENV_SHARD, "starter": seed_library.STARTER_SHARD,
              "examples": seed_library.EXAMPLES_SHARD}
    return {name: str(path) if os.path.relpath(path).startswith("..") else os.path.relpath(path)
            for name, path in shards.items()}


def write_json(path: Path, data: dict) -> None:
    from stages.shards import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, [json.dumps(data, indent=2).encode() + b"\n"])
