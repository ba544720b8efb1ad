"""Rollout benchmark: what the rollout stage costs besides the model, measured two ways.

What it measures:
  1. scripted policy   `stages.rollout.run` over the seed env shard with a `ScriptedBackend` that
                       answers instantly (games: cycles through the `\\boxed{...}` commands the
                       env's first observation lists; tool use: calls each tool in turn with
                       arguments made from its schema, then `<answer>done</answer>`), at
                       concurrency 1, 2 and 8. This is pure orchestration + sandbox cost: jailed
                       worker start, load, reset and step round trips, record building. Baseline in
                       the same run: the same policy playing the same envs with the same seeds
                       in this process (env source exec'd here, no jail, no worker), as the
                       reference SPADE code does. Passes are interleaved (baseline, c=1, c=2, c=8,
                       then again) and the median pass is reported. Episodes/s and env-steps/s
                       (steps = turns played); ratio = steps/s against the in-process baseline.
  2. tiny model        the `hf` backend on CPU with a tiny random Qwen2 (`stages.models.tiny`,
                       built into a temp dir and loaded, plus one warm-up generate, before any
                       timing), playing a few seed envs (4 envs x 2 plays, max_tokens 32,
                       concurrency 8). A timing proxy around the backend sums the wall time of
                       `backend.chat`; the rest of the wall time of `rollout.run` is orchestration
                       + sandbox. Measured as `spade rollout` runs it (the worker pool starts its
                       first jails while the model loads, so they are ready when play begins)
                       and cold (jails started inside `rollout.run`, shown for comparison).
                       Median of the passes.

  3. turn barrier     (`--barrier` alone) the scripted policy behind an engine whose latency
                       per request is its completion length times a per-token time, lengths
                       lognormal (median 600 tokens, sigma 1.0, cut at max_tokens 4096) and drawn
                       from the request's own seed: 4 plays of each of the 16 seed envs (64),
                       concurrency 32, up to 10 turns. Turn-batched (`rollout --barrier`: each
                       turn waits for its longest completion) vs barrier-free (each play's next
                       turn starts when its own completion returns), interleaved, median of 3
                       (~4 min in all). Time is scaled (0.5 ms per token) so a pass takes tens
                       of seconds yet the model, not the jails, dominates, as on a GPU box; the
                       ratio is what a decode-bound engine with 32 slots would see. The records
                       of both schedules are checked to be identical.

How to run:
  python benchmarks/rollout.py             # plays 4 per env, 3 passes each; tiny model 3 passes
  python benchmarks/rollout.py --quick     # plays 2 per env, 1 pass each; tiny model 1 pass
  python benchmarks/rollout.py --barrier   # section 3 only; last line `barrier-free/barrier: X.XXx`
  python benchmarks/rollout.py --json out.json   # also write every number to out.json

Targets (a final PASS/MISS line each; the exit status is 0 either way, since this is a measurement):
  - scripted policy: at least 200 env-steps/s at the best concurrency;
  - tiny model: orchestration + sandbox under 10% of the wall time of `rollout.run`;
  - turn barrier: barrier-free at least 1.5x the plays/s of turn-batched.
Exit 69 (with a message) when nsjail, a jail-readable python or torch/transformers is unavailable,
or a jail cannot start.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import platform
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import exit_69_when_unavailable, finish, ratio, table  # noqa: E402
from sandbox.jail import cgroup_controllers, locate_nsjail, locate_python  # noqa: E402
from sandbox.pool import WorkerPool  # noqa: E402
from stages import prompts, rollout, shards  # noqa: E402
from stages.backends import BackendUnavailable, Sampling  # noqa: E402
from stages.backends.scripted import ScriptedBackend  # noqa: E402
from stages.records import Env, Rollout  # noqa: E402

ENV_SHARD = _HERE.parent / "stages" / "seed_library" / "envs.jsonl"
TOOL_BASE = _HERE.parent / "sandbox" / "tool_base.py"
CONCURRENCIES = (1, 2, 8)
TARGET_STEPS_PER_S = 200.0
TARGET_OVERHEAD_SHARE = 0.10
MODEL_ENVS, MODEL_PLAYS, MODEL_MAX_TOKENS, MODEL_CONCURRENCY = 4, 2, 32, 8
BARRIER_PLAYS, BARRIER_CONCURRENCY, BARRIER_TURNS, BARRIER_REPEATS = 4, 32, 10, 3
LENGTH_MEDIAN, LENGTH_SIGMA, LENGTH_CAP, SECONDS_PER_TOKEN = 600, 1.0, 4096, 5e-4
TARGET_BARRIER_RATIO = 1.5


# -- the scripted policy ------------------------------------------------------------------------

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
FALLBACK_COMMANDS = ("north", "east", "south", "west", "ready", "submit")


def _arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Plausible values for the required parameters of a tool's JSON schema."""
    properties = schema.get("properties") or {}
    values: dict[str, Any] = {}
    for name in schema.get("required") or []:
        spec = properties.get(name) or {}
        if spec.get("enum"):
            values[name] = spec["enum"][0]
        elif spec.get("type") in ("integer", "number"):
            values[name] = 1
        elif spec.get("type") == "boolean":
            values[name] = True
        elif spec.get("type") == "array":
            values[name] = []
        else:
            values[name] = "/" if "path" in name else "x1"
    return values


