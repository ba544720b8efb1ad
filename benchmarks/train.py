"""Train benchmark: train-grpo on episodes shaped like the paper's, against the per-turn path it
replaced and a plain forward+backward of the same tokens, all in the same run.

What it measures, per episode shape, on one fixed batch of P plays (default 2):
  model        a Qwen3-shaped model with the real vocabulary (151,936, tied embeddings as
               Qwen3-4B) and a small body (default hidden 256, 2 layers), random weights, built
               offline beside the tiny model's tokenizer. Gradient checkpointing on, as in the
               paper recipes. Token ids are random below the vocabulary size.
  episodes     T turns of C completion tokens, each followed by O observation tokens, after a
               first prompt of 1,500 tokens: every turn's prompt is the previous prompt plus its
               completion plus the observation, as a chat template renders a conversation.
               Shapes: realistic 6 x (500 + 300), heavy 10 x (1,500 + 500) (the study's cases).
  spade        `stages.train.loop.update` on `build_samples` of those plays: one sequence per
               episode, packed micro-batches of --micro-batch-tokens, logits only at loss
               positions in chunks, one optimizer step.
  per-turn     the path train-grpo had before (main at 9ac5433), rebuilt here as the baseline:
               every turn its own sample, micro-batches of --per-turn-micro-batch turns (4, as
               the 4B recipes had; fewer when its logits would not fit in the memory here, and
               the table says so) right-padded, logits kept from the micro-batch's first
               completion position to its end, in fp32 over the whole vocabulary.
  plain        the spade side's packed rows through `model(input_ids, position_ids, labels)`
               (full logits, the library's own loss), backward, AdamW: the tokens/s baseline.
  head         the output head alone, forward and backward, on the largest micro-batch of
               spade's layout (chunks of loss positions) and of the per-turn layout ([rows,
               kept positions, vocabulary] at once): the logits' share of each one's peak.
  Sides are interleaved; 1 warm-up round, then the median of --repeats timed rounds.
  Peak memory is the step's peak above the memory held before it: the CUDA allocator's peak,
  or on CPU the resident high-water mark (VmHWM, reset through /proc/self/clear_refs, with
  glibc set to give freed blocks back at once).

How to run:
  python benchmarks/train.py                         # both shapes, 2 plays each
  python benchmarks/train.py --shape realistic --plays 16 --sides spade
  python benchmarks/train.py --hidden 2560 --layers 4 --json out.json   # on a GPU

Targets (a PASS/MISS line each; the exit status is 0 either way, this is a measurement):
  forward tokens per play at most 1.1x the episode's own length (spade);
  the logits' share of spade's peak at most 1/8 of the per-turn path's;
  spade's loss tokens/s at least 0.9x plain's.
Exit 69 (with a message) when torch or transformers is unavailable, or CUDA is asked for and
missing.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
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

FIRST_PROMPT = 1500
QWEN3_VOCAB = 151936
SIDES = ("spade", "per-turn", "plain", "head", "head per-turn")
TARGET_FORWARD = 1.1
TARGET_LOGITS = 1 / 8
TARGET_SPEED = 0.9
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


@dataclass(frozen=True)
class Shape:
    turns: int
    completion: int
    observation: int
    first_prompt: int = FIRST_PROMPT

    @property
    def episode_tokens(self) -> int:
        return self.first_prompt + self.turns * (self.completion + self.observation) - \
            self.observation  # the last observation is never read

    def describe(self) -> str:
        return f"{self.turns} x ({self.completion} + {self.observation}) after {self.first_prompt}"


SHAPES = {"realistic": Shape(6, 500, 300), "heavy": Shape(10, 1500, 500)}


# -- the model and the plays --------------------------------------------------------------------

def build_model(folder: Path, hidden: int, layers: int, vocab: int, device: str) -> Path:
    """A Qwen3-shaped model with random weights and the tiny model's tokenizer (for saving)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from stages import models

    path = models.tiny(folder / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    heads = max(1, hidden // 64)
    config = Qwen3Config(hidden_size=hidden, intermediate_size=hidden * 3,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), head_dim=64, vocab_size=vocab,
                         tie_word_embeddings=True, max_position_embeddings=65536,
                         pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(path)
    return path


def make_plays(shape: Shape, plays: int, vocab: int, seed: int) -> list:
    from stages.records import Rollout, Turn

    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    out = []
    for index in range(plays):
        prompt, turns = ids(shape.first_prompt), []
        for _ in range(shape.turns):
            completion = ids(shape.completion)
            turns.append(Turn(action="a", prompt_ids=prompt, completion_ids=completion,
                              logprobs=[-12.0] * shape.completion))
            prompt = prompt + completion + ids(shape.observation)
        out.append(Rollout(env_id="env_bench", seed=index, reward=float(index % 2),
                           turns=turns))
    return out


# -- memory and time ------------------------------------------------------------------------------

class Meter:
    """Seconds and peak memory above what was held at the start, with the device drained."""

    def __init__(self, torch, device: str):
        from stages.train.loop import PeakMemory

        self.torch, self.device, self.peak = torch, device, PeakMemory(torch, device)
        self.cuda = device.startswith("cuda")
        self.libc = None
        if not self.cuda:
            # glibc keeps freed blocks for reuse, and a side would then grow into what the
            # previous side freed without raising the resident peak: map every block of
            # 128 KiB or more on its own (freed at once), and trim the heap before each side
            self.libc = ctypes.CDLL("libc.so.6")
            self.libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)

    def held(self) -> int:
        if self.cuda:
            return int(self.torch.cuda.memory_allocated(self.device))
        found = re.search(r"^VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
        return int(found.group(1)) * 1024

    def __call__(self, fn: Callable[[], dict]) -> dict:
        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize()
        else:
            self.libc.malloc_trim(0)
        before = self.held()
        self.peak.reset()
        start = time.perf_counter()
        result = fn()
        if self.cuda:
            self.torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = self.peak.read() or before
        return {**result, "seconds": seconds, "peak_above_bytes": max(0, peak - before)}


def available(device: str) -> int:
    """Bytes a new allocation can still get: free CUDA memory, or MemAvailable on CPU."""
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info()[0])
    found = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    return int(found.group(1)) * 1024


# -- the sides --------------------------------------------------------------------------------

class Side:
    """A freshly loaded model and optimizer (the same weights on every side)."""

    def __init__(self, model_dir: Path, cfg: Any):
        from stages.train.policy import Policy

        self.policy = Policy(str(model_dir), cfg)
        self.torch, self.cfg = self.policy.torch, cfg


class SpadeSide(Side):
    def __init__(self, model_dir: Path, cfg: Any, plays: list):
        from stages.train import loop
        from stages.train.samples import build_samples

        super().__init__(model_dir, cfg)
        self.stage = loop
        self.samples, _ = build_samples(plays, cfg)
        # the sampler's logprobs are the model's own, so TIS weights are ~1 (untimed)
        for sample, logp in zip(self.samples,
                                loop._start_logprobs(self.policy, self.samples, cfg)):
            sample.sampled_logprobs = [float(v) for v in logp]

    def run(self) -> dict:
        (record,) = self.stage.update(self.policy, self.samples, [list(range(len(self.samples)))],
                                      self.cfg, 0)
        return {"forward_tokens": record.stats["forward_tokens"],
                "loss_tokens": record.stats["loss_tokens"], "loss": record.stats["loss"]}


class PerTurnSide(Side):
    """The per-turn path train-grpo had before one sequence per episode (main at 9ac5433)."""

    def __init__(self, model_dir: Path, cfg: Any, plays: list, micro_batch: int):
        from stages.train.samples import Sample

        super().__init__(model_dir, cfg)
        self.samples = [Sample.of_turn("agent", t.prompt_ids, t.completion_ids, t.logprobs,
                                       1.0 if p.reward else -1.0, 1.0, p.id)
                        for p in plays for t in p.turns]
        self.micro_batch = micro_batch

    def padded(self, chunk: list):
        """Right-padded ids, attention, the completion mask and targets (shifted by one)."""
        torch, device = self.torch, self.policy.device
        width = max(len(s.ids) for s in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        mask = torch.zeros((len(chunk), width - 1), dtype=torch.bool)
        targets = torch.zeros((len(chunk), width - 1), dtype=torch.long)
        for row, s in enumerate(chunk):
            ids[row, :len(s.ids)] = torch.tensor(s.ids)
            attention[row, :len(s.ids)] = 1
            start, end = s.loss_positions[0] - 1, s.loss_positions[-1]
            mask[row, start:end] = True
            targets[row, start:end] = torch.tensor(s.ids[start + 1:end + 1])
        return ids.to(device), attention.to(device), mask.to(device), targets.to(device)

    @staticmethod
    def kept(chunk: list) -> int:
        """Positions whose logits this path keeps for a micro-batch: from its first
        completion position's predictor to the end of its longest row."""
        return max(len(s.ids) for s in chunk) - (min(s.loss_positions[0] for s in chunk) - 1)

    def logits_bytes(self, vocab: int) -> int:
        """The largest logits tensor a micro-batch of this path makes: rows x kept x vocab fp32
        (it makes about three of them at once: logits, their log-softmax, the gradient)."""
        return max(len(chunk) * self.kept(chunk) * vocab * 4 for chunk in self.batches())

    def batches(self):
        for first in range(0, len(self.samples), self.micro_batch):
            yield self.samples[first:first + self.micro_batch]

    def run(self) -> dict:
        from stages.train.grpo import token_loss
        from trl.trainer.utils import selective_log_softmax

        torch, policy = self.torch, self.policy
        total = sum(len(s.loss_positions) for s in self.samples)
        forward = 0
        policy.optimizer.zero_grad(set_to_none=True)
        for chunk in self.batches():
            ids, attention, mask, targets = self.padded(chunk)
            forward += ids.numel()
            first = int(mask.any(0).int().argmax())
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=policy.autocast):
                logits = policy.model(input_ids=ids, attention_mask=attention,
                                      logits_to_keep=ids.shape[1] - first).logits[:, :-1].float()
            logp = torch.nn.functional.pad(selective_log_softmax(logits, targets[:, first:]),
                                           (first, 0))[mask]
            advantages = torch.tensor([s.advantage for s in chunk for _ in s.loss_positions])
            terms, _ = token_loss(torch, logp, logp.detach(), logp.detach(),
                                  advantages.to(logp.device), self.cfg)
            (terms.sum() / total).backward()
            del logits, logp, terms
        policy.optimizer.step()
        return {"forward_tokens": float(forward), "loss_tokens": float(total),
                "micro_batch": self.micro_batch}


class PlainSide(SpadeSide):
    """Spade's sequences, packed, through the model's own forward with labels: full fp32
    logits at every position, so its micro-batches hold fewer tokens (--plain-micro-batch-tokens)
    or a real vocabulary would not fit."""

    def __init__(self, model_dir: Path, cfg: Any, plays: list, budget: int):
        super().__init__(model_dir, cfg, plays)
        self.budget = budget

    def run(self) -> dict:
        from stages.train.packing import micro_batches

        torch, policy = self.torch, self.policy
        total = sum(len(s.loss_positions) for s in self.samples)
        policy.optimizer.zero_grad(set_to_none=True)
        for rows in micro_batches([len(s.ids) for s in self.samples], self.budget):
            chunk = [self.samples[i] for i in rows]
            packed = policy.pack(chunk)
            labels = torch.full_like(packed.ids, -100)
            labels[0, packed.predictors + 1] = packed.targets
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=policy.autocast):
                out = policy.model(input_ids=packed.ids, position_ids=packed.positions,
                                   labels=labels)
            (out.loss * (packed.targets.numel() / total)).backward()
            del out
        policy.optimizer.step()
        return {"forward_tokens": float(sum(len(s.ids) for s in self.samples)),
                "loss_tokens": float(total)}


