"""A backend driven by a Python callable: deterministic, instant, for tests and benchmarks.

In: `respond(messages, tools) -> str`. Out: Completions whose ids are the UTF-8 bytes of the
rendered prompt and of the reply, and whose logprobs are all 0.0 (a deterministic policy).
Guarantees: the same bookkeeping shape as a real backend, so rollout and training code paths
run unchanged without a model.
"""

from __future__ import annotations

import json
from typing import Callable

from stages.backends import Completion, Message, Sampling

Respond = Callable[[list[Message], list[dict] | None], str]


def render(messages: list[Message]) -> str:
    return "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in messages) + "<assistant>"


class ScriptedBackend:
    name = "scripted"

    def __init__(self, respond: Respond, policy: str = "scripted"):
        self.respond = respond
        self.policy = policy
        self.calls = 0

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        tools = tools or [None] * len(conversations)
        out = []
        for messages, tool_list in zip(conversations, tools):
            self.calls += 1
            text = self.respond(messages, tool_list)
            prompt = render(messages) + (json.dumps(tool_list) if tool_list else "")
            ids = list(text.encode())
            out.append(Completion(text, list(prompt.encode()), ids, [0.0] * len(ids)))
        return out
