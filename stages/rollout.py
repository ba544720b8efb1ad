"""rollout: the Reasoning Agent plays envs, with or without the designer's hint.

In: `env` records, a backend (the agent role), Config (plays per env, hint on/off, ...).
Out: one `rollout` record per play, in input order (env, then play index): every turn's model
completion (prompt ids, completion ids, sampling logprobs), the action the env received, the
observation and reward; the episode reward; the env outcome; the seed that replays it.
Guarantees:
- each play runs in its own jailed worker; `concurrency` plays are active at once and their
  model calls are batched turn by turn;
- episode reward = clip(last step reward, -1, 1) when the env terminated, else 0 (outcome only);
- turns stop at min(env max_turns, Config.max_turns <= 25); a completion that hits max tokens
  without ending its turn truncates the episode;
- the per-episode wall-clock budget (`episode_timeout`) bounds generation too: a play past it is
  truncated with outcome `episode_timeout` (the agent's time, not an env fault);
- every observation and tool result reaches the agent (and the record) cut to
  `max_observation_chars`, the cut marked; when the next prompt plus `max_tokens` would not fit
  the model's context, the play ends with outcome `context_limit` (the agent's failure, not an
  env fault: reward 0, `ok: true`);
- an env that crashes, hangs or blows its limits ends its play with that outcome recorded
  (`ok: false`); only a jail that cannot start stops the stage (SandboxUnavailable, exit 69);
- anything else that goes wrong with one play (a case spade does not handle yet) ends that play
  alone with outcome `internal_error` (stages/isolation.py), and the other plays go on;
- game actions are normalised to `\\boxed{<last boxed content>}` (the env's own parser then
  handles malformed ones); tool-use actions go to the env verbatim, which charges -0.1 for a
  format error and continues.
The sampling seed of each batched call derives from (seed, round, call index), so a rerun with
the same backend, model and concurrency reproduces the plays.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from sandbox.jail import Limits, Reply, Sandbox, SandboxUnavailable, Worker
from sandbox.pool import WorkerPool
from stages import prompts
from stages.backends import Backend, Sampling
from stages.isolation import INTERNAL, PASS_THROUGH, failure, isolated
from stages.records import Env, Failure, Rollout, Turn, derive_seed

MAX_TURNS_CAP = 25
# The paper's agent has a 32k-token context and 8k tokens per reply (the reference's
# --spade-max-context-length 32768, --rollout-max-response-len 8192), leaving 24k prompt tokens.
# One observation may take a third of them even at one character per token (random strings,
# digits, symbols; English runs about 4 characters per token): 8192 characters.
MAX_OBSERVATION_CHARS = 8192


@dataclass(frozen=True)
class Config:
    plays: int = 8
    hint: bool = False
    concurrency: int = 8
    max_turns: int = MAX_TURNS_CAP
    round: int = 0
    seed: int = 0
    episode_timeout: float = 600.0
    max_observation_chars: int = MAX_OBSERVATION_CHARS
    prompts_dir: str | None = None
    sandbox: Sandbox = field(default_factory=lambda: Sandbox(limits=Limits(call_timeout=10.0)))
    sampling: Sampling = Sampling(temperature=0.6, max_tokens=512)


def play_seed(env_id: str, hint: bool, play: int, round: int, seed: int) -> int:
    return derive_seed(env_id, int(hint), play, round, seed)


def envs_for_round(env_ids: Iterable[str], per_round: int, round: int, seed: int) -> set[str]:
    """The `per_round` envs of a static pool that `round` plays: each pass over the pool is a
    seeded shuffle cut into consecutive slices, one per round, so every env plays once before
    any plays twice; a pass's remainder smaller than a slice is skipped, as the reference's
    no-replacement sampler refills the pool (spade/core/fixed_env_orchestrator.py:222-236)."""
    order = sorted(set(env_ids))
    if per_round >= len(order):
        return set(order)
    passes, slot = divmod(round, len(order) // per_round)
    random.Random(derive_seed("pool", seed, passes)).shuffle(order)
    return set(order[slot * per_round:(slot + 1) * per_round])


def last_boxed(text: str) -> str | None:
    """The content of the last balanced \\boxed{...} in text, or None."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, index = 0, start + len("\\boxed{") - 1
        for index in range(index, len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                return text[start + len("\\boxed{"):index]
        start = text.rfind("\\boxed{", 0, start)
    return None


def cap(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the cut marked with how many were dropped."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [truncated {len(text) - limit} chars]"


def game_action(completion: str) -> str:
    content = last_boxed(completion)
    return completion if content is None else f"\\boxed{{{content}}}"


class Episode:
    """One play: its worker, the conversation so far, and the turns recorded."""

    def __init__(self, order: int, env: Env, play: int, cfg: Config, policy: str | None):
        self.order, self.env, self.play, self.cfg, self.policy = order, env, play, cfg, policy
        self.seed = play_seed(env.id, cfg.hint, play, cfg.round, cfg.seed)
        self.max_turns = min(env.max_turns, cfg.max_turns, MAX_TURNS_CAP)
        self.messages: list[dict] = []
        self.turns: list[Turn] = []
        self.worker: Worker | None = None
        self.started = time.monotonic()
        self.deadline = self.started + cfg.episode_timeout
        self.result: Rollout | None = None
        self.last_reward, self.terminated, self.truncated = 0.0, False, False

    # -- env side (runs in a thread of the env pool) ------------------------------------------
    def open(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.worker = pool.take()
        loaded = self.worker.call("load", source=self.env.source)
        if not loaded.ok:
            return self.fail(loaded)
        reset = self.worker.call("reset", seed=self.seed)
        if not reset.ok:
            return self.fail(reset)
        try:
            observation = cap(str(reset.result[0]), self.cfg.max_observation_chars)
        except (TypeError, IndexError, KeyError):
            return self.fail(_shape_error("reset", reset))
        if self.cfg.hint and self.env.hint:
            observation = f"{observation}\n\nHINT: {self.env.hint}"
        if self.env.domain == "tool_use":
            self.messages = [
                {"role": "system", "content": prompts.render("agent_tool_use", self.cfg.prompts_dir)},
                {"role": "user", "content": observation}]
        else:
            self.messages = [{"role": "user", "content": prompts.render(
                "agent_game", self.cfg.prompts_dir, observation=observation)}]

    def act(self, completion) -> None:
        if completion.finish_reason in ("context_limit", "timeout"):  # nothing for the env
            self.truncated = True
            return self.finish("context_limit" if completion.finish_reason == "context_limit"
                               else "episode_timeout")
        action = completion.text if self.env.domain == "tool_use" else game_action(completion.text)
        reply = self.worker.call("step", action=action)
        turn = Turn(action=action, completion=completion.text, prompt_ids=completion.prompt_ids,
                    completion_ids=completion.completion_ids, logprobs=completion.logprobs,
                    finish_reason=completion.finish_reason)
        if not reply.ok:
            self.turns.append(turn)
            return self.fail(reply)
        try:
            observation, reward, terminated, truncated, info = reply.result
        except (TypeError, ValueError):
            return self.fail(_shape_error("step", reply))
        observation = cap(str(observation), self.cfg.max_observation_chars)
        self.turns.append(turn.model_copy(update={"observation": observation,
                                                  "reward": _finite(reward)}))
        self.last_reward = _finite(reward)
        self.terminated = terminated is True
        over_time = time.monotonic() - self.started > self.cfg.episode_timeout
        self.truncated = not self.terminated and (
            truncated is True or len(self.turns) >= self.max_turns
            or completion.finish_reason == "length" or over_time)
        if self.terminated or self.truncated:
            return self.finish("episode_timeout" if over_time and not self.terminated else "ok")
        role = "tool" if "<tool_call>" in action and self.env.domain == "tool_use" else "user"
        self.messages += [{"role": "assistant", "content": completion.text},
                          {"role": role, "content": observation}]

    def fail(self, reply: Reply) -> None:
        if reply.outcome == "sandbox_failure":
            raise SandboxUnavailable((reply.error or {}).get("msg", "sandbox failure"))
        error = reply.error or {}
        self.finish(reply.outcome, Failure(type=f"env.{reply.outcome}",
                                           msg=str(error.get("msg", ""))[:500]))

    def finish(self, outcome: str, error: Failure | None = None) -> None:
        # a record that cannot be built or written keeps the play's outcome but not its turns
        self.result = isolated(self.label, lambda: self.record(outcome, error, self.turns),
                               lambda failure: self.record(INTERNAL, failure, []))
        self.close()

    def record(self, outcome: str, error: Failure | None, turns: list[Turn]) -> Rollout:
        reward = max(-1.0, min(1.0, self.last_reward)) if self.terminated and error is None else 0.0
        return Rollout(env_id=self.env.id, hint=self.cfg.hint, seed=self.seed,
                       round=self.cfg.round, turns=turns, reward=reward,
                       terminated=self.terminated, truncated=self.truncated,
                       outcome=outcome, ok=error is None, error=error,
                       parents=[self.env.id], policy=self.policy,
                       meta={"play": self.play, "hint_text": self.env.hint
                             if self.cfg.hint else None,
                             "temperature": self.cfg.sampling.temperature,
                             "seconds": round(time.monotonic() - self.started, 3)})

    @property
    def label(self) -> str:
        return f"rollout: env {self.env.id} play {self.play}"

    def close(self) -> None:
        if self.worker is not None:
            self.pool.retire(self.worker)
            self.worker = None


def _isolated(episode: Episode, work: Callable[[], None]) -> None:
    """Run one play's env side; an unexpected error ends that play alone (INTERNAL)."""
    try:
        work()
    except PASS_THROUGH:
        raise
    except Exception as exc:
        if episode.result is not None:  # the play had ended: not this play's data
            raise
        episode.finish(INTERNAL, failure(exc, episode.label))


def _shape_error(op: str, reply: Reply) -> Reply:
    return Reply("program_error", error={"type": "shape",
                                         "msg": f"{op} returned {reply.shape}, not the contract's tuple"})


def _finite(value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number == number and abs(number) != float("inf") else 0.0


def run(envs: Iterable[Env], backend: Backend, cfg: Config,
        pool: WorkerPool | None = None) -> Iterator[Rollout]:
    """Play every env `cfg.plays` times; yield rollouts in (env, play) order.

    Pass a `pool` started earlier (the CLI starts one while the model loads) to take jail
    start-up off the critical path; otherwise one is started here."""
    envs = list(envs)
    if pool is None:
        with WorkerPool(cfg.sandbox, cfg.concurrency, len(envs) * cfg.plays) as own:
            yield from run(envs, backend, cfg, own)
        return
    tasks = ((env, play) for env in envs for play in range(cfg.plays))
    pending: dict[int, Rollout] = {}
    next_out, order, calls = 0, 0, 0
    active: list[Episode] = []
    with ThreadPoolExecutor(max_workers=max(1, min(cfg.concurrency, 16))) as threads:
        try:
            exhausted = False
            while active or not exhausted:
                fresh = []
                while not exhausted and len(active) + len(fresh) < cfg.concurrency:
                    task = next(tasks, None)
                    if task is None:
                        exhausted = True
                        break
                    fresh.append(Episode(order, task[0], task[1], cfg, backend.policy))
                    order += 1
                active += fresh  # before opening, so `finally` closes them if an open raises
                list(threads.map(lambda e: _isolated(e, lambda: e.open(pool)), fresh))
                for episode in [e for e in active if e.result is not None]:
                    pending[episode.order] = episode.result
                active = [e for e in active if e.result is None]
                if active:
                    sampling = Sampling(**{**cfg.sampling.__dict__,
                                           "seed": play_seed("batch", cfg.hint, calls,
                                                             cfg.round, cfg.seed),
                                           "deadlines": tuple(e.deadline for e in active)})
                    calls += 1
                    completions = backend.chat([e.messages for e in active], sampling,
                                               [e.env.tools or None for e in active])
                    list(threads.map(lambda e, c: _isolated(e, lambda: e.act(c)), active,
                                     completions))
                    for episode in [e for e in active if e.result is not None]:
                        pending[episode.order] = episode.result
                    active = [e for e in active if e.result is None]
                while next_out in pending:
                    yield pending.pop(next_out)
                    next_out += 1
        finally:
            for episode in active:
                episode.close()
