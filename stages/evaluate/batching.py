"""Batched model calls and the shared answer prompt.

In: a backend, Config (batch_size, sampling, seed, suite, prompts_dir) and conversations.
Out: `Chat` returns one Completion per conversation, in order, calling `backend.chat` with at
most `batch_size` conversations at a time (all at once for a streaming backend: vllm, openai); `answer_prompt` wraps a question in a prompt
(`eval_answer` unless named); `final_answer` is what a reply answers: the content of its last
<answer>...</answer>, else of its last \\boxed{}, stripped (None if neither), the order the
reference code reads RG replies in (spade/core/envs/gem_adapter.py, SpadeReasoningGymEnv.step).
Guarantees: each conversation's sampling seed derives from (seed, suite, its index among the
suite's conversations), so a rerun with the same backend reproduces the run, and on engines that
seed each request (vllm, openai) whatever the batch size.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from stages import prompts
from stages.backends import Backend, Completion, streams
from stages.records import derive_seed

if TYPE_CHECKING:
    from stages.evaluate import Config


class Chat:
    """Model calls with reproducible per-conversation sampling seeds."""

    def __init__(self, backend: Backend, cfg: Config):
        self.backend, self.cfg, self.asked = backend, cfg, 0

    def __call__(self, conversations: list[list[dict]],
                 tools: list[list[dict] | None] | None = None) -> list[Completion]:
        # a streaming engine takes them all at once and batches continuously: chunks would
        # make each chunk wait for its longest reply
        size = len(conversations) if streams(self.backend) else max(1, self.cfg.batch_size)
        out: list[Completion] = []
        for start in range(0, len(conversations), size):
            chunk = conversations[start:start + size]
            seeds = tuple(derive_seed("eval", self.cfg.suite, self.cfg.seed, self.asked + index)
                          for index in range(start, start + len(chunk)))
            out += self.backend.chat(chunk, replace(self.cfg.sampling, seeds=seeds),
                                     tools[start:start + size] if tools else None)
        self.asked += len(conversations)
        return out


ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def answer_prompt(question: str, cfg: Config, prompt: str = "eval_answer") -> list[dict]:
    return [{"role": "user",
             "content": prompts.render(prompt, cfg.prompts_dir, question=question)}]


def final_answer(text: str) -> str | None:
    from stages.rollout import last_boxed

    tagged = ANSWER_TAG.findall(text)
    content = tagged[-1] if tagged else last_boxed(text)
    return None if content is None else content.strip()
