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
- The env's code only ever runs inside a jailed `Worker` (through stages/adapters/common.py's
  `Play` over sandbox/gym.py's `JailedEnv`); this process sees its replies as checked JSON
  data. The tool list is read from the env in the jail once, when `environment_factory` is
  called.
- A misbehaving env is an outcome, not a crash: an exception in the env, a timeout, oom, an
  output limit or a reply of the wrong shape ends the episode; the tool returns one line saying
  so, `outcome` holds the jail outcome (see `jail.OUTCOMES`), `get_reward()` is 0.0, and the next
  `reset` starts a fresh worker if the old one is gone. Only a source that does not load at all
  raises (`EnvCrashed`, when `environment_factory` is called), and a jail that cannot start
  raises `jail.SandboxUnavailable`, as everywhere in spade.
- An episode ends at termination, truncation or `max_turns` (capped at 25, as rollouts are);
  later tool calls answer "The episode is over." and reach no env.
Each instance holds one jail from its first `reset` while it lives: TRL keeps one instance per
concurrent rollout.
"""

from __future__ import annotations

import inspect
import json
import zlib
from typing import Any, Callable

from sandbox.jail import Sandbox
from stages.adapters.common import Play, probe, to_action

__all__ = ["SpadeTRLEnv", "environment_factory"]

JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
              "object": dict}
RESERVED = {"reset", "get_reward", "finish"}


class SpadeTRLEnv:
    """Base of the per-env classes `environment_factory` builds; see the module docstring."""

    _play_args: tuple = ()  # (EnvFacts, Sandbox | None), set on each built class

    def __init__(self) -> None:
        self._play = Play(*self._play_args)

    # plain attributes for TRL's callers (properties: TRL lists only functions as tools)
    outcome = property(lambda self: self._play.outcome)
    turns = property(lambda self: self._play.turns)
    done = property(lambda self: self._play.done)
    episode = property(lambda self: self._play.env)

    def reset(self, **row: Any) -> str:
        seed = row.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int):
            # one seed per prompt, so the plays of a GRPO group play one episode
            prompt = json.dumps(row.get("prompt"), sort_keys=True, default=str)
            seed = zlib.crc32(prompt.encode())
        return self._play.reset(seed)

    def get_reward(self) -> float:
        return self._play.reward

    def _act(self, action: str) -> str:
        return self._play.step(action)

    def __del__(self) -> None:
        play = getattr(self, "_play", None)
        if play is not None:
            play.close()


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
    return self._act(to_action(action, "game"))


def finish(self) -> str:
    """Say you have completed every request; ends the episode if they are all met."""
    return self._act("<answer>done</answer>")


def environment_factory(env: Any, *, id_prefix: str | None = None,
                        sandbox: Sandbox | None = None) -> Callable[[], SpadeTRLEnv]:
    """A zero-argument callable for `GRPOTrainer(environment_factory=...)` (module docstring).

    Loads and resets the env once in a jail to read its class, domain, max_turns and tools.
    """
    facts = probe(env, id_prefix, sandbox)  # EnvCrashed / SandboxUnavailable propagate
    body: dict[str, Any] = {"_play_args": (facts, sandbox), "__doc__": f"spade env {facts.name}"}
    if facts.domain == "tool_use":
        for tool in facts.tools:
            spec = tool["function"]
            tool_name = spec["name"]
            if not tool_name.isidentifier():
                continue
            exposed = tool_name + "_" if tool_name in RESERVED or tool_name.startswith("_") \
                else tool_name
            body[exposed] = _tool_method(tool_name, exposed, spec)
        body["finish"] = finish  # an env tool named finish is exposed as finish_
    else:
        body["act"] = act
    class_name = facts.class_name if facts.class_name.isidentifier() else "SpadeEnv"
    return type(class_name, (SpadeTRLEnv,), body)
