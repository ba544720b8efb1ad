"""BFCL v4 multi-turn suite `bfcl-mt`: entries, the agent loop, `run_bfcl`.

In: entries from `bfcl_entries(categories, limit)` (base, miss_func, miss_param, long_context)
out of the `bfcl-eval` wheel (install with `pip install --no-deps bfcl-eval`), a backend,
Config (episodes, max_steps, call_timeout).
Out: one `eval` item per entry (its BFCL test id), yielded in entry order: `score` = share of
plays the package's `multi_turn_checker` accepts (1 or 0 per play), details with error types
and call counts.

Our agent loop drives the package's simulated API classes: per user turn the model may call
tools (several <tool_call>{json}</tool_call> per reply); the calls run on the entry's instances
through the package's own executor and their results come back as `tool` messages, until a
reply has no valid call. Held-out functions (miss_func) join the tool list at their turn with
the package's prompt. More than `max_steps` tool-calling replies in one turn (default 20,
BFCL's limit) force-quit the entry, as does a tool request that times out. The checker then
scores the entry in a fresh process (BFCL also scores apart from generation): state and
execution results against the possible answers. Our JSON calls are converted to the call
strings that checker expects, exactly as BFCL's own `convert_to_function_call` writes them.

Guarantees: a call naming a function the entry's classes do not have is answered with an error
and never reaches the package (its executor would `eval` that name in its own module); argument
names must be identifiers and values are JSON literals, so the strings it evaluates are plain
literals. The simulated APIs are package code, not generated code: no jail is needed, but they
run in helper processes (`stages.evaluate.helpers`) with timeouts. Model calls are batched
across entries.
"""

from __future__ import annotations

import json
import keyword
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from stages import prompts
from stages.backends import Backend, BackendUnavailable, Completion
from stages.evaluate.batching import Chat
from stages.evaluate.helpers import Helper, HelperError, HelperTimeout
from stages.evaluate.rollup import _count, item
from stages.records import Eval

if TYPE_CHECKING:
    from stages.evaluate import Config

BFCL_CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
BFCL_MAX_STEPS = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
BFCL_INSTALL = "pip install --no-deps bfcl-eval && pip install filelock mpmath"
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def require_bfcl():
    import importlib

    try:
        from bfcl_eval.constants import default_prompts, type_mappings
        from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

        importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    except ImportError as exc:
        raise BackendUnavailable(f"the bfcl-mt suite needs the bfcl-eval package ({exc.name} "
                                 f"is missing): {BFCL_INSTALL}") from None
    return load_dataset_entry, load_ground_truth_entry, default_prompts, type_mappings


def bfcl_entries(categories: Iterable[str] = (), limit: int | None = None
                 ) -> list[tuple[str, dict, list]]:
    """(category, test entry with its function docs, ground truth), in the package's order."""
    load_entries, load_truth, _, _ = require_bfcl()
    chosen = {c.lower() for c in categories}
    wanted = [c for c in BFCL_CATEGORIES if not chosen or c in chosen]
    out = []
    for category in wanted:
        entries = load_entries(f"multi_turn_{category}")
        truth = {row["id"]: row["ground_truth"] for row in load_truth(f"multi_turn_{category}")}
        for entry in entries[:limit] if limit is not None else entries:
            out.append((category, entry, truth[entry["id"]]))
    return out


