"""hint: the designer reads a validated env's source and writes a privileged hint.

In: `env` records and a backend (the designer role). Out: the same env records with `hint` set
(ids unchanged: an env is its program) and `meta.hint` holding the call's token ids and logprobs.
Guarantees: one batched call per input chunk, each env's sampling seed from (seed, env id); a hint is plain text of at most `max_chars`
characters with any code fence or leading "Hint:" label stripped, and valid text (a backend that
returns lone surrogates gets U+FFFD); an empty hint stays None, so score-regret treats that env
as having no hinted plays. An env whose hinted record cannot be built or written (a case spade
does not handle yet) keeps hint None, with `meta.hint.error` saying why (stages/isolation.py);
the other envs of its chunk are hinted as usual.
Every hint is then played without a model (stages/leaks.py), within `env_budget` seconds of
env time per env: a hint whose own words win most of the env's validation seeds gives the
answer away, and is written again (a new sampling seed) up to `attempts` times in all;
`meta.hint.leak` records the last verdict and the attempts it took, and an env whose hint still
leaks earns its designer nothing (stages/score_regret.py). An env that runs out the clock in the
check (`meta.hint.leak.stalled`) counts as leaking and is not hinted again: its check costs the
stage one budget, and the stage goes on.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from sandbox.budget import DEFAULT_ENV_BUDGET
from sandbox.jail import Sandbox
from stages import leaks, prompts
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
    attempts: int = 3  # hints written per env while they leak
    workers: int = 2  # leak checks at once (one jail each)
    env_budget: float = DEFAULT_ENV_BUDGET  # env seconds per leak check, as a rollout play has
    sandbox: Sandbox = field(default_factory=Sandbox)


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
    """Hint every env of the chunk, writing again those whose hint leaks (not those that
    stalled the check: another hint would meet the same env)."""
    hinted: dict[int, Env] = {}
    pending = list(range(len(envs)))
    with ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="leak") as threads:
        for attempt in range(cfg.attempts):
            written = _write(envs, pending, attempt, backend, cfg)
            for index, env in zip(pending, threads.map(lambda e: _checked(e, attempt, cfg),
                                                       written)):
                hinted[index] = env
            pending = [index for index in pending if leaks.leaking(hinted[index])
                       and not leaks.stalled(hinted[index])]
            if not pending:
                break
    yield from (hinted[index] for index in range(len(envs)))


def _write(envs: list[Env], chosen: list[int], attempt: int, backend: Backend,
           cfg: Config) -> list[Env]:
    """One batched call hinting the chosen envs; a retry samples from a seed of its own."""
    if not chosen:
        return []
    conversations = [[{"role": "user", "content": prompts.render(
        f"hint_{envs[i].domain}", cfg.prompts_dir, source=envs[i].source)}] for i in chosen]
    sampling = cfg.sampling.per_item(*(envs[i].id if attempt == 0 else f"{envs[i].id}:{attempt}"
                                       for i in chosen))
    return [isolated(f"hint: env {envs[i].id}", lambda: _hinted(envs[i], done, backend.policy, cfg),
                     lambda failure: _unhinted(envs[i], failure, backend.policy))
            for i, done in zip(chosen, backend.chat(conversations, sampling))]


def _checked(env: Env, attempt: int, cfg: Config) -> Env:
    """The env with its hint's leak verdict in `meta.hint.leak` (none without a hint)."""
    if env.hint is None:
        return env
    verdict = isolated(f"hint: leak check of env {env.id}",
                       lambda: leaks.check(env, cfg.sandbox, cfg.env_budget),
                       lambda failure: {"leaks": False, "error": failure.msg})
    hint_meta = {**env.meta["hint"], "leak": {**verdict, "attempts": attempt + 1}}
    return env.model_copy(update={"meta": {**env.meta, "hint": hint_meta}})


def _hinted(env: Env, done: Completion, policy: str, cfg: Config) -> Env:
    call = {"prompt_ids": done.prompt_ids, "completion_ids": done.completion_ids,
            "logprobs": done.logprobs, "policy": policy}
    return env.model_copy(update={"hint": clean(done.text, cfg.max_chars),
                                  "meta": {**env.meta, "hint": call}})


def _unhinted(env: Env, failure: Failure, policy: str) -> Env:
    return env.model_copy(update={"hint": None, "meta": {
        **env.meta, "hint": {"error": failure.model_dump(), "policy": policy}}})