class HeadSide(Side):
    """The output head alone, forward and backward, on the largest micro-batch of a layout:
    the logits' share of that layout's peak."""

    def __init__(self, model_dir: Path, cfg: Any, of: Side):
        super().__init__(model_dir, cfg)
        self.of = of

    def run(self) -> dict:
        from stages.train.packing import head_logprobs, micro_batches
        from trl.trainer.utils import selective_log_softmax

        torch, policy = self.torch, self.policy
        head = policy.model.get_output_embeddings()
        vocab, hidden_size = head.weight.shape
        gen = torch.Generator().manual_seed(0)

        def inputs(*shape):
            hidden = torch.randn(*shape, hidden_size, generator=gen).to(policy.device)
            targets = torch.randint(0, vocab, shape, generator=gen).to(policy.device)
            return hidden.requires_grad_(), targets

        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=policy.autocast):
            if isinstance(self.of, PerTurnSide):  # [rows, kept, vocabulary] at once
                rows, kept = max(((len(c), self.of.kept(c)) for c in self.of.batches()),
                                 key=lambda x: x[0] * x[1])
                hidden, targets = inputs(rows, kept)
                logp = selective_log_softmax(head(hidden).float(), targets)
            else:  # loss positions only, a chunk at a time
                groups = micro_batches([len(s.ids) for s in self.of.samples],
                                       self.cfg.micro_batch_tokens)
                n = max(sum(len(self.of.samples[i].loss_positions) for i in g) for g in groups)
                hidden, targets = inputs(n)
                logp, _ = head_logprobs(torch, head, hidden, targets,
                                        torch.ones(n, device=policy.device), policy.autocast,
                                        with_entropy=True)
        logp.sum().backward()
        policy.model.zero_grad(set_to_none=True)
        return {}