def openai_tool(doc: dict, mapping: dict[str, str]) -> dict:
    """A BFCL function doc as an OpenAI tool (BFCL's own type mapping; `response` dropped)."""

    def cast(schema: Any) -> Any:
        if not isinstance(schema, dict):
            return schema
        out = dict(schema)
        if "type" in out:
            out["type"] = mapping.get(out["type"], "string")
        if isinstance(out.get("properties"), dict):
            out["properties"] = {k: cast(v) for k, v in out["properties"].items()}
        if isinstance(out.get("items"), dict):
            out["items"] = cast(out["items"])
        return out

    parameters = cast(doc.get("parameters") or {"type": "dict", "properties": {}})
    parameters["type"] = "object"
    return {"type": "function", "function": {"name": doc["name"],
                                             "description": doc.get("description", ""),
                                             "parameters": parameters}}


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """BFCL's decoded form of one call (as its `convert_to_function_call` writes it)."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def parse_tool_calls(text: str) -> tuple[list[tuple[str, dict]], list[str]]:
    """Well-formed <tool_call> blocks as (name, arguments), and one message per malformed one."""
    calls, errors = [], []
    for block in TOOL_CALL.findall(text):
        try:
            data = json.loads(block)
            name, arguments = data["name"], data.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"Error: could not read the tool call ({type(exc).__name__}: {exc})")
            continue
        calls.append((name, arguments))
    return calls, errors


class _BfclEntry:
    """Lives in a helper process: one test entry's API instances, executor and checker."""

    MODEL = "spade"

    def open(self, entry: dict, category: str) -> list[str]:
        import inspect

        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call)

        self.entry, self.category = entry, category
        self.long_context = "long_context" in category
        _, instances = execute_multi_turn_func_call(
            [], entry["initial_config"], entry["involved_classes"], self.MODEL, entry["id"],
            long_context=self.long_context, is_evaL_run=False)
        return sorted({name for instance in instances.values()
                       for name, _ in inspect.getmembers(instance, inspect.ismethod)
                       if not name.startswith("_")})

    def execute(self, calls: list[str]) -> list[str]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call)

        results, _ = execute_multi_turn_func_call(
            calls, self.entry["initial_config"], self.entry["involved_classes"], self.MODEL,
            self.entry["id"], long_context=self.long_context, is_evaL_run=False)
        return [str(r) for r in results]

    def check(self, entry: dict, category: str, decoded: list, ground_truth: list) -> dict:
        # Run in a fresh helper: some API classes keep state at class level, so instances the
        # episode mutated would leak into the checker's replay (BFCL scores in a new process).
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
            multi_turn_checker)

        result = multi_turn_checker(decoded, ground_truth, entry, f"multi_turn_{category}",
                                    self.MODEL)
        return {"valid": bool(result.get("valid")),
                "error_type": result.get("error_type"),
                "error_message": str(result.get("error_message", ""))[:500]}


class BfclEpisode:
    """One BFCL entry played by the model: turns, steps, and what the checker will replay."""

    def __init__(self, order: int, category: str, entry: dict, truth: list, play: int,
                 cfg: Config, tools_mapping: dict, additional_prompt: str):
        self.order, self.category, self.entry, self.truth, self.play = (
            order, category, entry, truth, play)
        self.cfg, self.mapping, self.additional_prompt = cfg, tools_mapping, additional_prompt
        self.docs = list(entry["function"])
        self.missed = {str(k): v for k, v in (entry.get("missed_function") or {}).items()}
        self.messages = [{"role": "system",
                          "content": prompts.render("eval_bfcl", cfg.prompts_dir)}]
        self.turn, self.steps = 0, 0
        self.decoded: list[list[list[str]]] = []  # per turn, per step: call strings
        self.current: list[list[str]] = []
        self.methods: set[str] = set()
        self.helper = Helper("bfcl", _BfclEntry, cfg.call_timeout, cfg.helper_memory_mb)
        self.result: dict[str, Any] | None = None
        self.counts = {"calls": 0, "rejected": 0, "malformed": 0, "steps": 0}

    @property
    def tools(self) -> list[dict]:
        return [openai_tool(doc, self.mapping) for doc in self.docs]

    def open(self) -> None:
        try:
            self.methods = set(self.helper.request("open", self.entry, self.category))
        except (HelperTimeout, HelperError) as exc:
            return self.finish({"valid": False, "error_type": "spade:helper",
                                "error_message": str(exc)})
        self.start_turn()

    def start_turn(self) -> None:
        key = str(self.turn)
        if key in self.missed:
            self.docs += self.missed[key]
            messages = [{"role": "user", "content": self.additional_prompt}]
        else:
            messages = list(self.entry["question"][self.turn])
        self.messages += messages
        self.steps, self.current = 0, []

    def act(self, completion: Completion) -> None:
        self.messages.append({"role": "assistant", "content": completion.text})
        calls, errors = parse_tool_calls(completion.text)
        self.counts["malformed"] += len(errors)
        if not calls:
            return self.end_turn()
        self.steps += 1
        self.counts["steps"] += 1
        replies: list[str] = list(errors)
        accepted: list[str] = []
        for name, arguments in calls:
            problem = self._reject(name, arguments)
            if problem:
                self.counts["rejected"] += 1
                replies.append(problem)
            else:
                accepted.append(call_string(name, arguments))
        self.counts["calls"] += len(accepted)
        if accepted:
            try:
                replies += self.helper.request("execute", accepted)
            except (HelperTimeout, HelperError) as exc:
                self.current.append(accepted)
                return self.finish({"valid": False, "error_type": "spade:tool_timeout"
                                    if isinstance(exc, HelperTimeout) else "spade:helper",
                                    "error_message": str(exc)})
            self.current.append(accepted)
        self.messages += [{"role": "tool", "content": reply} for reply in replies]
        if self.steps > self.cfg.max_steps:
            self.decoded.append(self.current)
            return self.finish({"valid": False, "error_type": "multi_turn:force_terminated",
                                "error_message": f"more than {self.cfg.max_steps} steps in "
                                                 f"turn {self.turn}"})

    def _reject(self, name: str, arguments: dict) -> str | None:
        if name not in self.methods:
            return f"Error during execution: name '{name}' is not defined"
        for key in arguments:
            if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
                return f"Error during execution: {key!r} is not a valid argument name"
        return None

    def end_turn(self) -> None:
        self.decoded.append(self.current)
        self.turn += 1
        if self.turn >= len(self.entry["question"]):
            return self.check()
        self.start_turn()

    def check(self) -> None:
        if len(self.decoded) != len(self.truth):
            return self.finish({"valid": False, "error_type": "multi_turn:force_terminated",
                                "error_message": "turn count differs from the ground truth"})
        self.helper.close()
        try:
            result = self.helper.request("check", self.entry, self.category, self.decoded,
                                         self.truth, timeout=self.cfg.call_timeout * 4)
        except (HelperTimeout, HelperError) as exc:
            result = {"valid": False, "error_type": "spade:check_failed",
                      "error_message": str(exc)}
        self.finish(result)

    def finish(self, result: dict[str, Any]) -> None:
        self.result = result
        self.helper.close()

    def close(self) -> None:
        self.helper.close()