def respond(messages: list[dict], tools: list[dict] | None) -> str:
    """An instant, deterministic policy: the same reply for the same conversation."""
    turn = sum(m["role"] == "assistant" for m in messages)
    if tools:
        if turn % (len(tools) + 1) == len(tools):
            return "<answer>done</answer>"
        function = tools[turn % (len(tools) + 1)].get("function") or {}
        call = {"name": function.get("name", ""),
                "arguments": _arguments(function.get("parameters") or {})}
        return f"I will call a tool.\n<tool_call>{json.dumps(call)}</tool_call>"
    first = next((m["content"] for m in messages if m["role"] == "user"), "")
    commands = [c for c in dict.fromkeys(BOXED.findall(first)) if c and "..." not in c]
    commands = commands or list(FALLBACK_COMMANDS)
    return f"Let me try this.\n\\boxed{{{commands[turn % len(commands)]}}}"


# -- numbers ------------------------------------------------------------------------------------


def median_pass(passes: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The pass whose `key` is the median (the lower middle one for an even count)."""
    ordered = sorted(passes, key=lambda p: p[key])
    return {**ordered[(len(ordered) - 1) // 2], "passes": [p[key] for p in passes]}


# -- printing -----------------------------------------------------------------------------------



# -- 1. scripted policy -------------------------------------------------------------------------

def summarise(rollouts: list[Rollout], seconds: float) -> dict[str, Any]:
    steps = sum(len(r.turns) for r in rollouts)
    return {"episodes": len(rollouts), "steps": steps, "seconds": seconds,
            "episodes_per_s": len(rollouts) / seconds, "steps_per_s": steps / seconds,
            "outcomes": dict(collections.Counter(r.outcome for r in rollouts)),
            "per_episode_steps": [len(r.turns) for r in rollouts]}


def jailed_pass(envs: list[Env], plays: int, concurrency: int) -> dict[str, Any]:
    cfg = rollout.Config(plays=plays, concurrency=concurrency)
    backend = ScriptedBackend(respond, policy="bench-scripted")
    start = time.perf_counter()
    rollouts = list(rollout.run(envs, backend, cfg))
    return summarise(rollouts, time.perf_counter() - start)


def env_class(source: str, tool_base: type) -> type:
    """Exec an env program here and find its env class, as the jail worker does."""
    namespace: dict[str, Any] = {"__name__": "spade_env", "ToolUseBaseEnv": tool_base}
    exec(compile(source, "<env>", "exec"), namespace)
    return next(obj for name, obj in namespace.items()
                if isinstance(obj, type) and name.endswith("Env") and obj is not tool_base
                and getattr(obj, "__module__", None) == "spade_env")


def in_process_pass(envs: list[Env], plays: int, tool_base: type) -> dict[str, Any]:
    """The reference loop: one episode after another, the env called directly, same policy."""
    cfg = rollout.Config(plays=plays)
    backend = ScriptedBackend(respond, policy="bench-scripted")
    per_episode, outcomes = [], collections.Counter()
    start = time.perf_counter()
    for env in envs:
        for play in range(plays):
            env_obj = env_class(env.source, tool_base)()
            seed = rollout.play_seed(env.id, cfg.hint, play, cfg.round, cfg.seed)
            observation, _ = env_obj.reset(seed=seed)
            if env.domain == "tool_use":
                messages = [{"role": "system", "content": prompts.render("agent_tool_use")},
                            {"role": "user", "content": str(observation)}]
            else:
                messages = [{"role": "user", "content": prompts.render(
                    "agent_game", observation=str(observation))}]
            max_turns = min(env.max_turns, cfg.max_turns, rollout.MAX_TURNS_CAP)
            turns = 0
            while True:
                completion = backend.chat([messages], cfg.sampling, [env.tools or None])[0]
                action = (completion.text if env.domain == "tool_use"
                          else rollout.game_action(completion.text))
                observation, _, terminated, truncated, _ = env_obj.step(action)
                turns += 1
                if terminated is True or truncated is True or turns >= max_turns:
                    break
                role = "tool" if "<tool_call>" in action and env.domain == "tool_use" else "user"
                messages += [{"role": "assistant", "content": completion.text},
                             {"role": role, "content": str(observation)}]
            per_episode.append(turns)
            outcomes["ok"] += 1
    seconds = time.perf_counter() - start
    return {"episodes": len(per_episode), "steps": sum(per_episode), "seconds": seconds,
            "episodes_per_s": len(per_episode) / seconds, "steps_per_s": sum(per_episode) / seconds,
            "outcomes": dict(outcomes), "per_episode_steps": per_episode}


def load_tool_base() -> type:
    namespace: dict[str, Any] = {"__name__": "spade_tool_base"}
    exec(compile(TOOL_BASE.read_text(), str(TOOL_BASE), "exec"), namespace)
    return namespace["ToolUseBaseEnv"]


def bench_scripted(envs: list[Env], plays: int, repeats: int) -> dict[str, Any]:
    tool_base = load_tool_base()
    labels = ["in-process"] + [f"rollout c={c}" for c in CONCURRENCIES]
    passes: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    # Warm-up: one short jailed play (stages the worker files, warms the page cache).
    list(rollout.run(envs[:1], ScriptedBackend(respond), rollout.Config(plays=1, concurrency=1)))
    for _ in range(repeats):
        passes["in-process"].append(in_process_pass(envs, plays, tool_base))
        for concurrency in CONCURRENCIES:
            passes[f"rollout c={concurrency}"].append(jailed_pass(envs, plays, concurrency))
    return {label: median_pass(runs, "steps_per_s") for label, runs in passes.items()}


def scripted_rows(results: dict[str, Any]) -> list[list[Any]]:
    base = results["in-process"]["steps_per_s"]
    return [[label, r["episodes"], r["steps"], r["seconds"], r["episodes_per_s"],
             r["steps_per_s"], ratio(r["steps_per_s"], base)] for label, r in results.items()]


def scripted_notes(results: dict[str, Any]) -> list[str]:
    """Sanity checks: every play ended `ok` and the jailed plays match the in-process ones."""
    notes = []
    base = results["in-process"]["per_episode_steps"]
    for label, r in results.items():
        if set(r["outcomes"]) != {"ok"}:
            notes.append(f"   {label}: outcomes {r['outcomes']}")
        if r["per_episode_steps"] != base:
            notes.append(f"   {label}: turns per episode differ from the in-process baseline")
    return notes


# -- 2. tiny model ------------------------------------------------------------------------------

class TimedBackend:
    """Passes calls through to a backend and sums the wall time spent inside `chat`."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name, self.policy = inner.name, inner.policy
        self.seconds, self.calls, self.conversations = 0.0, 0, 0

    def chat(self, conversations, sampling, tools=None):
        start = time.perf_counter()
        try:
            return self.inner.chat(conversations, sampling, tools)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.conversations += len(conversations)


def pick_model_envs(envs: list[Env], count: int) -> list[Env]:
    """`count` envs spread over the shard, at least one of them tool use when there is one."""
    games = [e for e in envs if e.domain == "game"]
    tools = [e for e in envs if e.domain == "tool_use"]
    chosen = tools[:1] if tools else []
    step = max(1, len(games) // max(1, count - len(chosen)))
    return games[::step][:count - len(chosen)] + chosen


def load_tiny(folder: str) -> Any:
    from stages import models
    from stages.backends import BackendSpec, load_backend

    path = models.tiny(Path(folder) / "tiny")
    backend = load_backend(BackendSpec(name="hf", model=str(path), device="cpu"))
    backend.chat([[{"role": "user", "content": "warm up"}]], Sampling(max_tokens=4, seed=0))
    return backend


def model_pass(backend: Any, envs: list[Env], plays: int, max_tokens: int,
               concurrency: int, warm: bool) -> dict[str, Any]:
    """One timed rollout. `warm`: as `spade rollout` does, the worker pool starts while the
    model loads, so its first jails are ready when play begins; cold: they start inside."""
    timed = TimedBackend(backend)
    cfg = rollout.Config(plays=plays, concurrency=concurrency,
                         sampling=Sampling(temperature=0.6, max_tokens=max_tokens))
    pool = WorkerPool(cfg.sandbox, concurrency, len(envs) * plays) if warm else None
    if pool:
        for future in list(pool.pending):  # the model load the CLI overlaps them with
            future.result()
    start = time.perf_counter()
    rollouts = list(rollout.run(envs, timed, cfg, pool))
    wall = time.perf_counter() - start
    if pool:
        pool.close()
    other = wall - timed.seconds
    turns = [t for r in rollouts for t in r.turns]
    return {"wall": wall, "chat": timed.seconds, "other": other, "other_share": other / wall,
            "chat_calls": timed.calls, "conversations": timed.conversations,
            "episodes": len(rollouts), "steps": len(turns),
            "outcomes": dict(collections.Counter(r.outcome for r in rollouts)),
            "finish_reasons": dict(collections.Counter(t.finish_reason for t in turns))}


def bench_model(envs: list[Env], repeats: int) -> dict[str, Any]:
    chosen = pick_model_envs(envs, MODEL_ENVS)
    with tempfile.TemporaryDirectory(prefix="spade-bench-") as scratch:
        start = time.perf_counter()
        backend = load_tiny(scratch)
        load_seconds = time.perf_counter() - start
        passes = {warm: [model_pass(backend, chosen, MODEL_PLAYS, MODEL_MAX_TOKENS,
                                    MODEL_CONCURRENCY, warm) for _ in range(repeats)]
                  for warm in (True, False)}
    result = median_pass(passes[True], "other_share")
    cold = median_pass(passes[False], "other_share")
    result.update(load_seconds=load_seconds, envs=[e.id for e in chosen],
                  cold_other_share=cold["other_share"], cold_wall=cold["wall"])
    return result


def model_rows(r: dict[str, Any]) -> list[list[Any]]:
    return [["rollout.run wall", r["wall"], 1.0],
            [f"inside backend.chat ({r['chat_calls']} calls, {r['conversations']} convs)",
             r["chat"], r["chat"] / r["wall"]],
            ["orchestration + sandbox", r["other"], r["other_share"]],
            ["same, jails started inside run (no model load to hide them)",
             r["cold_wall"] * r["cold_other_share"], r["cold_other_share"]]]


# -- putting it together ------------------------------------------------------------------------

# -- 3. turn barrier ----------------------------------------------------------------------------

def completion_tokens(sampling: Sampling) -> int:
    """A heavy-tailed completion length, the same for the same request whatever the schedule."""
    draw = random.Random(sampling.seed).lognormvariate(math.log(LENGTH_MEDIAN), LENGTH_SIGMA)
    return min(LENGTH_CAP, max(1, round(draw)))


def barrier_pass(envs: list[Env], barrier: bool) -> dict[str, Any]:
    cfg = rollout.Config(plays=BARRIER_PLAYS, concurrency=BARRIER_CONCURRENCY,
                         max_turns=BARRIER_TURNS, barrier=barrier)
    tokens: list[int] = []

    def latency(sampling: Sampling) -> float:
        tokens.append(completion_tokens(sampling))
        return tokens[-1] * SECONDS_PER_TOKEN

    backend = ScriptedBackend(respond, policy="bench-scripted", latency=latency)
    start = time.perf_counter()
    rollouts = list(rollout.run(envs, backend, cfg))
    seconds = time.perf_counter() - start
    return {**summarise(rollouts, seconds), "tokens": sum(tokens),
            "records": [r.model_dump(exclude={"meta": {"seconds"}}) for r in rollouts]}


def bench_barrier(envs: list[Env]) -> dict[str, Any]:
    passes: dict[str, list[dict[str, Any]]] = {"barrier": [], "barrier-free": []}
    for _ in range(BARRIER_REPEATS):
        for mode in passes:
            passes[mode].append(barrier_pass(envs, barrier=mode == "barrier"))
    medians = {mode: median_pass(runs, "episodes_per_s") for mode, runs in passes.items()}
    same = all(run["records"] == passes["barrier"][0]["records"]
               for runs in passes.values() for run in runs)
    for result in medians.values():
        result.pop("records")
    return {"modes": medians, "same_records": same,
            "ratio": ratio(medians["barrier-free"]["episodes_per_s"],
                           medians["barrier"]["episodes_per_s"])}


def barrier_rows(r: dict[str, Any]) -> list[list[Any]]:
    return [[mode, m["episodes"], m["steps"], m["seconds"], m["episodes_per_s"],
             m["steps_per_s"], m["tokens"] / m["seconds"]] for mode, m in r["modes"].items()]


def measure_barrier(envs: list[Env]) -> dict[str, Any]:
    result = bench_barrier(envs)
    print(table(f"3. turn barrier: {len(envs)} envs x {BARRIER_PLAYS} plays, concurrency "
                f"{BARRIER_CONCURRENCY}, <= {BARRIER_TURNS} turns; completion lengths lognormal "
                f"(median {LENGTH_MEDIAN}, sigma {LENGTH_SIGMA}, cap {LENGTH_CAP}) at "
                f"{SECONDS_PER_TOKEN * 1e3:g} ms/token; median of {BARRIER_REPEATS}",
                ["", "plays", "turns", "s", "plays/s", "turns/s", "tokens/s"],
                barrier_rows(result)), flush=True)
    print(f"   same records under both schedules: {'yes' if result['same_records'] else 'NO'}\n")
    return result


def machine_facts() -> dict[str, Any]:
    """What the numbers depend on; raises when there is no jail or no torch to measure with."""
    nsjail = locate_nsjail()
    python = locate_python("nsjail")
    cgroups = cgroup_controllers()
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise BackendUnavailable(f"the tiny-model benchmark needs torch and transformers "
                                 f"({exc.name} is missing)") from None
    return {"nproc": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "jail_python": python, "nsjail": nsjail, "kernel": platform.release(),
            "cgroup_memory": cgroups.get("memory", False),
            "cgroup_pids": cgroups.get("pids", False),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__}


def header(facts: dict[str, Any]) -> str:
    return (f"machine: nproc={facts['nproc']}  python={facts['python']} (jail python "
            f"{facts['jail_python']})  kernel={facts['kernel']}\n"
            f"nsjail: {facts['nsjail']}  cgroup memory/pids: {facts['cgroup_memory']}/"
            f"{facts['cgroup_pids']}  torch={facts['torch']} ({facts['torch_threads']} threads)  "
            f"transformers={facts['transformers']}\n")


def verdicts(results: dict[str, Any]) -> list[tuple[str, bool, str]]:
    jailed = {k: v for k, v in results["scripted"].items() if k != "in-process"}
    best_label = max(jailed, key=lambda k: jailed[k]["steps_per_s"])
    best = jailed[best_label]["steps_per_s"]
    share = results["model"]["other_share"]
    return [
        (f"scripted rollout >= {TARGET_STEPS_PER_S:g} env-steps/s at the best concurrency",
         best >= TARGET_STEPS_PER_S, f"{best:.1f} steps/s ({best_label})"),
        (f"tiny model: orchestration + sandbox < {TARGET_OVERHEAD_SHARE:.0%} of wall time",
         share < TARGET_OVERHEAD_SHARE, f"{share:.1%}"),
    ]


def measure(quick: bool, facts: dict[str, Any]) -> dict[str, Any]:
    plays, repeats, model_repeats = (2, 1, 1) if quick else (4, 3, 3)
    envs = list(shards.read([str(ENV_SHARD)]))
    results: dict[str, Any] = {"machine": facts, "quick": quick}
    results["scripted"] = bench_scripted(envs, plays, repeats)
    domains = collections.Counter(e.domain for e in envs)
    print(table(f"1. scripted policy over the seed shard ({len(envs)} envs: "
                f"{domains['game']} game, {domains['tool_use']} tool use; {plays} plays each; "
                f"median of {repeats} pass{'es' if repeats > 1 else ''}; ratio = steps/s vs "
                "in-process)",
                ["", "episodes", "steps", "s", "episodes/s", "steps/s", "ratio"],
                scripted_rows(results["scripted"])), flush=True)
    for note in scripted_notes(results["scripted"]):
        print(note)
    results["model"] = bench_model(envs, model_repeats)
    m = results["model"]
    print(table(f"2. tiny model, hf on CPU ({len(m['envs'])} envs x {MODEL_PLAYS} plays, "
                f"max_tokens {MODEL_MAX_TOKENS}, concurrency {MODEL_CONCURRENCY}; load "
                f"{m['load_seconds']:.2f} s excluded; median of {model_repeats})",
                ["", "s", "share"], model_rows(m)), flush=True)
    print(f"   {m['episodes']} episodes, {m['steps']} steps; outcomes {m['outcomes']}; "
          f"finish reasons {m['finish_reasons']}; orchestration share per pass "
          f"{', '.join(f'{s:.1%}' for s in m['passes'])}\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 plays per env and a single pass of everything")
    parser.add_argument("--barrier", action="store_true",
                        help="only the turn-barrier comparison (section 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")

    def run() -> int:
        facts = machine_facts()
        print(header(facts), flush=True)
        if args.barrier:
            envs = list(shards.read([str(ENV_SHARD)]))
            barrier = measure_barrier(envs)
            finish({"machine": facts, "barrier": barrier},
                   [("barrier-free >= 1.5x turn-batched plays/s (same records)",
                     barrier["ratio"] >= TARGET_BARRIER_RATIO and barrier["same_records"],
                     f"{barrier['ratio']:.2f}x")], args.json)
            print(f"barrier-free/barrier: {barrier['ratio']:.2f}x")
            return 0
        results = measure(args.quick, facts)
        return finish(results, verdicts(results), args.json)

    return exit_69_when_unavailable("benchmarks/rollout.py", run)


if __name__ == "__main__":
    sys.exit(main())
