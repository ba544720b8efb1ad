"""A backend driven by a Python callable: deterministic, for tests and benchmarks.

In: `respond(messages, tools) -> str`, and optionally `latency(sampling) -> seconds`, how long
an engine would take for a request (benchmarks draw it from the request's seed).
Out: Completions whose ids are the UTF-8 bytes of the rendered prompt and of the reply, and
whose logprobs are all 0.0 (a deterministic policy).
Guarantees: the same bookkeeping shape as a real backend, so rollout and training code paths
run unchanged without a model. It streams (`submit`): each request's Future resolves `latency`
after it was submitted, whatever else is in flight, like an engine batching continuously;
`chat` returns when its slowest request would, like one engine batch.
"""

from __future__ import annotations

import heapq
import itertools
import json
import threading
import time
from concurrent.futures import Future
from typing import Callable

from stages.backends import Completion, Message, Sampling

Respond = Callable[[list[Message], list[dict] | None], str]
Latency = Callable[[Sampling], float]


def render(messages: list[Message]) -> str:
    return "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in messages) + "<assistant>"


class ScriptedBackend:
    name = "scripted"

    def __init__(self, respond: Respond, policy: str = "scripted", latency: Latency | None = None):
        self.respond = respond
        self.policy = policy
        self.latency = latency
        self.calls = 0
        self.clock = _Clock()

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        tools = tools or [None] * len(conversations)
        futures = [self.submit(messages, sampling.one(index), tool_list)
                   for index, (messages, tool_list) in enumerate(zip(conversations, tools))]
        return [future.result() for future in futures]

    def close(self) -> None:
        """Nothing to free: the clock's daemon thread idles."""

    def submit(self, messages, sampling: Sampling, tools=None) -> Future:
        self.calls += 1
        text = self.respond(messages, tools)
        prompt = render(messages) + (json.dumps(tools) if tools else "")
        ids = list(text.encode())
        completion = Completion(text, list(prompt.encode()), ids, [0.0] * len(ids))
        delay = self.latency(sampling) if self.latency else 0.0
        return self.clock.resolve(completion, delay)


class _Clock:
    """Resolves futures at their due times from one daemon thread (not one thread each)."""

    def __init__(self):
        self.due: list[tuple[float, int, Future, Completion]] = []
        self.order = itertools.count()
        self.changed = threading.Condition()
        self.thread: threading.Thread | None = None

    def resolve(self, completion: Completion, delay: float) -> Future:
        future: Future = Future()
        if delay <= 0:
            future.set_result(completion)
            return future
        with self.changed:
            heapq.heappush(self.due, (time.monotonic() + delay, next(self.order), future,
                                      completion))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="scripted-clock")
                self.thread.start()
            self.changed.notify()
        return future

    def _run(self) -> None:
        while True:
            with self.changed:
                while not self.due or self.due[0][0] > time.monotonic():
                    self.changed.wait(self.due[0][0] - time.monotonic() if self.due else None)
                _, _, future, completion = heapq.heappop(self.due)
            future.set_result(completion)
