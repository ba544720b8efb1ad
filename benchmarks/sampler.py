"""Sampler benchmark: what per-request seeds cost vLLM's sampler at every decode step.

What it measures: vLLM's random sampling step as its V1 model runner runs it
(vllm/v1/sample/ops/topk_topp_sampler.py `random_sample`, 0.33.0:606-628), reproduced with torch
alone: probabilities [requests, vocab] divided by exponential noise, then argmax. Unseeded, one
`exponential_()` call fills the noise of the whole batch; seeded (every request carries a `seed`,
as spade sends with `--sampling-seed request`), vLLM fills each request's row from that
request's own generator, in a Python loop ("This can be slow because we handle each request one
by one"). Rows: running requests per engine (batch) at Qwen3's vocabulary, 151,936; ms per
decode step, the median of `--reps`, seeded / unseeded. The last column checks what the seed
buys: the token a request draws when it moves to another row of the batch (as another batch
composition puts it) is the same seeded, and not unseeded.

GPU reference (one H200, this loop, vocabulary 151,936): 384 requests 0.361 ms unseeded, 4.092 ms
seeded (11.3x); 48 requests 0.059 vs 0.499 ms (8.5x). A 30B-A3B decode step on 8 GPUs (one
engine, tensor parallel 8) takes about 15-25 ms, so 384 seeded requests add about 15-25% to it;
data parallel 8 with about 48 requests a replica adds about 4%.
Which vLLM runs this loop: only the V1 model runner. vLLM 0.33's default on CUDA, Model Runner V2
(config/vllm.py:731-767: V2 unless a feature it lacks is asked for), samples every request with
one Gumbel kernel keyed by the request's seed, seeded or not (v1/worker/gpu/sample/sampler.py:
307-361, gumbel.py:264; an unseeded request gets a random seed, sample/states.py:54-58): seeds
cost it nothing measurable. FlashInfer's sampler is off for spade's requests either way: they
ask for processed logprobs (topk_topp_sampler.py:245-248; V2: sampler.py:307-315).

`--hf MODEL` measures the hf backend's instead (stages/backends/hf.py `RowSampler`): whole decode
steps of `generate` on one micro-batch of 16 conversations, sampled by transformers (one
generator for the batch; the baseline) and by a RowSampler (a generator per conversation, then a
greedy step takes its draw), interleaved, ms per step the median of `--reps`; and whether a
conversation keeps its tokens when it moves to another row. CPU reference (2 cores, SmolLM2-135M,
16 conversations, 64 steps, top-p 0.95): transformers 86.5 ms a step, RowSampler 108.1 (1.25x),
and yes. The cost is `torch.multinomial`, which fills a random number per vocabulary entry; an
inverse-CDF draw (one uniform a row) took 94.3 against 88.8 (1.06x), but its samples, as valid,
are others, and the quickstart's learning check, at its fixed seeds, passes with torch's own
draw (+0.62 above round 0 at round 1) and not with that one (+0.48, where it asks for 0.5).

How to run:
  python benchmarks/sampler.py                      # about a minute on 2 cores
  python benchmarks/sampler.py --device cuda        # the GPU reference above
  python benchmarks/sampler.py --batch 48 --batch 384 --json out.json
  spade model smollm2 /tmp/smollm2 && python benchmarks/sampler.py --hf /tmp/smollm2

No target: the exit status is 0 whatever it measures (a measurement, not a check). Needs torch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import finish, ratio, table  # noqa: E402

VOCAB = 151_936  # Qwen3's
BATCHES = (1, 8, 48, 384)  # 48: a replica of dp 8 at 384 plays; 384: one engine for all
REPS = 5
CHECK_VOCAB = 4096  # the row check needs no full vocabulary


def sample(probs, noise, generators: dict[int, Any]):
    """vLLM's `random_sample`: the noise of requests without a generator in one call, then each
    seeded request's row from its own generator; argmax of probs / noise."""
    if len(generators) != probs.shape[0]:
        noise.exponential_()
    for row, generator in generators.items():
        noise[row].exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def generators_for(torch, seeds: list[int], device: str) -> dict[int, Any]:
    """One generator per row, seeded as vLLM seeds a request's: from the request's own seed."""
    return {row: torch.Generator(device=device).manual_seed(seed) for row, seed in enumerate(seeds)}


def ms_per_step(torch, step: Callable[[], Any], device: str, reps: int) -> float:
    """Median wall milliseconds of `step` (after one warm-up), the device synchronised."""
    def synchronise():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    step()
    synchronise()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        step()
        synchronise()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def same_token_in_another_row(torch, probs, seeded: bool, device: str) -> bool | None:
    """Whether request 0 draws the same token at row 0 and at the last row of the batch (the
    other requests and the engine's generator state as they were), as one step of vLLM's; None
    for a batch of one."""
    batch = probs.shape[0]
    if batch < 2:
        return None
    seeds = list(range(1000, 1000 + batch))
    moved = probs.roll(-1, dims=0)  # request 0 is now the last row
    order = seeds[1:] + seeds[:1]
    tokens = []
    for rows, row_seeds, row in ((probs, seeds, 0), (moved, order, batch - 1)):
        torch.manual_seed(0)  # the engine's own generator, in the same state both times
        generators = generators_for(torch, row_seeds, device) if seeded else {}
        tokens.append(int(sample(rows, torch.empty_like(rows), generators)[row]))
    return tokens[0] == tokens[1]


