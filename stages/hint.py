"""hint: the designer reads a validated env's source and writes a privileged hint.

In: `env` records and a backend (the designer role). Out: the same env records with `hint` set
(ids unchanged: an env is its program) and `meta.hint` holding the call's token ids and logprobs.
Guarantees: one batched call per input chunk, each env's sampling seed from (seed, env id); a hint is plain text of at most `max_chars`
characters with any code fence or leading "Hint:" label stripped, and valid text (a backend that
returns lone surrogates gets U+FFFD); an empty hint stays None, so score-regret treats that env
as having no hinted plays. An env whose hinted record cannot be built or written (a case spade
does not handle yet) keeps hint None, with `meta.hint.error` saying why (stages/isolation.py);
the other envs of its chunk are hinted as usual.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from stages import prompts
from stages.backends import Backend, Completion, Sampling
from stages.isolation import isolated, valid_text
from stages.records import Env, Failure

LABEL_RE = re.compile(r"^[\s*_#]*hint[\s*_]*:[\s*_]*", re.I)


@dataclass(frozen=True)
class Config:
    prompts_dir: str | None = None
    max_chars: int = 1000
    chunk: int = 64
    sampling: Sampling = Sampling(temperature=0.3, max_tokens=1024)


def clean(text: str, max_chars: int) -> str | None:
    text = valid_text(text)
    text = re.sub(r"```.*?(```|$)", "", text, flags=re.S).strip()
    text = LABEL_RE.sub("", text).strip()
    return text[:max_chars].strip() or None


def run(envs: Iterable[Env], backend: Backend, cfg: Config) -> Iterator[Env]:
    chunk: list[Env] = []
    for env in envs:
        chunk.append(env)
        if len(chunk) == cfg.chunk:
            yield from _hint_chunk(chunk, backend, cfg)
            chunk = []
    yield from _hint_chunk(chunk, backend, cfg)


def _hint_chunk(envs: list[Env], backend: Backend, cfg: Config) -> Iterator[Env]:
    if not envs:
        return
    conversations = [[{"role": "user", "content": prompts.render(
        f"hint_{env.domain}", cfg.prompts_dir, source=env.source)}] for env in envs]
    sampling = cfg.sampling.per_item(*(env.id for env in envs))
    for env, done in zip(envs, backend.chat(conversations, sampling)):
        yield isolated(f"hint: env {env.id}", lambda: _hinted(env, done, backend.policy, cfg),
                       lambda failure: _unhinted(env, failure, backend.policy))


def _hinted(env: Env, done: Completion, policy: str, cfg: Config) -> Env:
    call = {"prompt_ids": done.prompt_ids, "completion_ids": done.completion_ids,
            "logprobs": done.logprobs, "policy": policy}
    return env.model_copy(update={"hint": clean(done.text, cfg.max_chars),
                                  "meta": {**env.meta, "hint": call}})


def _unhinted(env: Env, failure: Failure, policy: str) -> Env:
    return env.model_copy(update={"hint": None, "meta": {
        **env.meta, "hint": {"error": failure.model_dump(), "policy": policy}}})
