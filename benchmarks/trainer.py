"""Trainer start-up benchmark: a round's train-grpo as a new process against the resident ranks.

What it measures, for ROUNDS rounds on one model (each round trains from the checkpoint the one
before wrote, as `spade run` chains them):
  cold      `spade train-grpo` as a new process every round (what a run without [serve] does):
            wall seconds, and the phases train-grpo reports (rendezvous, load, train, save);
            process start = wall - the phases (interpreter, imports, reading the records).
  resident  the same rounds through `spade trainer` (server mode's default): the ranks start
            once (its start-up is a row of its own), and each round is `spade train-grpo
            --trainer JOBS`, whose client still starts a process (the runner calls it
            in-process, so a real run does not pay that); a round that trains from the
            checkpoint the ranks wrote last starts from their memory.
Both write the same checkpoints (tests/stages/train/test_ranks.py checks it); the table is the
seconds a round spends outside its training step.

How to run:
  python benchmarks/trainer.py                        # the tiny model, 3 rounds
  python benchmarks/trainer.py --model models/smollm2 --rounds 2 --plays 4
The plays are synthetic (random ids in the model's vocabulary, two turns each). Exit 69 when
torch or transformers is missing.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import EX_UNAVAILABLE, finish, ratio, table  # noqa: E402

PHASES = ("rendezvous", "load", "train", "save")


def write_plays(path: Path, vocab: int, plays: int, tokens: int) -> None:
    from stages.records import Rollout, Turn

    rng = random.Random(0)
    lines = []
    for seed in range(plays):
        prompt, turns = [rng.randrange(vocab) for _ in range(tokens)], []
        for _ in range(2):
            completion = [rng.randrange(vocab) for _ in range(tokens // 2)]
            turns.append(Turn(action="a", prompt_ids=list(prompt), completion_ids=completion,
                              logprobs=[rng.uniform(-3, -0.5) for _ in completion]))
            prompt = prompt + completion + [rng.randrange(vocab) for _ in range(8)]
        lines.append(json.dumps(Rollout(env_id=f"env_{seed % 2}", seed=seed,
                                        reward=float(seed % 2), turns=turns).to_dict()))
    path.write_text("\n".join(lines) + "\n")


def one_round(plays: Path, model: str, ckpt: Path, round: int, extra: list[str]) -> dict:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spade_cli", "train-grpo", str(plays),
                           "-m", model, "--ckpt-dir", str(ckpt), "--round", str(round),
                           "-o", str(ckpt.parent / f"train-{ckpt.name}-{round}"), *extra],
                          capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode:
        sys.exit(f"trainer.py: train-grpo failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    shard = next((ckpt.parent / f"train-{ckpt.name}-{round}").glob("*.jsonl"))
    manifest = json.loads((shard.parent / "_manifest.json").read_text())
    info = manifest["stats"]["train"]
    return {"wall": wall, **info["seconds"], "from_memory": bool(info.get("from_memory"))}


def rounds(plays: Path, model: str, ckpt: Path, count: int, extra: list[str]) -> list[dict]:
    out, current = [], model
    for index in range(count):
        out.append(one_round(plays, current, ckpt, index, extra))
        current = str(sorted(ckpt.glob("step-*[0-9]"))[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model directory, or tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plays", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="prompt tokens of a play")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        import transformers
    except ImportError as exc:
        print(f"trainer.py: unavailable: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    from stages.train import ranks as train_ranks
    from stages.models import tiny

    with tempfile.TemporaryDirectory(prefix="spade-bench-trainer-") as work:
        work = Path(work)
        model = str(tiny(work / "tiny")) if args.model == "tiny" else args.model
        vocab = transformers.AutoConfig.from_pretrained(model).vocab_size
        plays = work / "plays.jsonl"
        write_plays(plays, vocab, args.plays, args.tokens)
        cold = rounds(plays, model, work / "cold", args.rounds, [])
        started = time.monotonic()
        ranks = train_ranks.start(1, work / "jobs")
        train_ranks.ready(work / "jobs", wait=train_ranks.START_TIMEOUT)
        up = time.monotonic() - started
        try:
            warm = rounds(plays, model, work / "warm", args.rounds,
                          ["--trainer", str(work / "jobs")])
        finally:
            train_ranks.stop(ranks, work / "jobs")

    def row(side: str, index: int, r: dict) -> list:
        outside = r["wall"] - r["train"]
        return [f"{side} r{index}", r["wall"], r["wall"] - sum(r[p] for p in PHASES),
                r["load"], r["train"], r["save"], outside,
                "yes" if r["from_memory"] else "no"]

    rows = [row("cold", i, r) for i, r in enumerate(cold)]
    rows += [["resident ranks start", up, up, 0.0, 0.0, 0.0, up, "-"]]
    rows += [row("resident", i, r) for i, r in enumerate(warm)]
    print(table(f"train-grpo start-up: {args.model}, {args.plays} plays, {args.rounds} rounds "
                f"(seconds)", ["round", "wall", "process+read", "load", "train", "save",
                                "outside the step", "from memory"], rows))
    later_cold = [r["wall"] - r["train"] for r in cold[1:]]
    later_warm = [r["wall"] - r["train"] for r in warm[1:]]
    saved = ratio(sum(later_warm), sum(later_cold))
    print(f"rounds after the first: outside the step {sum(later_warm):.1f} s resident vs "
          f"{sum(later_cold):.1f} s cold ({saved:.2f}x)")
    results = {"cold": cold, "resident": warm, "resident_start": up}
    verdicts = [("later rounds start from memory", all(r["from_memory"] for r in warm[1:]),
                 str([r["from_memory"] for r in warm])),
                ("resident load below cold load",
                 sum(r["load"] for r in warm[1:]) < sum(r["load"] for r in cold[1:]),
                 f"{sum(r['load'] for r in warm[1:]):.1f} s vs "
                 f"{sum(r['load'] for r in cold[1:]):.1f} s")]
    return finish(results, verdicts, args.json)


if __name__ == "__main__":
    sys.exit(main())
