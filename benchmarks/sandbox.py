"""Sandbox benchmark: what the nsjail jail costs spade, measured against baselines from the same run.

What it measures (each jailed number next to a baseline taken in the same run, interleaved so
that drift in machine load hits both alike):
  1. launch        nsjail running /usr/bin/true with the argv spade uses (`nsjail_argv` with the
                   command after `--` replaced) vs a bare subprocess of /usr/bin/true; and the jail
                   running `python -s -S -P -c pass` vs the same python bare. Median, p90, ratio.
  2. worker start  `Worker(Sandbox()).start()` (spawn + first reply) vs the unjailed worker
                   (`Sandbox(mode="none")`). Closing the worker is not timed.
  3. round trip    reset/step calls (1 in 10 a reset) to a tiny game env loaded in (a) the jailed
                   worker, (b) the unjailed subprocess worker, (c) this process (the source exec'd
                   here and its methods called directly, as the reference SPADE code does).
                   Median and p99 in microseconds; ratios against the unjailed worker.
  4. validate      envs/s of `stages.validate.run` over the seed library with workers=1 and 2,
                   the median of 3 passes each, and how many envs were accepted.

How to run:
  python benchmarks/sandbox.py            # N=30 launches, 2000 round trips
  python benchmarks/sandbox.py --quick    # N=10 launches, 500 round trips
  python benchmarks/sandbox.py --json out.json   # also write every number to out.json

Targets (a final PASS/MISS line each; the exit status is 0 either way, since this is a measurement):
  - jail launch (/usr/bin/true) under 30 ms median;
  - jailed round trip within 1.5x of the unjailed worker (ratio of medians);
  - validate at least 5 envs/s (workers=2, the `spade validate` default), every seed env accepted.
Exit 69 (with a message) when nsjail or a jail-readable python is unavailable, or a jail cannot start.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

# Run as a script, this file's folder is sys.path[0], and this file (sandbox.py) would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import exit_69_when_unavailable, finish, ratio, table  # noqa: E402
from sandbox.jail import (PYTHON_FLAGS, Limits, Sandbox, SandboxUnavailable,  # noqa: E402
                          Worker, cgroup_controllers, locate_nsjail, locate_python, nsjail_argv,
                          staged_worker_dir)

TRUE = "/usr/bin/true"
TARGET_LAUNCH_MS = 30.0
TARGET_RT_RATIO = 1.5
TARGET_ENVS_PER_S = 5.0

TINY_ENV = r'''
import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}")


class GuessEnv:
    """Guess a number from 1 to 100; the env says higher or lower."""
    max_turns = 10

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(1, 100)
        self.turns = 0
        return "Guess a number from 1 to 100, e.g. \\boxed{50}.", {"turn": 0}

    def step(self, action):
        self.turns += 1
        found = BOXED.findall(action) if isinstance(action, str) else []
        try:
            guess = int(found[-1])
        except (IndexError, ValueError):
            return "No number found.", 0.0, False, self.turns >= self.max_turns, {"turn": self.turns}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {"turn": self.turns}
        hint = "higher" if guess < self.secret else "lower"
        return f"Go {hint}.", 0.0, False, self.turns >= self.max_turns, {"turn": self.turns}

    def solution(self):
        return [f"\\boxed{{{self.secret}}}"]
'''


# -- numbers ------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float], tail: float) -> dict[str, float]:
    return {"n": len(values), "median": statistics.median(values),
            f"p{tail:g}": percentile(values, tail)}



def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of fn takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- printing -----------------------------------------------------------------------------------



# -- 1. launch ----------------------------------------------------------------------------------

def run_quietly(argv: list[str]) -> None:
    """Run argv to completion the way spade starts workers (own session, fds closed)."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    if done.returncode != 0:
        raise SandboxUnavailable(f"{argv[0]} ... {argv[-1]} exited {done.returncode}: "
                                 f"{done.stderr.decode(errors='replace')[-300:]}")


def jail_prefix(nsjail: str, python: str, log_path: str) -> list[str]:
    """spade's nsjail argv up to and including `--`, ready for another command."""
    argv = nsjail_argv(nsjail, python, staged_worker_dir(), Limits(), log_path,
                       cgroup_controllers())
    return argv[:argv.index("--") + 1]


def compare(pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], n: int,
            scale: float, tail: float) -> dict[str, dict[str, dict[str, float]]]:
    """For each label, time (jailed, baseline) n times each, interleaved, after one warm-up."""
    results = {}
    for label, (jailed, bare) in pairs.items():
        jailed(), bare()
        samples: tuple[list[float], list[float]] = ([], [])
        for _ in range(n):
            samples[0].append(timed(jailed) * scale)
            samples[1].append(timed(bare) * scale)
        results[label] = {"jailed": summary(samples[0], tail), "bare": summary(samples[1], tail)}
    return results


