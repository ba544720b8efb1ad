"""Batched model calls and the shared answer prompt.

In: a backend, Config (batch_size, sampling, seed, suite, prompts_dir) and conversations.
Out: `Chat` returns one Completion per conversation, in order, calling `backend.chat` with at
most `batch_size` conversations at a time; `answer_prompt` wraps a question in the
`eval_answer` prompt; `boxed_answer` is the last \\boxed{} of a reply, stripped (None if none).
Guarantees: the sampling seed of each call derives from (seed, suite, call index), so a rerun
with the same backend reproduces the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stages import prompts
from stages.backends import Backend, Completion, Sampling
from stages.records import derive_seed

if TYPE_CHECKING:
    from stages.evaluate import Config


class Chat:
    """Batched model calls with reproducible per-call sampling seeds."""

    def __init__(self, backend: Backend, cfg: Config):
        self.backend, self.cfg, self.calls = backend, cfg, 0

    def __call__(self, conversations: list[list[dict]],
                 tools: list[list[dict] | None] | None = None) -> list[Completion]:
        out: list[Completion] = []
        size = max(1, self.cfg.batch_size)
        for start in range(0, len(conversations), size):
            sampling = Sampling(**{**self.cfg.sampling.__dict__,
                                   "seed": derive_seed("eval", self.cfg.suite, self.cfg.seed,
                                                 self.calls)})
            self.calls += 1
            out += self.backend.chat(conversations[start:start + size], sampling,
                                     tools[start:start + size] if tools else None)
        return out


def answer_prompt(question: str, cfg: Config) -> list[dict]:
    return [{"role": "user",
             "content": prompts.render("eval_answer", cfg.prompts_dir, question=question)}]


def boxed_answer(text: str) -> str | None:
    from stages.rollout import last_boxed

    content = last_boxed(text)
    return None if content is None else content.strip()
