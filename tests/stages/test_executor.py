"""Executors: on Ray the jail side gives what it gives locally (the same records, byte for byte,
for validate and rollout, the same worker replies, the same exit 69 when a jail cannot start);
Ray is optional, imported only when asked for, and a cluster that is missing or unreachable is
one line and exit 69.

The Ray tests share one local Ray head on loopback (every address 127.0.0.1, no usage reports,
no dashboard), started once per session and shut down after.
"""

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sandbox.jail import Limits, Sandbox, SandboxUnavailable
from spade_cli.app import app
from spade_cli.errors import exit_code_for
from stages import backends, seed_library
from stages import validate as stage
from stages.backends.scripted import ScriptedBackend
from stages.executor import LocalExecutor, RayExecutor
from stages.shards import Stats

runner = CliRunner()
FIXTURES = Path(__file__).parent.parent / "fixtures" / "validate"
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # node address 127.0.0.1, not eth0's
                 "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
NO_RAY = "Ray is not installed: pip install 'spade-selfplay[ray]'"
HANGS = '''
class HangEnv:
    max_turns = 3

    def reset(self, seed=None):
        return f"seed {seed}: say anything", {}

    def step(self, action):
        while "hang" in action:
            pass
        return "heard " + action, 0.5, False, False, {}

    def solution(self):
        return ["\\\\boxed{x}"]
'''


@pytest.fixture(scope="session")
def ray_head():
    """A one-node Ray cluster on loopback for this session; yields its address."""
    with pytest.MonkeyPatch.context() as env:
        for key, value in LOOPBACK_ONLY.items():
            env.setenv(key, value)  # before ray is imported: it reads them then
        ray = pytest.importorskip("ray", reason=NO_RAY)
        from ray._private import ray_constants  # in case ray was imported before the env was set

        env.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        temp_dir = tempfile.mkdtemp(prefix="spade-ray-")  # short: Ray's socket paths are long
        ray.init(address="local", include_dashboard=False, num_cpus=2, _temp_dir=temp_dir,
                 _node_ip_address="127.0.0.1")
        try:
            assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


