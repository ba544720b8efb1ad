"""Executor benchmark: what running the jail side through Ray costs, against local, same run.

What it measures, on a one-node Ray cluster started on loopback by this script (what a single
machine can show: the Ray round trips and the per-node jail host, not a second node's CPUs):
  1. validate   `stages.validate.run` over the seed library (16 designs, workers=2), local
                threads vs Ray tasks. Seconds per pass.
  2. rollout    `stages.rollout.run` over the seed env shard (16 envs x --plays, 5 turns, a
                scripted policy that answers instantly, concurrency 8) with a WorkerPool whose
                jails come from a LocalExecutor vs a RayExecutor (every reset and step a Ray
                actor call). Seconds per pass and env-steps/s.
Passes alternate (local, ray, local, ray, ...) so that machine load hits both alike; the median
pass is reported, with ray/local as a ratio of seconds. Records are compared too: both
executors must write the same records (rollouts without meta.seconds).

How to run:
  python benchmarks/executor.py             # 3 passes each, 4 plays per env
  python benchmarks/executor.py --quick     # 1 pass each, 2 plays per env

Targets (a final PASS/MISS line each; the exit status is 0 either way): the records match; the
Ray rollout on one node takes at most 2x the local one (the actor calls stay a small share).
Exit 69 (with a message) when Ray is not installed or a jail cannot start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import EX_UNAVAILABLE, finish, ratio, table  # noqa: E402

LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                 "RAY_AUTH_MODE": "disabled"}
TURNS = 5


def agent(messages, tools) -> str:
    """An instant answer that depends on what the agent was shown."""
    return f"\\boxed{{{sum(map(ord, messages[-1]['content'])) % 10}}}"


def start_head() -> tuple[str, str]:
    """A one-node Ray cluster on loopback; (its address, its temp dir)."""
    os.environ.update(LOOPBACK_ONLY)  # before ray is imported: it reads them then
    import ray

    temp_dir = tempfile.mkdtemp(prefix="spade-ray-")  # short: Ray's socket paths are long
    ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count(),
             _temp_dir=temp_dir, _node_ip_address="127.0.0.1")
    return ray.get_runtime_context().gcs_address, temp_dir


def validate_pass(executor) -> tuple[float, list[bytes]]:
    from stages import seed_library
    from stages import validate as stage
    from stages.records import dumps
    from stages.shards import Stats

    started = time.perf_counter()
    records = list(stage.run(seed_library.designs(), stage.Config(workers=2, seed=0), Stats(),
                             executor))
    return time.perf_counter() - started, [dumps(r) for r in records]


def rollout_pass(executor, plays: int) -> tuple[float, int, list[bytes]]:
    from sandbox.pool import WorkerPool
    from stages import rollout, seed_library
    from stages.backends.scripted import ScriptedBackend
    from stages.records import dumps
    from stages.shards import read

    envs = list(read([str(seed_library.ENV_SHARD)], kinds={"env"}))
    cfg = rollout.Config(plays=plays, concurrency=8, max_turns=TURNS)
    started = time.perf_counter()
    with WorkerPool(cfg.sandbox, cfg.concurrency, len(envs) * plays, executor) as pool:
        records = list(rollout.run(envs, ScriptedBackend(agent), cfg, pool))
    seconds = time.perf_counter() - started
    steps = sum(len(r.turns) for r in records)
    for record in records:
        record.meta.pop("seconds")  # wall-clock time, the one field that may differ
    return seconds, steps, [dumps(r) for r in records]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 pass each, 2 plays per env")
    parser.add_argument("--json", metavar="PATH", help="also write every number here")
    args = parser.parse_args()
    passes, plays = (1, 2) if args.quick else (3, 4)
    try:
        import ray  # noqa: F401
    except ImportError:
        print("executor benchmark: Ray is not installed: pip install 'spade-selfplay[ray]'",
              file=sys.stderr)
        return EX_UNAVAILABLE
    from sandbox.jail import SandboxUnavailable, Worker
    from stages.executor import LocalExecutor, RayExecutor

    try:
        with Worker():
            pass
    except SandboxUnavailable as exc:
        print(f"executor benchmark: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    address, temp_dir = start_head()
    seconds = {(stage, name): [] for stage in ("validate", "rollout")
               for name in ("local", "ray")}
    outputs, steps = {}, 0
    try:
        for _ in range(passes):
            for name in ("local", "ray"):
                with (LocalExecutor(8) if name == "local" else RayExecutor(8, address)) as jobs:
                    took, records = validate_pass(jobs)
                    seconds["validate", name].append(took)
                    outputs["validate", name] = records
                    took, steps, records = rollout_pass(jobs, plays)
                    seconds["rollout", name].append(took)
                    outputs["rollout", name] = records
    finally:
        import ray

        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    median = {key: statistics.median(values) for key, values in seconds.items()}
    rows = []
    for stage in ("validate", "rollout"):
        local, remote = median[stage, "local"], median[stage, "ray"]
        rows.append([stage, local, remote, ratio(remote, local),
                     ratio(steps, local) if stage == "rollout" else "",
                     ratio(steps, remote) if stage == "rollout" else ""])
    print(table(f"Jail side on one loopback Ray node vs local ({passes} passes, median; "
                f"rollout: 16 envs x {plays} plays, {steps} env-steps)",
                ["stage", "local s", "ray s", "ray/local", "local steps/s", "ray steps/s"],
                rows))
    same = all(outputs[stage, "ray"] == outputs[stage, "local"]
               for stage in ("validate", "rollout"))
    rollout_ratio = ratio(median["rollout", "ray"], median["rollout", "local"])
    results = {"seconds": {f"{s}/{n}": v for (s, n), v in seconds.items()}, "steps": steps}
    return finish(results, [
        ("ray writes the same records as local", same, "same" if same else "differ"),
        ("ray rollout on one node at most 2x local", rollout_ratio <= 2.0,
         f"{rollout_ratio:.2f}x")], args.json)


if __name__ == "__main__":
    sys.exit(main())