# -- one shape --------------------------------------------------------------------------------

def bench_shape(name: str, shape: Shape, model_dir: Path, args: argparse.Namespace,
                device: str) -> dict[str, Any]:
    import torch

    from stages.train.config import Config

    cfg = Config(lr=1e-5, micro_batch_tokens=args.micro_batch_tokens,
                 gradient_checkpointing=True, device=device)
    config = json.loads((model_dir / "config.json").read_text())
    plays = make_plays(shape, args.plays, config["vocab_size"], args.seed)
    wanted = args.sides or list(SIDES)
    sides: dict[str, Any] = {}
    if "spade" in wanted or "head" in wanted:
        sides["spade"] = SpadeSide(model_dir, cfg, plays)
    does_not_fit: dict[str, str] = {}
    if "per-turn" in wanted or "head per-turn" in wanted:
        # the recipes' turns a pass when they fit here, else the most that do: an
        # out-of-memory kill would take the whole table with it
        for micro_batch in range(args.per_turn_micro_batch, 0, -1):
            per_turn = PerTurnSide(model_dir, cfg, plays, micro_batch)
            need, free = 3 * per_turn.logits_bytes(config["vocab_size"]), available(device)
            if need <= 0.7 * free:
                sides["per-turn"] = per_turn
                break
            does_not_fit[f"per-turn x{micro_batch}"] = (
                f"does not fit: its logits need about {need / 2 ** 30:.1f} GiB at "
                f"{micro_batch} turns a pass, {free / 2 ** 30:.1f} GiB available")
            per_turn.policy.close()
            del per_turn
        if "per-turn" not in sides:
            wanted = [w for w in wanted if w not in ("per-turn", "head per-turn")]
    if "plain" in wanted:
        sides["plain"] = PlainSide(model_dir, cfg, plays, args.plain_micro_batch_tokens)
    if "head" in wanted:
        sides["head"] = HeadSide(model_dir, cfg, sides["spade"])
    if "head per-turn" in wanted:
        sides["head per-turn"] = HeadSide(model_dir, cfg, sides["per-turn"])
    meter = Meter(torch, sides[next(iter(sides))].policy.device)
    rounds: dict[str, list[dict]] = {side: [] for side in wanted}
    for index in range(1 + args.repeats):  # round 0 warms up
        for side in wanted:
            result = meter(sides[side].run)
            if index:
                rounds[side].append(result)
    params = sum(p.numel() for p in next(iter(sides.values())).policy.model.parameters())
    results: dict[str, Any] = {"shape": shape.__dict__, "plays": args.plays,
                               "episode_tokens": shape.episode_tokens, "params": params,
                               "device": meter.device, "sides": {}, "does_not_fit": does_not_fit}
    for side in wanted:
        timed = rounds[side]
        r = dict(min(timed, key=lambda x: abs(x["seconds"] - statistics.median(
            t["seconds"] for t in timed))))
        r["rounds"] = [t["seconds"] for t in timed]
        if "loss_tokens" in r:
            r["loss_tokens_per_s"] = r["loss_tokens"] / r["seconds"]
            r["forward_per_play"] = r["forward_tokens"] / args.plays
            r["forward_vs_episode"] = r["forward_per_play"] / shape.episode_tokens
            if meter.cuda:
                r["mfu"] = 6 * params * r["forward_tokens"] / r["seconds"] / \
                    (args.peak_tflops * 1e12)
        results["sides"][side] = r
    for side, head in (("spade", "head"), ("per-turn", "head per-turn")):
        if side in results["sides"] and head in results["sides"]:
            results["sides"][side]["logits_bytes"] = results["sides"][head]["peak_above_bytes"]
    for side in sides.values():
        side.policy.close()
    return results