def closed_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spade(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **LOOPBACK_ONLY}
    return subprocess.run([sys.executable, "-m", "spade_cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.slow
def test_importing_spade_does_not_import_ray():
    code = ("import sys, spade_cli.app, spade_cli.validate, spade_cli.rollout, sandbox.pool, "
            "stages.validate, stages.executor; print('ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_ray_executor_without_ray_exits_69_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    result = runner.invoke(app, ["validate", "--executor", "ray", str(seed_library.files()[0])])
    assert result.exit_code == 69
    assert result.stderr.count("\n") == 1
    assert "pip install 'spade-selfplay[ray]'" in result.stderr


ROLLOUT = ["rollout", "--backend", "openai", "-m", "scripted", str(seed_library.ENV_SHARD)]


@pytest.mark.parametrize("command", [["validate", str(seed_library.files()[0])], ROLLOUT],
                         ids=["validate", "rollout"])
@pytest.mark.parametrize("args", [["--address", "head:6379"],
                                  ["--executor", "ray", "--address", "head"],
                                  ["--executor", "dask"]])
def test_executor_options_that_make_no_sense_are_usage_errors(command, args):
    result = runner.invoke(app, [*command, *args])
    assert result.exit_code == 2, result.stderr
    assert "--executor" in result.stderr or "--address" in result.stderr


@pytest.mark.slow
def test_an_unreachable_cluster_exits_69_in_one_line():
    if importlib.util.find_spec("ray") is None:
        pytest.skip(NO_RAY)
    address = f"127.0.0.1:{closed_loopback_port()}"
    done = spade("validate", "--executor", "ray", "--address", address,
                 str(seed_library.files()[0]))
    assert done.returncode == 69, done.stderr
    assert done.stderr.count("\n") == 1 and f"cannot reach the cluster at {address}" in done.stderr


@pytest.mark.slow
def test_ray_validate_writes_the_same_records_as_local(ray_head, tmp_path, nsjail_ok):
    files = [*seed_library.files("game")[:2], seed_library.files("tool_use")[0],
             FIXTURES / "broken" / "oracle.py", FIXTURES / "broken" / "determinism.py"]
    outputs = {}
    for executor in ("local", "ray"):
        out = tmp_path / executor
        extra = ["--address", ray_head] if executor == "ray" else []
        result = runner.invoke(app, ["validate", "--seed", "0", "--executor", executor, *extra,
                                     "-o", str(out), *map(str, files)])
        assert result.exit_code == 0, result.stderr
        outputs[executor] = {p.name: p.read_bytes() for p in out.iterdir()
                             if p.name != "_manifest.json"}  # the manifest holds timings
    assert outputs["ray"] == outputs["local"]
    lines = b"".join(outputs["local"].values()).splitlines()
    assert len(lines) == len(files) and b'"kind":"validation"' in b"".join(lines)


def scripted_agent(messages, tools) -> str:
    """An answer that depends on what the agent was shown, so plays differ by env and seed."""
    return f"\\boxed{{{sum(map(ord, messages[-1]['content'])) % 10}}}"


@pytest.mark.slow
def test_ray_rollout_writes_the_same_records_as_local(ray_head, tmp_path, monkeypatch,
                                                      nsjail_ok):
    monkeypatch.setattr(backends, "load_backend", lambda spec: ScriptedBackend(scripted_agent))
    outputs = {}
    for executor in ("local", "ray"):
        out = tmp_path / executor
        extra = ["--address", ray_head] if executor == "ray" else []
        result = runner.invoke(app, [*ROLLOUT, "-n", "2", "--max-turns", "3", "--executor",
                                     executor, *extra, "-o", str(out)])
        assert result.exit_code == 0, result.stderr
        records = [orjson.loads(line) for line in (out / "rollout-00000.jsonl").read_bytes()
                   .splitlines()]
        for record in records:
            for timing in ("seconds", "waits", "env_seconds"):  # clocks: what may differ
                del record["meta"][timing]
        outputs[executor] = records
    assert outputs["ray"] == outputs["local"]
    assert len(outputs["local"]) == 2 * len(seed_library.ENV_SHARD.read_text().splitlines())
    assert {r["outcome"] for r in outputs["local"]} == {"ok"}
    # real plays, answered by each env: not one failure repeated
    assert len({r["turns"][-1]["observation"] for r in outputs["local"]}) >= 10


def play(worker) -> list:
    """Every reply a short scripted play gets, a hang and what follows it included."""
    replies = [worker.start(), worker.call("load", source=HANGS), worker.call("reset", seed=7),
               worker.call("step", action="\\boxed{x}"),
               worker.call("step", action="\\boxed{hang}"),
               worker.call("step", action="\\boxed{x}")]
    worker.close()
    return replies + [worker.call("step", action="\\boxed{x}")]


@pytest.mark.slow
def test_a_remote_worker_answers_as_a_local_one(ray_head, nsjail_ok):
    sandbox = Sandbox(limits=Limits(call_timeout=2.0))
    local = play(LocalExecutor(1).worker(sandbox))
    with RayExecutor(2, ray_head) as cluster:
        remote = play(cluster.worker(sandbox))
    assert [r.outcome for r in local] == ["ok"] * 4 + ["timeout"] * 3
    assert remote == local


@pytest.mark.slow
def test_a_node_whose_jail_cannot_start_stops_the_stage_with_69(ray_head):
    sandbox = Sandbox(nsjail="/nonexistent/nsjail")  # as on a node without nsjail
    designs = stage.designs_from_files(seed_library.files()[:1])
    with RayExecutor(2, ray_head) as cluster:
        with pytest.raises(SandboxUnavailable, match="^node 127.0.0.1: ") as validating:
            list(stage.run(designs, stage.Config(sandbox=sandbox), Stats(), cluster))
        with pytest.raises(SandboxUnavailable, match="^node 127.0.0.1: ") as starting:
            cluster.worker(sandbox).start()
    assert exit_code_for(validating.value) == exit_code_for(starting.value) == 69
