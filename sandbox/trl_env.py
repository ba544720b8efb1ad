"""A jailed spade env as TRL's `GRPOTrainer(environment_factory=...)` environment.

In: a validated env: a `.py` file, a shard (file or directory) of `env` records with an id
prefix, an `env` record, or the source text itself; optionally a `Sandbox` saying how to jail it.
Out: `environment_factory(env, ...)`, a zero-argument callable; each call builds one instance
with the protocol trl 1.16 reads (trl/trainer/grpo_trainer.py, `GRPOTrainer.__init__` and
`_generate_and_score_completions`):
    reset(**row) -> str        the env's first observation, appended to the last user message;
                               the seed is the row's `seed` column (keep one per prompt, so the
                               `num_generations` plays of a GRPO group play one episode), else a
                               hash of the prompt
    <tool>(**arguments) -> str one public method per tool, with type hints and a Google
                               docstring (transformers' `get_json_schema` renders it): a game
                               env has `act(action: str)` (sent as `\\boxed{action}` unless it
                               holds one); a tool-use env has each of its own tools (a name that
                               clashes with `reset`, `get_reward` or `finish` gets a trailing `_`
                               in the schema; the env still receives its own name) and
                               `finish()`, which sends `<answer>done</answer>`
    get_reward() -> float      the episode reward as `spade rollout` scores it: the env's last
                               reward clipped to [-1, 1] if it terminated, else 0.0
and plain (non-function) attributes `outcome`, `turns`, `done`, `episode` (the `JailedEnv`).

Guarantees:
- The env's code only ever runs inside a jailed `Worker` (through sandbox/gym.py's `JailedEnv`);
  this process sees its replies as checked JSON data. The tool list is read from the env in the
  jail once, when `environment_factory` is called.
- A misbehaving env is an outcome, not a crash: an exception in the env, a timeout, oom, an
  output limit or a reply of the wrong shape ends the episode; the tool returns one line saying
  so, `outcome` holds the jail outcome (see `jail.OUTCOMES`), `get_reward()` is 0.0, and the next
  `reset` starts a fresh worker if the old one is gone. Only a source that does not load at all
  raises (`EnvCrashed`, when `environment_factory` is called), and a jail that cannot start
  raises `jail.SandboxUnavailable`, as everywhere in spade.
- An episode ends at termination, truncation or `max_turns` (capped at 25, as rollouts are);
  later tool calls answer "The episode is over." and reach no env.
Each instance holds one jail while it lives: TRL keeps one instance per concurrent rollout.
"""

from __future__ import annotations

import inspect
import json
import zlib
from pathlib import Path
from typing import Any, Callable

from sandbox.gym import MAX_TURNS_CAP, EnvCrashed, JailedEnv
from sandbox.jail import Sandbox

__all__ = ["SpadeTRLEnv", "env_source", "environment_factory"]

JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
              "object": dict}
RESERVED = {"reset", "get_reward", "finish"}


def env_source(env: Any, id_prefix: str | None = None) -> tuple[str, str]:
    """(a name for messages, the source) of a .py path, shard path + id prefix, record or text."""
    if hasattr(env, "source") and hasattr(env, "id"):  # a stages.records.Env
        return env.id, env.source
    text = str(env)
    if "\n" in text:  # source text
        return "<source>", text
    if text.endswith(".py"):
        return text, Path(text).read_text()
    from stages.shards import find_shards, read_shard

    envs = [r for shard in find_shards([text], {"env"}) for r in read_shard(shard)
            if r.kind == "env" and (id_prefix is None or r.id.startswith(id_prefix))]
    if len(envs) != 1:
        raise ValueError(f"{text}: {len(envs)} env records match id prefix {id_prefix!r}; "
                         "exactly one must")
    return envs[0].id, envs[0].source