def shape_rows(r: dict[str, Any], cuda: bool) -> list[list[Any]]:
    rows = []
    for side, s in r["sides"].items():
        logits = s.get("logits_bytes")
        rows.append([side, s["seconds"], s.get("loss_tokens_per_s", "-"),
                     s.get("forward_per_play", "-"), s.get("forward_vs_episode", "-"),
                     s["peak_above_bytes"] / 2 ** 30,
                     logits / 2 ** 30 if logits is not None else "-"]
                    + ([f"{s['mfu']:.1%}" if "mfu" in s else "-"] if cuda else []))
    for side, why in r["does_not_fit"].items():
        rows.append([side, why] + [""] * (5 + cuda))
    return rows


def verdicts(results: dict[str, Any]) -> list[tuple[str, bool, str]]:
    out = []
    for name, r in results["shapes"].items():
        s = r["sides"]
        if "spade" in s:
            x = s["spade"]["forward_vs_episode"]
            out.append((f"{name}: forward tokens per play <= {TARGET_FORWARD:g}x the episode",
                        x <= TARGET_FORWARD, f"{x:.3f}x"
                        + (f" (per-turn: {s['per-turn']['forward_vs_episode']:.2f}x)"
                           if "per-turn" in s else "")))
        if "logits_bytes" in s.get("spade", {}) and "logits_bytes" in s.get("per-turn", {}):
            ours, theirs = s["spade"]["logits_bytes"], s["per-turn"]["logits_bytes"]
            share = ratio(ours, theirs)
            out.append((f"{name}: logits' share of the peak <= 1/8 of the per-turn path's",
                        share <= TARGET_LOGITS,
                        f"{share:.3f} ({ours / 2 ** 30:.2f} vs {theirs / 2 ** 30:.2f} GiB, "
                        f"per-turn at {s['per-turn']['micro_batch']} turns a pass)"))
        if "spade" in s and "plain" in s:
            speed = ratio(s["spade"]["loss_tokens_per_s"], s["plain"]["loss_tokens_per_s"])
            out.append((f"{name}: loss tokens/s >= {TARGET_SPEED:g}x plain forward+backward",
                        speed >= TARGET_SPEED, f"{speed:.3f}x"))
    return out


