"""stages/adapters/openenv.py: a jailed env as an OpenEnv Environment, played by scripted
policies through the Environment API and over OpenEnv's own server (its /ws session protocol,
as OpenEnv's clients speak it), with a misbehaving env giving an outcome, not a crash."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv.core.env_server", reason="openenv-core is not installed "
                    "(pip install 'spade-selfplay[adapters]')")

from openenv.core.env_server import Environment  # noqa: E402

from sandbox.gym import EnvCrashed  # noqa: E402
from sandbox.jail import Limits, Sandbox  # noqa: E402
from stages.adapters.openenv import (SpadeAction, SpadeObservation, openenv_app,  # noqa: E402
                                     openenv_environment)
from tests.sandbox.test_gym import GUESS, hostile  # noqa: E402

SANDBOX = Sandbox(limits=Limits(call_timeout=2))


@pytest.mark.parametrize("class_name", ["WaterJugsEnv", "BankTransfersEnv"])
def test_seed_library_env_is_won_with_its_known_actions(class_name, seed_env, known_actions):
    record = seed_env(class_name)
    cls = openenv_environment(record, sandbox=SANDBOX)
    env = cls()
    try:
        assert isinstance(env, Environment) and cls.__name__ == class_name
        first = env.reset(seed=5)
        assert isinstance(first, SpadeObservation) and not first.done and first.reward == 0.0
        assert bool(first.tools) == (record.domain == "tool_use")
        rewards = []
        for action in known_actions(record.source, 5):
            observation = env.step(SpadeAction(message=action))
            rewards.append(observation.reward)
        assert observation.done and observation.outcome == "ok"
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0  # outcome only: nothing on the way
        state = env.state
        assert (state.done, state.reward, state.step_count, state.outcome) == (
            True, 1.0, len(rewards), "ok")
        over = env.step(SpadeAction(message=action))
        assert over.done and over.text == "The episode is over."
    finally:
        env.close()


def test_a_game_move_is_boxed_as_a_rollout_sends_it(nsjail_ok):
    env = openenv_environment(GUESS, sandbox=SANDBOX)()
    try:
        first = env.reset(seed=3)
        parity = 0 if "even" in first.text else 1
        for n in range(parity or 2, 21, 2):  # scripted: every number of the right parity
            observation = env.step(SpadeAction(message=str(n)))
            if observation.done:
                break
        assert observation.text.startswith("Correct!") and observation.reward == 1.0
        assert observation.metadata == {"env": "<source>", "turns": env.state.step_count,
                                        "outcome": "ok"}
    finally:
        env.close()


def test_misbehaving_envs_are_outcomes_and_the_next_reset_recovers(nsjail_ok):
    raising = openenv_environment(hostile("raise ValueError('bad')"), sandbox=SANDBOX)()
    hanging = openenv_environment(hostile("while True: pass"), sandbox=SANDBOX)()
    try:
        for env, outcome in ((raising, "program_error"), (hanging, "timeout")):
            assert env.reset(seed=0).text == "ok"
            observation = env.step(SpadeAction(message="x"))
            assert (observation.done, observation.reward, observation.outcome) == (
                True, 0.0, outcome)
            assert observation.text.startswith(f"The environment failed ({outcome})")
            assert env.state.outcome == outcome
            again = env.reset(seed=0)  # a fresh worker after the timeout killed the old one
            assert (again.text, again.outcome, again.done) == ("ok", "ok", False)
    finally:
        raising.close()
        hanging.close()


def test_a_source_that_does_not_load_raises_when_the_class_is_built(nsjail_ok):
    with pytest.raises(EnvCrashed):
        openenv_environment("class Broken(:\n", sandbox=SANDBOX)


def test_over_openenvs_server_a_session_plays_to_a_win(seed_env, known_actions):
    from fastapi.testclient import TestClient

    record = seed_env("WaterJugsEnv")
    app = openenv_app(record, sandbox=SANDBOX)
    with TestClient(app) as client:
        assert client.get("/health").json()["status"] == "healthy"
        assert "message" in client.get("/schema").json()["action"]["properties"]
        with client.websocket_connect("/ws") as ws:
            def send(kind: str, data: dict | None = None) -> dict:
                ws.send_text(json.dumps({"type": kind, **({"data": data} if data else {})}))
                return ws.receive_json()

            first = send("reset", {"seed": 5})["data"]
            assert first["done"] is False and first["observation"]["text"].startswith("Water")
            for action in known_actions(record.source, 5):
                reply = send("step", {"message": action})["data"]
            assert reply["done"] is True and reply["reward"] == 1.0
            assert reply["observation"]["outcome"] == "ok"
            assert send("state")["data"]["reward"] == 1.0


def test_over_openenvs_server_a_crashing_env_is_an_observation(nsjail_ok):
    from fastapi.testclient import TestClient

    with TestClient(openenv_app(hostile("raise ValueError('bad')"), sandbox=SANDBOX)) as client:
        with client.websocket_connect("/ws") as ws:
            ws.send_text(json.dumps({"type": "reset", "data": {"seed": 0}}))
            ws.receive_json()
            ws.send_text(json.dumps({"type": "step", "data": {"message": "x"}}))
            reply = ws.receive_json()
    assert reply["type"] == "observation"
    data = reply["data"]
    assert (data["done"], data["reward"], data["observation"]["outcome"]) == (
        True, 0.0, "program_error")


def test_openenvs_own_client_plays_a_served_env_to_a_win(seed_env, known_actions):
    """A real server on a local port and OpenEnv's GenericEnvClient, as a remote trainer uses it
    (OpenEnv's server may log a disconnect error when the client closes: that is its own)."""
    import socket
    import threading
    import time

    import uvicorn
    from openenv import GenericEnvClient

    record = seed_env("BankTransfersEnv")
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(openenv_app(record, sandbox=SANDBOX), host="127.0.0.1",
                                           port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as client:
            first = client.reset(seed=5)
            assert first.observation["tools"] and not first.done
            for action in known_actions(record.source, 5):
                result = client.step({"message": action})
        assert (result.done, result.reward, result.observation["outcome"]) == (True, 1.0, "ok")
    finally:
        server.should_exit = True
        thread.join(10)


SLOW_RESET = GUESS.replace("    def reset(self, seed=None):\n", "    def reset(self, seed=None):\n"
                           "        __import__('time').sleep(0.5)\n")


def test_concurrent_resets_never_hold_more_jails_than_max_concurrent_envs(monkeypatch,
                                                                          nsjail_ok):
    """OpenEnv serves each HTTP /reset with an instance of its own: six at once would start six
    jails of up to 512 MiB. One live jail is allowed here; the others are refused with 503."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from stages.adapters import common

    live, peak, lock = [0], [0], threading.Lock()

    class CountedJail(common.JailedEnv):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.counted = True
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])

        def close(self):
            if getattr(self, "counted", False):
                self.counted = False
                with lock:
                    live[0] -= 1
            super().close()

    monkeypatch.setattr(common, "JailedEnv", CountedJail)
    app = openenv_app(SLOW_RESET, sandbox=SANDBOX, max_concurrent_envs=1)
    with TestClient(app) as client, ThreadPoolExecutor(6) as threads:
        replies = list(threads.map(lambda seed: client.post("/reset", json={"seed": seed}),
                                   range(6)))
        codes = sorted(reply.status_code for reply in replies)
        assert peak[0] == 1 and live[0] == 0
        assert codes[0] == 200 and codes[-1] == 503, codes
        refused = next(reply for reply in replies if reply.status_code == 503)
        assert "all 1 jails are in use (max_concurrent_envs)" in refused.json()["detail"]
        assert refused.headers["Retry-After"] == "1"
        assert client.post("/reset", json={"seed": 7}).status_code == 200  # a slot freed
