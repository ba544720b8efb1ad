"""Train benchmark: train-grpo tokens/s against a plain transformers training step, same run.

What it measures, per model config, on one fixed batch:
  batch        N samples (default 16), each a prompt of P random token ids (default 192) and a
               completion of C random token ids (default 64), from a seeded generator, ids below
               the smaller of the tokenizer's and the model's vocab; advantages alternate +1/-1;
               sampled logprobs are the model's own (scored by `_start_logprobs` outside the
               timing, before every spade round, since the policy trains), so TIS weights are
               ~1. Micro-batch M (default 8): N/M forward/backward passes per optimizer step
               (gradient accumulation) on both sides.
  spade        `Policy(model_dir, Config(batch_size=N, micro_batch=M, lr=1e-5))`, then
               `list(update(policy, samples, [every index], cfg, 0))`: one optimizer step
               (`_optimizer_step`: PPO-clip + TIS loss, entropy, grad clipping, AdamW), whose
               training forward gives the start logprobs, so the no-grad pass
               (`_start_logprobs`) runs only for a model with dropout. Both are timed
               separately by wrappers around the module functions (the rest of `update` is
               shown as "other").
  plain        the same model loaded fresh from the same folder, the same padded batch (built
               once, outside the timing, already on the device), `model(input_ids,
               attention_mask, labels=...)` with labels masked to the completion tokens,
               `(loss * tokens_in_micro_batch / tokens_in_batch).backward()` per micro-batch,
               `AdamW.step()` with the same hyperparameters. No grad clipping, no extras.
  plain+nograd the plain step preceded by a no-grad eval-mode forward over the same micro-batches
               that gathers the completion tokens' logprobs (what GRPO fundamentally needs:
               old logprobs plus one training pass).
  Sides are interleaved (spade, plain, plain+nograd, then again); 1 warm-up round, then the
  median of 3 timed rounds per side (--quick: 1). tokens/s = completion tokens / seconds; ratio
  = tokens/s against plain (the target) and against plain+nograd (shown, no target). On CUDA
  the weights stay fp32 with bf16 autocast on both sides (as `Policy` does), and MFU is shown:
  6 * params * processed tokens (N * (P + C)) / seconds / peak (--peak-tflops, default 989 for
  an H200's dense bf16).

Configs:
  tiny        `stages.models.tiny` defaults (hidden 64, 2 layers, its default vocab)
  small       `tiny(hidden=256, layers=4, vocab=1024)`; should the BPE learn fewer than 1024 tokens
              from its corpus, the saved model's embeddings are resized to 1024 rows
  qwen3-0.6b  a Qwen3-0.6B-shaped Qwen3Config (hidden 1024, 28 layers, 16 heads, 8 kv heads,
              head_dim 128, intermediate 3072, vocab 151936, tied embeddings), random weights,
              saved in bf16 beside the tokenizer from `tiny`. For a GPU: run by default only when
              CUDA is available, on CPU only when asked with --config qwen3-0.6b.

How to run:
  python benchmarks/train.py                      # tiny and small (+ qwen3-0.6b on CUDA)
  python benchmarks/train.py --quick              # one timed round per side
  python benchmarks/train.py --config small --json out.json
  python benchmarks/train.py --config qwen3-0.6b --peak-tflops 989
  python benchmarks/train.py --threads 1         # steadier on a shared, busy CPU box

Targets (a final PASS/MISS line per config; the exit status is 0 either way, since this is a
measurement): train-grpo tokens/s at least 0.9x the plain forward+backward+AdamW step.
Exit 69 (with a message) when torch, transformers or trl is unavailable, or CUDA is asked for and
missing.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import exit_69_when_unavailable, finish, ratio, table  # noqa: E402
from stages.backends import BackendUnavailable  # noqa: E402

TARGET_RATIO = 0.9
CONFIGS = ("tiny", "small", "qwen3-0.6b")
SIDES = ("spade", "plain", "plain+nograd")
SMALL_VOCAB = 1024
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
                 rms_norm_eps=1e-6)


# -- numbers and printing -----------------------------------------------------------------------




# -- models -------------------------------------------------------------------------------------

def build_model(name: str, folder: Path, device: str) -> Path:
    """Write config `name` as an HF folder (model + tokenizer) under `folder`."""
    import torch

    from stages import models

    out = folder / name
    if name == "tiny":
        return models.tiny(out)
    if name == "small":
        path = models.tiny(out, hidden=256, layers=4, vocab=SMALL_VOCAB)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if model.config.vocab_size < SMALL_VOCAB:  # the tiny BPE corpus learns fewer tokens
            torch.manual_seed(0)
            model.resize_token_embeddings(SMALL_VOCAB, mean_resizing=False)
            model.save_pretrained(path)
        return path
    if name == "qwen3-0.6b":
        from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

        path = models.tiny(out)  # for its tokenizer; the model files are replaced below
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = Qwen3Config(**QWEN3_06B, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
        model.to(torch.bfloat16).save_pretrained(path)
        return path
    raise ValueError(f"unknown config {name!r}")


def model_facts(path: Path) -> dict[str, Any]:
    config = json.loads((path / "config.json").read_text())
    return {key: config.get(key) for key in ("model_type", "hidden_size", "num_hidden_layers",
                                             "intermediate_size", "vocab_size",
                                             "tie_word_embeddings")}


# -- the batch ----------------------------------------------------------------------------------

def make_samples(n: int, prompt: int, completion: int, id_limit: int, seed: int) -> list:
    import torch

    from stages.train_grpo import Sample

    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        ids = torch.randint(0, id_limit, (prompt + completion,), generator=gen).tolist()
        samples.append(Sample(role="agent", prompt_ids=ids[:prompt], completion_ids=ids[prompt:],
                              sampled_logprobs=[0.0] * completion,
                              advantage=1.0 if i % 2 == 0 else -1.0, source=f"bench-{i}"))
    return samples


def score_samples(policy: Any, samples: list, cfg: Any) -> None:
    """Set each sample's sampled logprobs to the model's own (so TIS weights are ~1)."""
    from stages import train_grpo

    for sample, logp in zip(samples, train_grpo._start_logprobs(policy, samples, cfg)):
        sample.sampled_logprobs = [float(v) for v in logp]


# -- the two sides ------------------------------------------------------------------------------

class Clock:
    """Wall time with the device drained at both ends."""

    def __init__(self, torch: Any, device: str):
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def __call__(self) -> float:
        self.sync()
        return time.perf_counter()


class SpadeSide:
    """train-grpo's `update`, with `_start_logprobs` and `_optimizer_step` timed inside it."""

    def __init__(self, model_dir: Path, cfg: Any, samples: list, clock: Clock):
        from stages import train_grpo

        self.module, self.cfg, self.samples, self.clock = train_grpo, cfg, samples, clock
        self.policy = train_grpo.Policy(str(model_dir), cfg)
        self.parts: dict[str, float] = {}

    def timed(self, key: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[key] = self.parts.get(key, 0.0) + self.clock() - start
        return wrapper

    def run(self) -> dict[str, float]:
        module = self.module
        # the policy moved in earlier rounds: rescore (untimed) so TIS weights stay ~1
        score_samples(self.policy, self.samples, self.cfg)
        originals = module._start_logprobs, module._optimizer_step
        module._start_logprobs = self.timed("start_logprobs", originals[0])
        module._optimizer_step = self.timed("optimizer_step", originals[1])
        self.parts = {"start_logprobs": 0.0, "optimizer_step": 0.0}
        try:
            start = self.clock()
            # one optimizer step over the whole batch (what `plan_steps` gives for one
            # epoch with batch_size = N): its training forward scores the start policy
            trained = list(module.update(self.policy, self.samples,
                                         [list(range(len(self.samples)))], self.cfg, 0))
            seconds = self.clock() - start
        finally:
            module._start_logprobs, module._optimizer_step = originals
        stats = trained[-1].stats
        return {"seconds": seconds, **self.parts,
                "other": seconds - self.parts["start_logprobs"] - self.parts["optimizer_step"],
                "steps": len(trained), "loss": stats.get("loss", float("nan")),
                "tis_weight": stats.get("tis_weight", float("nan")),
                "clip_frac": stats.get("clip_frac", float("nan"))}


class PlainSide:
    """A plain causal-LM step: forward with labels, backward, AdamW.step (grad accumulation)."""

    def __init__(self, model_dir: Path, cfg: Any, samples: list, device: str, autocast: bool,
                 clock: Clock):
        from stages.backends.hf import import_torch_transformers

        torch, transformers = import_torch_transformers()
        self.torch, self.device, self.autocast, self.clock = torch, device, autocast, clock
        torch.manual_seed(cfg.seed)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir),
                                                                  dtype=torch.float32)
        self.model = model.to(device)
        self.model.config.use_cache = False
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas,
            weight_decay=cfg.weight_decay)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.total = sum(len(s.completion_ids) for s in samples)
        self.micro = [self.padded(samples[i:i + cfg.micro_batch])
                      for i in range(0, len(samples), cfg.micro_batch)]

    def padded(self, chunk: list) -> dict[str, Any]:
        """Right-padded ids, attention, labels (-100 off the completion) and the shifted mask."""
        torch = self.torch
        width = max(len(s.prompt_ids) + len(s.completion_ids) for s in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for row, s in enumerate(chunk):
            seq = s.prompt_ids + s.completion_ids
            ids[row, :len(seq)] = torch.tensor(seq)
            attention[row, :len(seq)] = 1
            labels[row, len(s.prompt_ids):len(seq)] = torch.tensor(s.completion_ids)
        shifted = labels[:, 1:]
        return {"ids": ids.to(self.device), "attention": attention.to(self.device),
                "labels": labels.to(self.device), "mask": (shifted != -100).to(self.device),
                "targets": shifted.clamp(min=0).to(self.device),
                "tokens": int((labels != -100).sum())}

    def context(self):
        return self.torch.autocast("cuda", dtype=self.torch.bfloat16, enabled=self.autocast)

    def old_logprobs(self) -> list:
        torch = self.torch
        out = []
        self.model.eval()
        with torch.no_grad():
            for mb in self.micro:
                with self.context():
                    logits = self.model(input_ids=mb["ids"], attention_mask=mb["attention"]).logits
                picked = logits[:, :-1][mb["mask"]].float()
                logp = picked.log_softmax(-1).gather(-1, mb["targets"][mb["mask"]][:, None])
                out.append(logp.squeeze(-1).cpu())
        self.model.train()
        return out

    def step(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for mb in self.micro:
            with self.context():
                out = self.model(input_ids=mb["ids"], attention_mask=mb["attention"],
                                 labels=mb["labels"])
            loss = out.loss * (mb["tokens"] / self.total)
            loss.backward()
            loss_sum += float(loss.detach())
        self.optimizer.step()
        return loss_sum

    def run(self, nograd: bool) -> dict[str, float]:
        start = self.clock()
        nograd_seconds = 0.0
        if nograd:
            self.old_logprobs()
            nograd_seconds = self.clock() - start
        loss = self.step()
        seconds = self.clock() - start
        return {"seconds": seconds, "nograd": nograd_seconds,
                "step": seconds - nograd_seconds, "loss": loss}


# -- one config ---------------------------------------------------------------------------------

def median_round(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The round with the median time (the lower middle one for an even count), all times kept."""
    ordered = sorted(rounds, key=lambda r: r["seconds"])
    return {**ordered[(len(ordered) - 1) // 2], "rounds": [r["seconds"] for r in rounds]}


def bench_config(name: str, args: argparse.Namespace, device: str, scratch: Path,
                 repeats: int) -> dict[str, Any]:
    built = time.perf_counter()
    return bench_model(build_model(name, scratch, device), args, device, repeats, built)


def bench_model(path: Path, args: argparse.Namespace, device: str, repeats: int,
                started: float) -> dict[str, Any]:
    """Both sides on the model folder `path` (benchmarks/gpu.py brings its own model);
    `started`: the perf_counter() from which setup time counts."""
    import torch

    from stages import train_grpo

    cfg = train_grpo.Config(batch_size=args.samples, micro_batch=args.micro_batch, lr=1e-5,
                            device=device)
    clock = Clock(torch, device)
    spade = SpadeSide(path, cfg, [], clock)
    id_limit = min(len(spade.policy.tokenizer), spade.policy.model.config.vocab_size)
    samples = make_samples(args.samples, args.prompt, args.completion, id_limit, args.seed)
    score_samples(spade.policy, samples, cfg)
    spade.samples = samples
    plain = PlainSide(path, cfg, samples, spade.policy.device, spade.policy.autocast, clock)
    setup_seconds = time.perf_counter() - started
    runs: dict[str, Callable[[], dict[str, float]]] = {
        "spade": spade.run, "plain": lambda: plain.run(False),
        "plain+nograd": lambda: plain.run(True)}
    rounds: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for index in range(1 + repeats):  # round 0 is the warm-up
        for side in SIDES:
            result = runs[side]()
            if index:
                rounds[side].append(result)
    tokens = sum(len(s.completion_ids) for s in samples)
    processed = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    result: dict[str, Any] = {
        "model": model_facts(path), "params": plain.params, "device": spade.policy.device,
        "autocast_bf16": spade.policy.autocast, "samples": len(samples),
        "prompt": args.prompt, "completion": args.completion, "micro_batch": cfg.micro_batch,
        "completion_tokens": tokens, "processed_tokens": processed,
        "setup_seconds": setup_seconds, "sides": {}}
    for side in SIDES:
        r = median_round(rounds[side])
        r["tokens_per_s"] = tokens / r["seconds"]
        if device.startswith("cuda"):
            r["mfu"] = 6 * plain.params * processed / r["seconds"] / (args.peak_tflops * 1e12)
        result["sides"][side] = r
    base = result["sides"]["plain"]["tokens_per_s"]
    base_nograd = result["sides"]["plain+nograd"]["tokens_per_s"]
    for r in result["sides"].values():
        r["ratio_vs_plain"] = ratio(r["tokens_per_s"], base)
        r["ratio_vs_plain_nograd"] = ratio(r["tokens_per_s"], base_nograd)
    return result


def config_rows(name: str, r: dict[str, Any], cuda: bool) -> list[list[Any]]:
    rows = []
    for side in SIDES:
        s = r["sides"][side]
        row = [name if side == "spade" else "", side, s["seconds"], s["tokens_per_s"],
               s["ratio_vs_plain"], s["ratio_vs_plain_nograd"]]
        if cuda:
            row.append(f"{s['mfu']:.1%}")
        rows.append(row)
    return rows


def breakdown_rows(name: str, r: dict[str, Any]) -> list[list[Any]]:
    s, p, q = r["sides"]["spade"], r["sides"]["plain"], r["sides"]["plain+nograd"]

    def share(base: float, ours: float) -> Any:
        return ratio(base, ours) if ours > 0 else "-"

    return [[name, "no-grad pass", s["start_logprobs"], q["nograd"],
             share(q["nograd"], s["start_logprobs"])],
            ["", "training step", s["optimizer_step"], p["step"],
             share(p["step"], s["optimizer_step"])],
            ["", "other", s["other"], 0.0, "-"],
            ["", "total", s["seconds"], q["seconds"], share(q["seconds"], s["seconds"])]]


# -- putting it together ------------------------------------------------------------------------

def machine_facts(device: str) -> dict[str, Any]:
    try:
        import torch
        import transformers
        import trl
    except ImportError as exc:
        raise BackendUnavailable(f"the train benchmark needs torch, transformers and trl "
                                 f"({exc.name} is missing)") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailable(f"device {device} requested but no CUDA device is available")
    return {"nproc": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "kernel": platform.release(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "transformers": transformers.__version__,
            "trl": trl.__version__, "device": device,
            "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None}


def header(facts: dict[str, Any]) -> str:
    gpu = f" ({facts['gpu']})" if facts["gpu"] else ""
    return (f"machine: nproc={facts['nproc']}  python={facts['python']}  "
            f"kernel={facts['kernel']}\n"
            f"torch={facts['torch']} ({facts['torch_threads']} threads)  "
            f"transformers={facts['transformers']}  trl={facts['trl']}  "
            f"device={facts['device']}{gpu}\n")


def verdicts(results: dict[str, Any]) -> list[tuple[str, bool, str]]:
    out = []
    for name, r in results["configs"].items():
        s = r["sides"]["spade"]
        out.append((f"{name}: train-grpo tokens/s >= {TARGET_RATIO:g}x plain "
                    f"forward+backward+AdamW step", s["ratio_vs_plain"] >= TARGET_RATIO,
                    f"{s['ratio_vs_plain']:.3f}x ({s['tokens_per_s']:.1f} vs "
                    f"{r['sides']['plain']['tokens_per_s']:.1f} tokens/s; vs plain+nograd "
                    f"{s['ratio_vs_plain_nograd']:.3f}x)"))
    return out


def measure(args: argparse.Namespace, facts: dict[str, Any]) -> dict[str, Any]:
    import torch

    from stages.models import transformers_quiet

    transformers_quiet()
    repeats = 1 if args.quick else args.repeats
    device = facts["device"]
    cuda = device.startswith("cuda")
    names = args.config or [c for c in CONFIGS if cuda or c != "qwen3-0.6b"]
    results: dict[str, Any] = {"machine": facts, "quick": args.quick, "repeats": repeats,
                               "peak_tflops": args.peak_tflops if cuda else None, "configs": {}}
    headers = ["config", "side", "s", "tokens/s", "vs plain", "vs plain+nograd"]
    if cuda:
        headers.append("MFU")
    with tempfile.TemporaryDirectory(prefix="spade-bench-train-") as scratch:
        for name in names:
            r = bench_config(name, args, device, Path(scratch), repeats)
            results["configs"][name] = r
            m = r["model"]
            print(table(
                f"{name}: {m['model_type']} hidden {m['hidden_size']}, {m['num_hidden_layers']} "
                f"layers, vocab {m['vocab_size']}, {r['params'] / 1e6:.2f}M params on "
                f"{r['device']}{' (bf16 autocast)' if r['autocast_bf16'] else ' (fp32)'}; "
                f"{r['samples']} samples x ({r['prompt']} prompt + {r['completion']} completion) "
                f"tokens, micro-batch {r['micro_batch']}; median of {repeats} after 1 warm-up; "
                f"tokens/s = {r['completion_tokens']} completion tokens / s"
                + (f"; MFU = 6 x params x {r['processed_tokens']} tokens / s / "
                   f"{args.peak_tflops:g} TFLOP/s" if cuda else ""),
                headers, config_rows(name, r, cuda)), flush=True)
            print(table(f"{name}: where the time goes (spade = train_grpo.update; baseline = "
                        "plain+nograd)", ["config", "part", "spade s", "baseline s",
                                          "baseline/spade"], breakdown_rows(name, r)))
            s = r["sides"]["spade"]
            print("   rounds (s): " + "; ".join(
                f"{side} {', '.join(f'{t:.3f}' for t in r['sides'][side]['rounds'])}"
                for side in SIDES)
                + f"\n   spade last step: loss {s['loss']:.4f}, tis weight {s['tis_weight']:.4f}, "
                f"clip frac {s['clip_frac']:.4f}; setup {r['setup_seconds']:.1f} s excluded\n",
                flush=True)
            gc.collect()  # both models and optimizers go before the next config loads
            if cuda:
                torch.cuda.empty_cache()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed round per side")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    parser.add_argument("--config", action="append", choices=CONFIGS,
                        help="a model config (repeatable); default tiny and small, plus "
                             "qwen3-0.6b on CUDA")
    parser.add_argument("--device", help="cpu or cuda[:N]; default cuda when available")
    parser.add_argument("--samples", type=int, default=16, help="N samples per batch")
    parser.add_argument("--prompt", type=int, default=192, help="P prompt tokens per sample")
    parser.add_argument("--completion", type=int, default=64,
                        help="C completion tokens per sample")
    parser.add_argument("--micro-batch", type=int, default=8,
                        help="samples per forward/backward")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="peak dense TFLOP/s for MFU (default: H200 bf16)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    try:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if args.threads:
            torch.set_num_threads(args.threads)
    except ImportError:
        device = args.device or "cpu"

    def run() -> int:
        facts = machine_facts(device)
        print(header(facts), flush=True)
        results = measure(args, facts)
        return finish(results, verdicts(results), args.json)

    return exit_69_when_unavailable("benchmarks/train.py", run)


if __name__ == "__main__":
    sys.exit(main())