class SpadeTRLEnv:
    """Base of the per-env classes `environment_factory` builds; see the module docstring."""

    _source: str = ""
    _sandbox: Sandbox | None = None
    _limit: int = MAX_TURNS_CAP

    def __init__(self) -> None:
        self.episode: JailedEnv | None = JailedEnv(self._source, self._sandbox)
        self.outcome, self.turns, self.done = "ok", 0, True
        self._reward = 0.0

    def reset(self, **row: Any) -> str:
        seed = row.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int):
            prompt = json.dumps(row.get("prompt"), sort_keys=True, default=str)
            seed = zlib.crc32(prompt.encode())
        self.outcome, self.turns, self.done, self._reward = "ok", 0, False, 0.0
        try:
            if self.episode is None:
                self.episode = JailedEnv(self._source, self._sandbox)
            observation, _info = self.episode.reset(seed=seed)
            return observation
        except EnvCrashed as exc:
            return self._crashed(exc)

    def get_reward(self) -> float:
        return self._reward

    def _act(self, action: str) -> str:
        if self.done:
            return "The episode is over."
        try:
            observation, reward, terminated, truncated, _info = self.episode.step(action)
        except EnvCrashed as exc:
            return self._crashed(exc)
        self.turns += 1
        self._reward = reward  # JailedEnv pays outcome only: 0.0 unless terminated, clipped
        if terminated or truncated or self.turns >= self._limit:
            self.done = True
            observation += "\nThe episode is over."
        return observation

    def _crashed(self, exc: EnvCrashed) -> str:
        self.outcome, self.done, self._reward = exc.outcome, True, 0.0
        if exc.outcome != "program_error" and self.episode is not None:
            self.episode.close()  # the worker is gone: the next reset starts a fresh one
            self.episode = None
        return f"The environment failed ({exc.outcome}): {exc.message}. The episode is over."

    def __del__(self) -> None:
        episode = getattr(self, "episode", None)
        if episode is not None:
            episode.close()


def _tool_method(name: str, exposed: str, spec: dict) -> Callable:
    parameters = spec.get("parameters") if isinstance(spec.get("parameters"), dict) else {}
    properties = parameters.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = parameters.get("required") if isinstance(parameters.get("required"), list) else []
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    lines = [str(spec.get("description") or f"The {name} tool.").replace("\n", " ")]
    arg_lines = []
    for arg, schema in properties.items():
        if not (isinstance(arg, str) and arg.isidentifier()):
            continue
        schema = schema if isinstance(schema, dict) else {}
        kind = JSON_TYPES.get(schema.get("type"), str)
        default = inspect.Parameter.empty if arg in required else None
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=kind if arg in required else kind | None))
        annotations[arg] = params[-1].annotation
        text = str(schema.get("description") or f"the {arg}").replace("\n", " ")
        arg_lines.append(f"    {arg}: {text}")
    if arg_lines:
        lines += ["", "Args:", *arg_lines]

    def tool(self, **arguments: Any) -> str:
        call = json.dumps({"name": name, "arguments": arguments})
        return self._act(f"<tool_call>{call}</tool_call>")

    tool.__name__ = tool.__qualname__ = exposed
    tool.__doc__ = "\n".join(lines)
    tool.__signature__ = inspect.Signature(params, return_annotation=str)
    tool.__annotations__ = annotations
    return tool


def act(self, action: str) -> str:
    """Take one turn in the game; returns what the game says back.

    Args:
        action: your move, sent to the game as \\boxed{action}
    """
    from stages.rollout import game_action, last_boxed

    return self._act(game_action(action) if last_boxed(action) is not None
                     else f"\\boxed{{{action.strip()}}}")


def finish(self) -> str:
    """Say you have completed every request; ends the episode if they are all met."""
    return self._act("<answer>done</answer>")


def environment_factory(env: Any, *, id_prefix: str | None = None,
                        sandbox: Sandbox | None = None) -> Callable[[], SpadeTRLEnv]:
    """A zero-argument callable for `GRPOTrainer(environment_factory=...)` (module docstring).

    Loads and resets the env once in a jail to read its class, domain, max_turns and tools.
    """
    name, source = env_source(env, id_prefix)
    probe = JailedEnv(source, sandbox)  # EnvCrashed / SandboxUnavailable propagate
    try:
        _obs, info = probe.reset(seed=0)
    finally:
        probe.close()
    turns = probe.max_turns
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        turns = MAX_TURNS_CAP
    body: dict[str, Any] = {"_source": source, "_sandbox": sandbox,
                            "_limit": min(turns, MAX_TURNS_CAP), "__doc__": f"spade env {name}"}
    if probe.domain == "tool_use":
        for tool in info.get("tools", []):
            spec = tool.get("function", {}) if isinstance(tool, dict) else {}
            tool_name = spec.get("name")
            if not isinstance(tool_name, str) or not tool_name.isidentifier():
                continue
            exposed = tool_name + "_" if tool_name in RESERVED or tool_name.startswith("_") \
                else tool_name
            body[exposed] = _tool_method(tool_name, exposed, spec)
        body["finish"] = finish  # an env tool named finish is exposed as finish_
    else:
        body["act"] = act
    class_name = probe.class_name if probe.class_name.isidentifier() else "SpadeEnv"
    return type(class_name, (SpadeTRLEnv,), body)
