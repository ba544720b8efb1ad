"""The worker names what the jail refuses: the attempt is the env's last word, whatever the jail
made of it, and whatever the env did to the worker first; what an env may do to itself stays
allowed."""

import dis
import os

import pytest

from sandbox import worker as worker_module

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


# -- the record cannot be cleared or switched off ----------------------------------------------

def code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, type(code)):
            yield from code_objects(const)


@pytest.mark.parametrize("function", [worker_module.refusal_hook, worker_module.serve])
def test_the_hook_and_the_request_loop_read_no_global_an_env_could_rebind(function):
    for code in code_objects(function.__code__):
        if code is function.__code__ and function is worker_module.refusal_hook:
            continue  # the factory runs once, before any env code; what it builds runs after
        loads = [i.argval for i in dis.get_instructions(code)
                 if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
        assert not loads, f"{code.co_name} reads globals {loads}"


def test_the_hook_keeps_its_first_refusal_and_touches_no_env_object():
    hook = worker_module.refusal_hook(os.getpid())
    with pytest.raises(PermissionError) as answer:
        hook(worker_module.REFUSALS_QUERY, ())
    assert answer.value.args == ("",)

    class Sly(int):
        def __eq__(self, other):
            raise AssertionError("the hook ran env code")

        __hash__ = int.__hash__
        __repr__ = __eq__

    with pytest.raises(PermissionError, match="refused by spade: os.kill\\(pid=\\?, sig=9\\)"):
        hook("os.kill", (Sly(os.getpid()), 9))
    with pytest.raises(PermissionError, match="gc.get_objects: reaching objects the env was not"):
        hook("gc.get_objects", ())
    with pytest.raises(PermissionError) as answer:
        hook(worker_module.REFUSALS_QUERY, ())
    assert answer.value.args == ("os.kill(pid=?, sig=9): a signal to another process",)


TAMPERING = {
    "rebinds the hook's globals": "m = sys.modules['__main__']\n"
                                  "m.PROCESS_EVENTS = m.NAMESPACE_EVENTS = frozenset()",
    "replaces the code of the worker's functions": (
        "for v in list(vars(sys.modules['__main__']).values()):\n"
        "    if type(v) is type(_fork):\n"
        "        v.__code__ = (lambda *a, **k: None).__code__"),
    "patches the worker's request handler": (
        "sys.modules['__main__'].Session.handle = lambda self, request: self._handle(request)"),
    "empties every list its frames reach": (
        "f = sys._getframe()\nwhile f is not None:\n"
        "    [v.clear() for v in f.f_locals.values() if type(v) is list]\n"
        "    [getattr(v, 'refused', []).clear() for v in f.f_locals.values()]\n"
        "    f = f.f_back"),
}


@pytest.mark.parametrize("how", TAMPERING)
def test_an_env_that_tampers_with_the_worker_first_is_still_named(how, make_worker, jailkit):
    worker = make_worker(call_timeout=5, name_refusals=True)
    tamper = "\n".join("    " + line for line in TAMPERING[how].splitlines())
    prelude = (f"{PRELUDE}import sys\n\n\ndef _tamper():\n{tamper}\n\n\n"
               f"def _fork():\n    {ATTEMPTS['creating a process']}\n")
    step = """
        for action in (_tamper, _fork, _tamper):  # switch the naming off, try, wipe the record
            try:
                action()
            except Exception:
                pass
        return 'ok', 0.0, False, False, {}
    """
    source = jailkit.env_source(prelude=prelude, step=step)
    assert worker.call("load", source=source).ok and worker.call("reset", seed=0).ok
    for _ in range(2):
        reply = worker.call("step", action="go")
        assert not reply.ok and reply.error["type"] == "RefusedOperation", reply
        assert reply.error["msg"] == "os.fork: creating a process"


@pytest.mark.parametrize("statement, what", [
    ("__import__('gc').get_objects()", "gc.get_objects: reaching objects the env was not handed"),
    ("__import__('gc').get_referrers(self)", "gc.get_referrers: reaching objects"),
    ("sys.settrace(lambda *a: None)", "sys.settrace: reaching into the worker's own frames"),
    ("sys._current_frames()", "sys._current_frames: reaching into the worker's own frames"),
])
def test_the_ways_to_the_hook_or_the_loops_locals_are_refused_and_named(statement, what,
                                                                          make_worker, jailkit):
    worker = make_worker(call_timeout=5, name_refusals=True)
    source = jailkit.env_source(prelude=PRELUDE + "import sys\n", step=attempt(statement))
    assert worker.call("load", source=source).ok and worker.call("reset", seed=0).ok
    reply = worker.call("step", action="go")
    assert not reply.ok and reply.error["type"] == "RefusedOperation", reply
    assert reply.error["msg"].startswith(what)
