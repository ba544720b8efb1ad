"""audit: a model reads each validated env's source and judges whether it can be won.

In: `env` records, the `design` records they came from (for the slot a reject frees), a
backend (the policy itself or any other model). Out: each env the auditor accepts, unchanged
but for `meta.audit` (verdict and the call's text); for each env it rejects, a `validation`
record with check `audit`, the design's round, slot and attempt (so `spade design --retry`
redesigns it) and the auditor's reasoning, cut to one line in the message.
Guarantees: lenient as the reference's solvability audit (env_validator.py): only an explicit
\\boxed{no} rejects; an empty or unparseable answer accepts, with verdict "unclear". Programs
are read, never run. One batched call per chunk, each env's sampling seed from (seed, env id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from stages import prompts
from stages.backends import Backend, Completion, Sampling
from stages.records import Design, Env, Failure, Record, Validation

VERDICT_RE = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")
REASON_CHARS = 300


@dataclass(frozen=True)
class Config:
    prompts_dir: str | None = None
    chunk: int = 64
    sampling: Sampling = Sampling(temperature=0.3, max_tokens=4096)


def verdict(text: str) -> str:
    """yes, no or unclear: the last \\boxed{} of the answer decides."""
    found = VERDICT_RE.findall(text)
    if not found:
        return "unclear"
    answer = found[-1].lower()
    return "yes" if answer in ("yes", "y", "true") else "no" if answer in ("no", "n", "false") \
        else "unclear"


def run(records: Iterable[Record], backend: Backend, cfg: Config) -> Iterator[Record]:
    designs: dict[str, Design] = {}
    envs: list[Env] = []
    for record in records:
        if isinstance(record, Design):
            designs[record.id] = record
        elif isinstance(record, Env):
            envs.append(record)
    for first in range(0, len(envs), cfg.chunk):
        chunk = envs[first:first + cfg.chunk]
        conversations = [[{"role": "user", "content": prompts.render(
            f"audit_{env.domain}", cfg.prompts_dir, source=env.source)}] for env in chunk]
        sampling = cfg.sampling.per_item(*(env.id for env in chunk))
        for env, done in zip(chunk, backend.chat(conversations, sampling)):
            yield _judged(env, done, designs.get(env.parents[0] if env.parents else ""),
                          backend.policy)


def _judged(env: Env, done: Completion, design: Design | None, policy: str | None) -> Record:
    said = verdict(done.text)
    audit = {"verdict": said, "text": done.text, "policy": policy}
    if said != "no":
        return env.model_copy(update={"meta": {**env.meta, "audit": audit}})
    reason = " ".join(VERDICT_RE.sub("", done.text).split())[-REASON_CHARS:]
    where = {"round": design.round, "slot": design.slot, "attempt": design.attempt} \
        if design else {}
    return Validation(check="audit", domain=env.domain, skill=env.skill,
                      source_hash=env.source_hash, parents=list(env.parents), policy=policy,
                      error=Failure(type="audit", msg=f"the auditor judged it unwinnable: "
                                                      f"{reason or 'no reason given'}"),
                      meta={"audit": audit, "env_id": env.id}, **where)
