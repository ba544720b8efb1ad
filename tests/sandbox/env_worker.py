"""An in-process stand-in for a jailed worker that plays an env object the test defines, so the
contract's runtime checks and stages/trivial.py judge it in milliseconds, without nsjail. Its
replies are shaped as sandbox/worker.py shapes them (a tuple arrives as a list, with its
[kind, length]); only the tests' own trusted envs run this way, never generated code."""

from __future__ import annotations

from sandbox.jail import Reply


def reply(value) -> Reply:
    """What the worker replies for a value the env returned (sandbox/worker.py `shape`)."""
    for base in (tuple, list, dict, str):
        if isinstance(value, base):
            return Reply("ok", result=list(value) if base is tuple else value,
                         shape=[base.__name__, len(value)])
    return Reply("ok", result=value, shape=[type(value).__name__, None])


class EnvWorker:
    """Plays `env` (reset, step, solution, criteria and tools as the env class defines them);
    `calls` lists every (op, fields) it was sent. An env method that raises is a
    program_error reply naming the exception, as the worker's."""

    def __init__(self, env, domain: str = "game"):
        self.env, self.domain, self.calls = env, domain, []

    def __enter__(self) -> "EnvWorker":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def call(self, op: str, **fields) -> Reply:
        self.calls.append((op, fields))
        if op == "load":
            return reply({"class_name": type(self.env).__name__, "domain": self.domain,
                          "max_turns": getattr(self.env, "max_turns", None)})
        method = getattr(self.env, op)
        try:
            return reply(method(seed=fields["seed"]) if op == "reset" else method(*fields.values()))
        except Exception as exc:  # noqa: BLE001 - the worker reports any exception as data
            return Reply("program_error", error={"type": type(exc).__name__, "msg": str(exc)})

    def played(self, op: str) -> list:
        """The fields of every `op` call, in order (the seeds reset, the actions stepped)."""
        return [next(iter(fields.values()), None) for name, fields in self.calls if name == op]


class Jail:
    """Stands in for `sandbox.jail.Worker` in a module that starts its own workers: each
    `Worker(sandbox)` plays a fresh env from `make_env`, as each jail loads the source afresh;
    `workers` lists them in the order they were started, `sandboxes` what each was given."""

    def __init__(self, make_env, domain: str = "game"):
        self.make_env, self.domain, self.workers, self.sandboxes = make_env, domain, [], []

    def __call__(self, sandbox) -> EnvWorker:
        self.sandboxes.append(sandbox)
        self.workers.append(EnvWorker(self.make_env(), self.domain))
        return self.workers[-1]


class GuessEnv:
    """Guess the seed's digit (seed % 10) in a box: the right one wins (reward 1, terminated),
    any other is "no" (reward 0); the episode is truncated after max_turns steps. Tests break it
    by overriding one method."""

    max_turns = 3

    def reset(self, seed=None):
        self.answer, self.turns = seed % 10, 0
        return f"Guess my digit ({seed}).", {}

    def step(self, action):
        self.turns += 1
        if action == f"\\boxed{{{self.answer}}}":
            return "yes", 1.0, True, False, {}
        return "no", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return [f"\\boxed{{{self.answer}}}"]