# -- putting it together ------------------------------------------------------------------------

def machine_facts(device: str) -> dict[str, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise BackendUnavailable(f"the train benchmark needs torch and transformers "
                                 f"({exc.name} is missing)") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailable(f"device {device} requested but no CUDA device is available")
    return {"nproc": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__, "device": device,
            "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None}


def measure(args: argparse.Namespace, facts: dict[str, Any]) -> dict[str, Any]:
    from stages.models import transformers_quiet

    transformers_quiet()
    results: dict[str, Any] = {"machine": facts, "repeats": args.repeats, "shapes": {}}
    cuda = facts["device"].startswith("cuda")
    headers = ["side", "s", "loss tok/s", "fwd tok/play", "fwd/episode", "peak GiB",
               "logits GiB"] + (["MFU"] if cuda else [])
    with tempfile.TemporaryDirectory(prefix="spade-bench-train-") as scratch:
        model_dir = build_model(Path(scratch), args.hidden, args.layers, args.vocab,
                                facts["device"])
        for name in args.shape or list(SHAPES):
            shape = SHAPES[name]
            r = bench_shape(name, shape, model_dir, args, facts["device"])
            results["shapes"][name] = r
            print(table(
                f"{name}: {args.plays} plays of {shape.describe()} tokens "
                f"({shape.episode_tokens} a play); Qwen3 hidden {args.hidden}, {args.layers} "
                f"layers, vocab {args.vocab}, {r['params'] / 1e6:.1f}M params on {r['device']}; "
                f"micro-batch {args.micro_batch_tokens} tokens (per-turn: "
                f"{args.per_turn_micro_batch} turns); median of {args.repeats} after a warm-up; "
                f"peak = above the memory held before the step", headers, shape_rows(r, cuda)),
                flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", choices=list(SHAPES),
                        help="an episode shape (repeatable); default both")
    parser.add_argument("--sides", action="append", choices=list(SIDES),
                        help="a side to run (repeatable); default all")
    parser.add_argument("--plays", type=int, default=2, help="plays in the batch")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=QWEN3_VOCAB)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--plain-micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--per-turn-micro-batch", type=int, default=4,
                        help="turns per pass on the per-turn side (the 4B recipes had 4)")
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu or cuda[:N]; default cuda when available")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="peak dense TFLOP/s for MFU (default: H200 bf16)")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    try:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    except ImportError:
        device = args.device or "cpu"

    def run() -> int:
        facts = machine_facts(device)
        print(f"machine: nproc={facts['nproc']}  python={facts['python']}  torch={facts['torch']} "
              f"({facts['torch_threads']} threads)  transformers={facts['transformers']}  "
              f"device={device}{' (' + facts['gpu'] + ')' if facts['gpu'] else ''}\n", flush=True)
        results = measure(args, facts)
        return finish(results, verdicts(results), args.json)

    return exit_69_when_unavailable("benchmarks/train.py", run)


if __name__ == "__main__":
    sys.exit(main())
