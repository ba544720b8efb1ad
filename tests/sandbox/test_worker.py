"""The worker names what the jail refuses: the attempt is the env's last word, whatever the jail
made of it; what an env may do to itself stays allowed."""

import pytest

ATTEMPTS = {
    "a signal to another process": "os.kill(os.getppid(), signal.SIGTERM)",
    "a signal to a process group": "os.killpg(0, 0)",
    "creating a process": "os.fork() == 0 and os._exit(0)",
    "a socket other than AF_UNIX": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
    "calling C functions directly": "__import__('ctypes').CDLL(None).unshare(0x10000000)",
}
PRELUDE = "import os\nimport signal\nimport socket\n"


def attempt(statement: str) -> str:
    return f"""
        try:
            {statement}
        except Exception:
            pass  # the env hides the refusal and plays on
        return 'ok', 0.0, False, False, {{}}
    """


@pytest.mark.parametrize("what", ATTEMPTS)
def test_an_attempt_the_jail_refuses_is_named_then_and_for_every_later_request(
        what, make_worker, jailkit):
    worker = make_worker(call_timeout=5, name_refusals=True)
    source = jailkit.env_source(prelude=PRELUDE, step=attempt(ATTEMPTS[what]))
    assert worker.call("load", source=source).ok and worker.call("reset", seed=0).ok
    for _ in range(2):
        reply = worker.call("step", action="go")
        assert not reply.ok and reply.error["type"] == "RefusedOperation", reply
        assert what in reply.error["msg"]
    assert worker.call("reset", seed=1).error["type"] == "RefusedOperation"


@pytest.mark.parametrize("statement", [
    "os.kill(os.getpid(), 0)",  # a signal to itself
    "socket.socketpair()[0].close()",  # AF_UNIX, as asyncio's own loop makes
    "__import__('threading').Thread(target=len, args=([],)).start()",
])
def test_what_an_env_may_do_to_itself_is_not_a_refusal(statement, make_worker, jailkit):
    worker = make_worker(call_timeout=5, name_refusals=True)
    source = jailkit.env_source(prelude=PRELUDE, step=attempt(statement))
    assert worker.call("load", source=source).ok and worker.call("reset", seed=0).ok
    reply = worker.call("step", action="go")
    assert reply.ok, reply


def test_without_the_hook_the_jail_alone_refuses_and_the_env_plays_on(make_worker, jailkit):
    worker = make_worker(call_timeout=5)  # name_refusals off: the jail's own boundary
    source = jailkit.env_source(prelude=PRELUDE, step=attempt(ATTEMPTS["creating a process"]))
    assert worker.call("load", source=source).ok and worker.call("reset", seed=0).ok
    assert worker.call("step", action="go").ok