def measure(batches: tuple[int, ...], vocab: int, device: str, reps: int) -> dict[str, Any]:
    import torch

    rows = []
    for batch in batches:
        torch.manual_seed(batch)
        probs = torch.rand(batch, vocab, device=device).softmax(dim=-1)
        noise = torch.empty_like(probs)
        generators = generators_for(torch, list(range(batch)), device)
        check = probs[:, :CHECK_VOCAB].softmax(dim=-1)
        unseeded = ms_per_step(torch, lambda: sample(probs, noise, {}), device, reps)
        seeded = ms_per_step(torch, lambda: sample(probs, noise, generators), device, reps)
        rows.append({"batch": batch, "unseeded_ms": unseeded, "seeded_ms": seeded,
                     "ratio": ratio(seeded, unseeded), "added_ms": seeded - unseeded,
                     "seeded_stays": same_token_in_another_row(torch, check, True, device),
                     "unseeded_stays": same_token_in_another_row(torch, check, False, device)})
    return {"device": device, "vocab": vocab, "reps": reps, "torch": torch.__version__,
            "rows": rows}


HF_ROWS, HF_TOKENS = 16, 64


def measure_hf(model: str, reps: int) -> dict[str, Any]:
    from transformers import LogitsProcessorList

    from stages.backends import BackendSpec, Sampling, load_backend

    backend = load_backend(BackendSpec(name="hf", model=model))
    torch = backend.torch
    sampling = Sampling(temperature=1.0, top_p=0.95, max_tokens=HF_TOKENS)
    prompts = [backend.render([{"role": "user", "content": f"Tell story number {row}."}], None)
               for row in range(HF_ROWS)]
    width = max(map(len, prompts))
    pad = backend.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=backend.device)
    mask = (torch.arange(width) >= torch.tensor([[width - len(p)] for p in prompts])).long()
    steps = dict(input_ids=ids, attention_mask=mask.to(backend.device), max_new_tokens=HF_TOKENS,
                 min_new_tokens=HF_TOKENS)  # every row runs every step: the same work both ways

    def transformers_sampling():
        torch.manual_seed(0)
        return backend.model.generate(**steps, do_sample=True, temperature=1.0, top_p=0.95)

    def row_sampling(seeds=tuple(range(HF_ROWS)), rows=ids, attention=steps["attention_mask"]):
        sampler = backend.row_sampler(replace(sampling, seeds=seeds), len(seeds))
        return backend.model.generate(**{**steps, "input_ids": rows, "attention_mask": attention},
                                      do_sample=False,
                                      logits_processor=LogitsProcessorList([sampler]))

    times: dict[str, list[float]] = {"transformers": [], "rows": []}
    with torch.no_grad():
        transformers_sampling(), row_sampling()  # warm-up
        for _ in range(reps):
            for name, run in (("transformers", transformers_sampling), ("rows", row_sampling)):
                started = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - started) * 1000 / HF_TOKENS)
        moved = row_sampling(tuple(range(1, HF_ROWS)) + (0,), ids.roll(-1, 0),
                             steps["attention_mask"].roll(-1, 0))
        stays = bool((row_sampling()[0, width:] == moved[-1, width:]).all())
    base, rows = statistics.median(times["transformers"]), statistics.median(times["rows"])
    return {"model": model, "device": backend.device, "rows": HF_ROWS, "reps": reps,
            "transformers_ms": base, "row_sampler_ms": rows, "ratio": ratio(rows, base),
            "stays": stays}


def report_hf(results: dict[str, Any]) -> str:
    return table(f"hf backend decode step, {results['rows']} conversations, {results['model']} on "
                 f"{results['device']} (median of {results['reps']})",
                 ["transformers sampling ms", "RowSampler ms", "RowSampler/transformers",
                  "same tokens in another row (RowSampler)"],
                 [[results["transformers_ms"], results["row_sampler_ms"], results["ratio"],
                   "yes" if results["stays"] else "no"]])


def report(results: dict[str, Any]) -> str:
    def yes(value: bool | None) -> str:
        return "-" if value is None else "yes" if value else "no"

    rows = [[str(r["batch"]), r["unseeded_ms"], r["seeded_ms"], r["added_ms"], r["ratio"],
             f"{yes(r['seeded_stays'])} / {yes(r['unseeded_stays'])}"] for r in results["rows"]]
    return table(f"vLLM's sampling step on {results['device']} (vocab {results['vocab']:,}, "
                 f"median of {results['reps']}, torch {results['torch']})",
                 ["requests", "unseeded ms", "seeded ms", "added ms", "seeded/unseeded",
                  "same token in another row (seeded / unseeded)"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, action="append", metavar="N",
                        help=f"running requests (repeatable; default "
                             f"{', '.join(map(str, BATCHES))})")
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU reference")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    parser.add_argument("--hf", metavar="MODEL", help="measure the hf backend's sampling instead")
    args = parser.parse_args(argv)
    if args.hf:
        results = measure_hf(args.hf, args.reps)
        print(report_hf(results))
        return finish(results, [], args.json)
    results = measure(tuple(args.batch or BATCHES), args.vocab, args.device, args.reps)
    print(report(results))
    return finish(results, [], args.json)


if __name__ == "__main__":
    sys.exit(main())