def bench_launch(nsjail: str, python: str, n: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="spade-bench-") as scratch:
        prefix = jail_prefix(nsjail, python, os.path.join(scratch, "nsjail.log"))
        py_pass = [python, *PYTHON_FLAGS, "-c", "pass"]
        return compare({
            "true": (lambda: run_quietly(prefix + [TRUE]), lambda: run_quietly([TRUE])),
            "python -c pass": (lambda: run_quietly(prefix + py_pass),
                               lambda: run_quietly(py_pass)),
        }, n, scale=1e3, tail=90)


def launch_rows(results: dict) -> list[list[Any]]:
    rows = []
    for label, pair in results.items():
        jailed, bare = pair["jailed"], pair["bare"]
        rows.append([f"jail {label}", jailed["median"], jailed["p90"],
                     ratio(jailed["median"], bare["median"])])
        rows.append([f"bare {label}", bare["median"], bare["p90"], 1.0])
    return rows


# -- 2. worker start ----------------------------------------------------------------------------

def start_ms(sandbox: Sandbox) -> float:
    """Milliseconds from spawning a worker to its first reply; close() is not timed."""
    worker = Worker(sandbox)
    start = time.perf_counter()
    worker.start()
    elapsed = time.perf_counter() - start
    worker.close()
    return elapsed * 1e3


def bench_worker_start(n: int) -> dict:
    sandboxes = {"jailed": Sandbox(), "bare": Sandbox(mode="none")}
    samples: dict[str, list[float]] = {key: [] for key in sandboxes}
    for sandbox in sandboxes.values():  # warm-up
        start_ms(sandbox)
    for _ in range(n):
        for key, sandbox in sandboxes.items():
            samples[key].append(start_ms(sandbox))
    return {"worker start": {key: summary(values, 90) for key, values in samples.items()}}


# -- 3. round trip ------------------------------------------------------------------------------

def call_plan(n: int) -> list[tuple[str, dict[str, Any]]]:
    """n calls, every tenth a reset (with its own seed), the others guesses."""
    return [("reset", {"seed": i}) if i % 10 == 0 else ("step", {"action": f"\\boxed{{{i % 100}}}"})
            for i in range(n)]


def load_worker(sandbox: Sandbox) -> Worker:
    worker = Worker(sandbox)
    worker.start()
    reply = worker.call("load", source=TINY_ENV)
    if not reply.ok:
        worker.close()
        raise RuntimeError(f"tiny env did not load ({sandbox.mode}): {reply.error}")
    return worker


def worker_caller(worker: Worker) -> Callable[[str, dict[str, Any]], Any]:
    def call(op: str, fields: dict[str, Any]) -> Any:
        reply = worker.call(op, **fields)
        if not reply.ok:
            raise RuntimeError(f"{op} failed in the worker: {reply.outcome} {reply.error}")
        return reply.result
    return call


def in_process_caller() -> Callable[[str, dict[str, Any]], Any]:
    namespace: dict[str, Any] = {"__name__": "spade_env"}
    exec(compile(TINY_ENV, "<env>", "exec"), namespace)
    env = namespace["GuessEnv"]()
    methods = {"reset": env.reset, "step": env.step}
    return lambda op, fields: methods[op](**fields)


def bench_round_trip(n: int) -> dict:
    """Time each call of the same plan against all three targets, interleaved call by call."""
    jailed, bare = load_worker(Sandbox()), load_worker(Sandbox(mode="none"))
    try:
        callers = {"jailed worker": worker_caller(jailed), "unjailed worker": worker_caller(bare),
                   "in-process": in_process_caller()}
        for op, fields in call_plan(50):  # warm-up
            for call in callers.values():
                call(op, fields)
        samples: dict[str, list[float]] = {name: [] for name in callers}
        for op, fields in call_plan(n):
            for name, call in callers.items():
                samples[name].append(timed(lambda: call(op, fields)) * 1e6)
    finally:
        jailed.close()
        bare.close()
    return {name: summary(values, 99) for name, values in samples.items()}


def round_trip_rows(results: dict) -> list[list[Any]]:
    base = results["unjailed worker"]["median"]
    return [[name, s["median"], s["p99"], ratio(s["median"], base)] for name, s in results.items()]


# -- 4. validate throughput ---------------------------------------------------------------------