def run_bfcl(entries: list[tuple[str, dict, list]], backend: Backend, cfg: Config,
             stats: Any = None) -> Iterator[Eval]:
    """Play every entry `episodes` times, batched across entries; yield in entry order."""
    _, _, default_prompts, type_mappings = require_bfcl()
    additional = default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    mapping = type_mappings.GORILLA_TO_OPENAPI
    plays = cfg.n_episodes
    tasks = iter([(i, e, p) for i, e in enumerate(entries) for p in range(plays)])
    chat = Chat(backend, cfg)
    results: dict[int, list[BfclEpisode]] = {}
    next_out, active = 0, []
    width = max(1, cfg.batch_size)
    with ThreadPoolExecutor(max_workers=min(16, width)) as pool:
        try:
            exhausted = False
            while active or not exhausted:
                fresh = []
                while not exhausted and len(active) + len(fresh) < width:
                    task = next(tasks, None)
                    if task is None:
                        exhausted = True
                        break
                    index, (category, entry, truth), play = task
                    fresh.append(BfclEpisode(index, category, entry, truth, play, cfg, mapping,
                                             additional))
                active += fresh
                list(pool.map(BfclEpisode.open, fresh))
                running = [e for e in active if e.result is None]
                if running:
                    completions = chat([e.messages for e in running], [e.tools for e in running])
                    list(pool.map(BfclEpisode.act, running, completions))
                for episode in [e for e in active if e.result is not None]:
                    results.setdefault(episode.order, []).append(episode)
                active = [e for e in active if e.result is None]
                while len(results.get(next_out, ())) == plays:
                    yield _bfcl_record(results.pop(next_out), cfg, backend.policy, stats)
                    next_out += 1
        finally:
            for episode in active:
                episode.close()


def _bfcl_record(plays: list[BfclEpisode], cfg: Config, policy: str | None, stats: Any) -> Eval:
    plays.sort(key=lambda e: e.play)
    first = plays[0]
    scores = [1.0 if e.result.get("valid") else 0.0 for e in plays]
    errors = [e.result.get("error_type") for e in plays if not e.result.get("valid")]
    for error in errors:
        _count(stats, str(error))
    return item(cfg, first.entry["id"], first.category, scores, policy, {
        "turns": len(first.entry["question"]), "errors": errors,
        "error_message": next((e.result.get("error_message") for e in plays
                               if not e.result.get("valid")), None),
        **{k: sum(e.counts[k] for e in plays) for k in first.counts}})
