"""Registry benchmark: index a synthetic 400-round run, then time lineage queries.

What it measures: a run directory laid out as `spade run` writes it (`r<NNN>/<stage>/` shards
with `_manifest.json`, `ckpt/step-N/trainer_state.json`), written straight with orjson:
  - every 4 rounds a new env set: 150 designs, 100 accepted envs and 50 rejects, 100 hinted
    envs, 5 hinted plays per env;
  - every round 24 unhinted plays per env of the current set (one turn each, 16 completion ids
    and logprobs, as a real play carries), 100 regret rows, train steps of 32 plays (their ids
    as `parents`), one checkpoint; every 20 rounds an eval (10 items and a roll-up).
At full size (--scale 1): 400 rounds, 10,000 envs, 1,010,000 plays.
Rows: write the run (not timed against a target), `registry index` cold, `index` again (a
no-op), lineage of an env (median of 20), lineage of a checkpoint (median of 20), export of
100 envs; plus the registry's size and this process's peak RSS.
Targets: indexing in minutes; a lineage query under 1 s.

How to run:
  python benchmarks/registry.py                 # full size
  python benchmarks/registry.py --scale 0.1     # 40 rounds, 1,000 envs, 101,000 plays
  python benchmarks/registry.py --keep DIR      # write the run and registry into DIR, keep them
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.registry import connect, row_counts  # noqa: E402
from stages.registry.export import Filters, export_envs  # noqa: E402
from stages.registry.index import index_runs  # noqa: E402
from stages.registry.lineage import lineage  # noqa: E402

ENVS_PER_SET, EVERY, HINT_PLAYS, PLAYS, BATCH = 100, 4, 5, 24, 32


def fake_id(prefix: str, *parts) -> str:
    return f"{prefix}_{hashlib.sha256(repr(parts).encode()).hexdigest()[:16]}"


def write_shard(folder: Path, stage: str, kind: str, records: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-00000.jsonl"
    (folder / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    manifest = {"stage": stage, "complete": True, "config_digest": "bench", "shards": {
        "00000": {"input": "<generated>", "input_hash": None, "outputs": {name: len(records)}}}}
    (folder / "_manifest.json").write_bytes(orjson.dumps(manifest))


def source_of(env_set: int, slot: int) -> str:
    return (f"class Game{env_set}x{slot}Env:\n    def reset(self, seed=None):\n"
            f"        return 'set {env_set} slot {slot}', {{}}\n")


def design_set(run: Path, round_: int, env_set: int) -> list[dict]:
    """The design, validate and hint shards of one env set; returns the hinted envs."""
    designs, envs, rejects = [], [], []
    for slot in range(ENVS_PER_SET + ENVS_PER_SET // 2):
        design_id = fake_id("des", env_set, slot)
        designs.append({"kind": "design", "v": 1, "id": design_id, "parents": [],
                        "policy": "runs/bench/model", "round": round_, "slot": slot,
                        "attempt": 0, "skill": f"skill{slot % 7}", "domain": "game",
                        "prompt": "design an env " * 20, "completion": "x" * 400,
                        "corpus_doc": f"doc_{slot % 50}", "meta": {"doc_title": f"Doc {slot}"}})
        source = source_of(env_set, slot)
        digest = hashlib.sha256(source.encode()).hexdigest()
        if slot < ENVS_PER_SET:
            envs.append({"kind": "env", "v": 1, "id": f"env_{digest[:16]}", "parents": [design_id],
                         "policy": "runs/bench/model", "domain": "game",
                         "skill": f"skill{slot % 7}", "class_name": f"Game{env_set}x{slot}Env",
                         "source": source, "source_hash": digest, "max_turns": 1,
                         "meta": {"validation": {"seed": 0, "seeds": [1, 2, 3]},
                                  "trivial": {"chance": 0.1}}})
        else:
            rejects.append({"kind": "validation", "v": 1, "id": fake_id("val", env_set, slot),
                            "parents": [design_id], "check": "oracle", "ok": False,
                            "error": {"type": "oracle", "msg": "no reward"}, "round": round_,
                            "slot": slot, "source_hash": digest})
    folder = run / f"r{round_:03d}"
    write_shard(folder / "design-a0", "design", "design", designs)
    write_shard(folder / "validate-a0", "validate", "env", envs)
    (folder / "validate-a0" / "validation-00000.jsonl").write_bytes(
        b"".join(orjson.dumps(r) + b"\n" for r in rejects))
    manifest = orjson.loads((folder / "validate-a0" / "_manifest.json").read_bytes())
    manifest["shards"]["00000"]["outputs"]["validation-00000.jsonl"] = len(rejects)
    (folder / "validate-a0" / "_manifest.json").write_bytes(orjson.dumps(manifest))
    hinted = [{**env, "hint": "think about the slot"} for env in envs]
    write_shard(folder / "hint", "hint", "env", hinted)
    return hinted


def play(env_id: str, round_: int, index: int, hint: bool, policy: str) -> dict:
    reward = 1.0 if (index * 7 + round_) % 3 == 0 else 0.0
    return {"kind": "rollout", "v": 1, "id": fake_id("ro", env_id, round_, index, hint),
            "parents": [env_id], "policy": policy, "ok": True, "error": None,
            "meta": {"play": index, "temperature": 1.0}, "env_id": env_id, "hint": hint,
            "seed": index, "round": round_,
            "turns": [{"action": "\\boxed{a}", "completion": "\\boxed{a}", "observation": "ok",
                       "reward": reward, "prompt_ids": list(range(24)),
                       "completion_ids": list(range(16)), "logprobs": [-0.5] * 16}],
            "reward": reward, "terminated": True, "truncated": False, "outcome": "ok"}


def write_run(run: Path, rounds: int) -> dict[str, int]:
    run.mkdir(parents=True)
    (run / "recipe.json").write_bytes(orjson.dumps({"name": "bench", "run_dir": "runs/bench"}))
    counts = {"envs": 0, "plays": 0}
    envs: list[dict] = []
    policy = "runs/bench/model"
    for round_ in range(rounds):
        folder = run / f"r{round_:03d}"
        if round_ % EVERY == 0:
            envs = design_set(run, round_, round_ // EVERY)
            counts["envs"] += len(envs)
            hinted = [play(e["id"], round_, i, True, policy) for e in envs
                      for i in range(HINT_PLAYS)]
            write_shard(folder / "rollout-hint", "rollout", "rollout", hinted)
            counts["plays"] += len(hinted)
        blind = [play(e["id"], round_, i, False, policy) for e in envs for i in range(PLAYS)]
        write_shard(folder / "rollout", "rollout", "rollout", blind)
        counts["plays"] += len(blind)
        regrets = [{"kind": "regret", "v": 1, "id": fake_id("rg", e["id"], round_),
                    "parents": [e["id"], e["parents"][0]], "env_id": e["id"],
                    "design_id": e["parents"][0], "round": round_, "regret": (i % 10) / 10,
                    "win": 0.3, "designer_reward": 0.1} for i, e in enumerate(envs)]
        write_shard(folder / "score-regret", "score-regret", "regret", regrets)
        ckpt = f"runs/bench/ckpt/step-{round_ + 1:06d}"
        ids = sorted(p["id"] for p in blind)
        trains = [{"kind": "train", "v": 1, "id": fake_id("tr", round_, s), "step": s,
                   "role": "agent", "parents": ids[s * BATCH:(s + 1) * BATCH], "policy": ckpt,
                   "stats": {"loss": 0.1, "kl": 0.01}}
                  for s in range((len(ids) + BATCH - 1) // BATCH)]
        write_shard(folder / "train-grpo", "train-grpo", "train", trains)
        step = run / "ckpt" / f"step-{round_ + 1:06d}"
        step.mkdir(parents=True)
        (step / "trainer_state.json").write_bytes(orjson.dumps(
            {"step": round_ + 1, "round": round_, "inputs": fake_id("in", round_),
             "parent": policy, "train": [{"id": t["id"]} for t in trains]}))
        policy = ckpt
        if round_ % 20 == 19:
            items = [{"kind": "eval", "v": 1, "id": fake_id("ev", round_, i), "suite": "rg",
                      "task": f"task{i}", "score": 0.5, "round": round_, "policy": ckpt}
                     for i in range(10)]
            items.append({"kind": "eval", "v": 1, "id": fake_id("ev", round_), "suite": "rg",
                          "task": "", "score": 0.5, "round": round_, "policy": ckpt,
                          "parents": [i["id"] for i in items]})
            write_shard(folder / "eval-rg", "eval", "eval", items)
    return counts


def median_seconds(call, args: list) -> float:
    times = []
    for arg in args:
        began = time.perf_counter()
        call(arg)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 400 rounds")
    parser.add_argument("--keep", help="write into this directory and keep it")
    args = parser.parse_args()
    rounds = max(EVERY, int(400 * args.scale))
    root = Path(args.keep or tempfile.mkdtemp(prefix="spade-registry-bench-"))
    run = root / "runs" / "bench"

    rows = []
    began = time.perf_counter()
    counts = write_run(run, rounds)
    rows.append(("write the run (orjson)", time.perf_counter() - began, ""))
    size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())

    con = connect(root / "registry.db")
    began = time.perf_counter()
    report = index_runs(con, [str(run)])
    rows.append(("index, cold", time.perf_counter() - began, f"{report.indexed} shards"))
    began = time.perf_counter()
    again = index_runs(con, [str(run)])
    rows.append(("index again (no-op)", time.perf_counter() - began,
                 f"{again.unchanged} unchanged, {again.indexed} read"))

    env_ids = [r[0] for r in con.execute("SELECT id FROM envs ORDER BY id LIMIT 20")]
    rows.append(("lineage of an env (median of 20)", median_seconds(
        lambda e: lineage(con, e), env_ids), "target < 1 s"))
    ckpts = [r[0] for r in con.execute("SELECT id FROM checkpoints ORDER BY id LIMIT 20")]
    rows.append(("lineage of a checkpoint (median of 20)", median_seconds(
        lambda c: lineage(con, c), ckpts), "target < 1 s"))
    began = time.perf_counter()
    exported = list(export_envs(con, Filters(min_regret=0.5, limit=100)))
    rows.append(("export 100 envs", time.perf_counter() - began, f"{len(exported)} envs"))
    con.close()
    db_bytes = sum(p.stat().st_size for p in root.glob("registry.db*"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print(f"registry benchmark: {rounds} rounds, {counts['envs']:,} envs, "
          f"{counts['plays']:,} plays, shards {size / 2**20:,.0f} MiB, "
          f"registry {db_bytes / 2**20:,.0f} MiB, peak RSS {peak:,.0f} MiB")
    print(f"{'step':<40} {'seconds':>10}  note")
    for name, seconds, note in rows:
        print(f"{name:<40} {seconds:>10.3f}  {note}")
    print("rows:", row_counts(connect(root / "registry.db", create=False)))
    if not args.keep:
        import shutil

        shutil.rmtree(root)


if __name__ == "__main__":
    main()