def bench_validate(workers_options: tuple[int, ...] = (1, 2), repeats: int = 3) -> dict:
    from stages import seed_library
    from stages.shards import Stats
    from stages.validate import Config, run

    designs = seed_library.designs()
    results = {}
    for workers in workers_options:
        rates, accepted, rejects = [], set(), []
        for _ in range(repeats):
            stats = Stats()
            start = time.perf_counter()
            records = list(run(designs, Config(workers=workers), stats))
            rates.append(len(designs) / (time.perf_counter() - start))
            accepted.add(sum(record.kind == "env" for record in records))
            rejects = [f"{r.check}: {r.error.msg if r.error else ''}"[:120]
                       for r in records if r.kind != "env"]
        results[workers] = {"designs": len(designs), "envs_per_s": statistics.median(rates),
                            "runs": rates, "accepted": min(accepted), "rejects": rejects}
    return results


def validate_rows(results: dict) -> list[list[Any]]:
    return [[f"workers={w}", r["envs_per_s"], min(r["runs"]), max(r["runs"]),
             f"{r['accepted']}/{r['designs']}"] for w, r in results.items()]


# -- putting it together ------------------------------------------------------------------------

def machine_facts() -> dict[str, Any]:
    """What the numbers depend on; raises SandboxUnavailable when there is no jail to measure."""
    nsjail = locate_nsjail()
    python = locate_python("nsjail")
    cgroups = cgroup_controllers()
    return {"nproc": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "jail_python": python, "nsjail": nsjail,
            "cgroup_memory": cgroups.get("memory", False), "cgroup_pids": cgroups.get("pids", False),
            "kernel": platform.release()}


def header(facts: dict[str, Any]) -> str:
    def on(flag: bool) -> str:
        return "active" if flag else "INACTIVE (rlimits only)"
    return (f"machine: nproc={facts['nproc']}  python={facts['python']} (jail python "
            f"{facts['jail_python']})  kernel={facts['kernel']}\n"
            f"nsjail: {facts['nsjail']}  cgroup memory limit: {on(facts['cgroup_memory'])}  "
            f"cgroup pids limit: {on(facts['cgroup_pids'])}\n")


def verdicts(results: dict) -> list[tuple[str, bool, str]]:
    launch = results["launch"]["true"]["jailed"]["median"]
    rt = results["round_trip"]
    rt_ratio = ratio(rt["jailed worker"]["median"], rt["unjailed worker"]["median"])
    val = results["validate"][2]
    return [
        ("jail launch median < 30 ms", launch < TARGET_LAUNCH_MS, f"{launch:.2f} ms"),
        ("jailed round trip <= 1.5x unjailed worker", rt_ratio <= TARGET_RT_RATIO,
         f"{rt_ratio:.2f}x"),
        ("validate >= 5 envs/s (workers=2)", val["envs_per_s"] >= TARGET_ENVS_PER_S,
         f"{val['envs_per_s']:.2f} envs/s"),
        ("validate accepts every seed env", val["accepted"] == val["designs"],
         f"{val['accepted']}/{val['designs']}"),
    ]


def measure(quick: bool, facts: dict[str, Any]) -> dict[str, Any]:
    n_launch, n_calls = (10, 500) if quick else (30, 2000)
    results: dict[str, Any] = {"machine": facts, "quick": quick}
    results["launch"] = bench_launch(facts["nsjail"], facts["jail_python"], n_launch)
    print(table(f"1. launch (ms, N={n_launch} each, interleaved)",
                ["", "median", "p90", "ratio"], launch_rows(results["launch"])), flush=True)
    results["worker_start"] = bench_worker_start(n_launch)
    print(table(f"2. worker start: spawn + first reply (ms, N={n_launch} each)",
                ["", "median", "p90", "ratio"],
                launch_rows(results["worker_start"])), flush=True)
    results["round_trip"] = bench_round_trip(n_calls)
    print(table(f"3. round trip, tiny game env ({n_calls} calls, 1 in 10 a reset; µs; "
                "ratio vs unjailed worker)", ["", "median", "p99", "ratio"],
                round_trip_rows(results["round_trip"])), flush=True)
    results["validate"] = bench_validate()
    print(table("4. validate throughput over the seed library (median of 3 passes)",
                ["", "envs/s", "min", "max", "accepted"],
                validate_rows(results["validate"])), flush=True)
    for w, r in results["validate"].items():
        for reject in r["rejects"]:
            print(f"   rejected (workers={w}): {reject}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=10 launches, 500 round trips")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")

    def run() -> int:
        facts = machine_facts()
        print(header(facts), flush=True)
        results = measure(args.quick, facts)
        return finish(results, verdicts(results), args.json)

    return exit_69_when_unavailable("benchmarks/sandbox.py", run)


if __name__ == "__main__":
    sys.exit(main())
