"""rollout: the Reasoning Agent plays envs, with or without the designer's hint.

In: `env` records, a backend (the agent role), Config (plays per env, hint on/off, ...).
Out: one `rollout` record per play, in input order (env, then play index): every turn's model
completion (prompt ids, completion ids, sampling logprobs), the action the env received, the
observation and reward; the episode reward; the env outcome; the seed that replays it.
Guarantees:
- each play runs in its own jailed worker; `concurrency` plays are active at once. With a
  streaming backend (vllm, openai) each play advances as soon as its own completion returns and
  the engine batches continuously; otherwise (hf, or `barrier`) model calls are batched turn
  by turn, each turn waiting for its longest completion;
- episode reward = clip(last step reward, -1, 1) when the env terminated, else 0 (outcome only);
- turns stop at min(env max_turns, Config.max_turns <= 25); a completion that hits max tokens
  without ending its turn truncates the episode, as in the reference (outcome `ok`, reward 0
  unless that step terminated it), and the record says so: `meta.cut_at_max_tokens` is true
  (its last turn's finish_reason is "length"); the CLI counts these plays in its summary line;
- the per-episode wall-clock budget (`episode_timeout`) bounds generation too: a play past it is
  truncated with outcome `episode_timeout` (the agent's time, not an env fault);
- the env's own time is bounded per play: load, reset and every step together get `env_budget`
  seconds (each call at most `call_timeout`; sandbox/budget.py), past which the play ends with
  outcome `env_budget`; an env with `blacklist_after` plays that ran out the clock (`timeout`,
  `env_budget`), in this stage or in the earlier rounds' plays given as `blacklist`, is not
  played again: its remaining plays are recorded at once with outcome `blacklisted`, so one env
  that stalls on what the agent sends costs a stage about one budget, not every play's turns;
- and per env over the stage: once HEAVY_AFTER or more of an env's plays have begun and together
  used more than HEAVY_SHARE of their budgets (a mean over the plays begun, finished or not),
  the play whose call crossed that line, and every later call of the env's plays, ends with
  outcome `env_budget` saying so, and the env is blacklisted as above: an env that uses most of
  its budget on every play, never running out, costs a stage about HEAVY_SHARE of a budget per
  play it began, not every play's whole budget. Each record's `meta.env_seconds` is its play's
  env time;
- every observation and tool result reaches the agent (and the record) cut to
  `max_observation_chars`, the cut marked; when the next prompt plus `max_tokens` would not fit
  the model's context, the play ends with outcome `context_limit` (the agent's failure, not an
  env fault: reward 0, `ok: true`);
- an env that crashes, hangs or blows its limits ends its play with that outcome recorded
  (`ok: false`); only a jail that cannot start stops the stage (SandboxUnavailable, exit 69);
- anything else that goes wrong with one play (a case spade does not handle yet) ends that play
  alone with outcome `internal_error` (stages/isolation.py), and the other plays go on;
- with `hint`, an env without a hint (one `spade hint` could not write) is not played: it has no
  hinted plays, which score-regret scores as the reference does (hinted reward 0);
- game actions are normalised to `\\boxed{<last boxed content>}` (the env's own parser then
  handles malformed ones); tool-use actions go to the env verbatim, which charges -0.1 for a
  format error and continues.
The sampling seed of every model call derives from (play seed, turn): engines that seed each
request on its own (vllm, openai) give a play the same samples whatever the schedule,
concurrency or barrier; hf seeds a whole micro-batch, so its plays reproduce for the same
concurrency.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice
from typing import Callable, Iterable, Iterator

from sandbox.actions import BOXED, BRACES_RE, game_action, last_boxed  # noqa: F401 (re-exported)
from sandbox.budget import DEFAULT_ENV_BUDGET, ENV_BUDGET, STALLED, EnvBudget
from sandbox.jail import Limits, Reply, Sandbox, SandboxUnavailable, Worker
from sandbox.pool import WorkerPool
from stages import prompts
from stages.backends import Backend, Completion, Sampling, Streaming, streams
from stages.isolation import INTERNAL, PASS_THROUGH, failure, isolated
from stages.records import Env, Failure, Judgement, Rollout, Turn, derive_seed

MAX_TURNS_CAP = 25
# The paper's agent has a 32k-token context and 8k tokens per reply (the reference's
# --spade-max-context-length 32768, --rollout-max-response-len 8192), leaving 24k prompt tokens.
# One observation may take a third of them even at one character per token (random strings,
# digits, symbols; English runs about 4 characters per token): 8192 characters.
MAX_OBSERVATION_CHARS = 8192
BLACKLISTED = "blacklisted"
# An env whose plays in a stage use more than HEAVY_SHARE of their env budgets on average, over
# at least HEAVY_AFTER plays begun, is blacklisted as one that ran out the clock. The seed
# library's envs, 8 plays of 25 turns at once on a 2-core host at load 9, used at most 7% of a
# 10 s budget a play on average (18% on their slowest play): a quarter leaves them a margin of
# almost 4 on a host that busy, and a slow env's plays are cut at about a quarter budget each.
# HEAVY_SHARE * HEAVY_AFTER = 1: one play alone never trips it (its own budget bounds it).
HEAVY_SHARE = 0.25
HEAVY_AFTER = 4


@dataclass(frozen=True)
class Config:
    plays: int = 8
    hint: bool = False
    concurrency: int = 8
    barrier: bool = False  # batch model calls turn by turn even when the backend streams
    max_turns: int = MAX_TURNS_CAP
    round: int = 0
    seed: int = 0
    episode_timeout: float = 600.0
    env_budget: float = DEFAULT_ENV_BUDGET  # env seconds per play
    blacklist_after: int = 1  # plays that ran out the clock before an env is not played again
    max_observation_chars: int = MAX_OBSERVATION_CHARS
    prompts_dir: str | None = None
    sandbox: Sandbox = field(default_factory=lambda: Sandbox(limits=Limits(call_timeout=10.0)))
    sampling: Sampling = Sampling(temperature=0.6, max_tokens=512)


def hinted_only(envs: Iterable[Env], cfg: Config) -> list[Env]:
    """The envs a stage plays: with `cfg.hint`, those that have a hint."""
    return [env for env in envs if env.hint or not cfg.hint]


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


class Blacklist:
    """Envs not to play again: those with `after` or more plays that ran out the clock, and
    those whose winning plays were judged a shortcut (stages/judge.py), and those whose plays
    in this stage use most of their env budgets (`charge`).

    Fed every finished play (earlier rounds' from their shards, then this stage's own), the
    earlier rounds' judgements, and the env time of this stage's plays as they go."""

    def __init__(self, after: int = 1, plays: Iterable[Rollout | Judgement] = ()):
        self.after = after
        self.stalled: Counter[str] = Counter()
        self.blocked: set[str] = set()
        self.shortcuts: set[str] = set()
        self.shares: dict[str, dict[int, float]] = defaultdict(dict)  # env -> play -> share used
        self.heavy: dict[str, str] = {}  # env -> why its plays were cut
        self.lock = threading.Lock()  # plays charge from the env pool's threads
        for play in plays:
            self.note(play)

    def charge(self, env_id: str, play: int, share: float) -> str | None:
        """Play `play` of the env has used `share` of its env budget so far. Returns why the
        env is blocked when its plays begun (HEAVY_AFTER or more) have used more than
        HEAVY_SHARE of their budgets on average, else None."""
        with self.lock:
            shares = self.shares[env_id]
            shares[play] = share
            mean = sum(shares.values()) / len(shares)
            if env_id not in self.heavy and len(shares) >= HEAVY_AFTER and mean > HEAVY_SHARE:
                self.heavy[env_id] = (
                    f"the env's {len(shares)} plays in this stage used {mean:.0%} of their env "
                    f"budgets on average, more than the {HEAVY_SHARE:.0%} an env may use "
                    "over many plays")
                self.blocked.add(env_id)
            return self.heavy.get(env_id)

    def note(self, play: Rollout | Judgement) -> None:
        if isinstance(play, Judgement):
            if play.verdict == "shortcut":
                self.blocked.add(play.env_id)
                self.shortcuts.add(play.env_id)
        elif play.outcome == BLACKLISTED:
            self.blocked.add(play.env_id)
        elif play.outcome in STALLED:
            self.stalled[play.env_id] += 1
            if self.stalled[play.env_id] >= self.after:
                self.blocked.add(play.env_id)

    def __contains__(self, env_id: str) -> bool:
        return env_id in self.blocked

    def why(self, env_id: str) -> str:
        if env_id in self.shortcuts:
            return "its winning plays' actions won other seeds too (a shortcut, stages/judge.py)"
        if env_id in self.heavy:
            return self.heavy[env_id]
        return "earlier plays of this env ran out the clock (timeout or env_budget)"


def cap(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the cut marked with how many were dropped."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [truncated {len(text) - limit} chars]"


class Episode:
    """One play: its worker, the conversation so far, and the turns recorded."""

    def __init__(self, order: int, env: Env, play: int, cfg: Config, policy: str | None,
                 blacklist: Blacklist):
        self.order, self.env, self.play, self.cfg, self.policy = order, env, play, cfg, policy
        self.blacklist = blacklist
        self.budget = EnvBudget(cfg.env_budget)
        self.seed = play_seed(env.id, cfg.hint, play, cfg.round, cfg.seed)
        self.max_turns = min(env.max_turns, cfg.max_turns, MAX_TURNS_CAP)
        self.messages: list[dict] = []
        self.turns: list[Turn] = []
        self.worker: Worker | None = None
        self.started = time.monotonic()
        self.deadline = self.started + cfg.episode_timeout
        self.result: Rollout | None = None
        self.last_reward, self.terminated, self.truncated = 0.0, False, False
        self.cut_at_max_tokens = False  # the play ended on a completion at max_tokens
        # seconds from each env reply to the next action (the agent's pace): a replay of this
        # play (stages/judge.py) waits as long, so an env cannot tell the two apart by clock
        self.waits: list[float] = []
        self.replied_at = 0.0

    # -- env side (runs in a thread of the env pool) ------------------------------------------
    def open(self, pool: WorkerPool) -> None:
        if self.env.id in self.blacklist:
            return self.skip()
        self.pool = pool
        self.worker = pool.take()
        loaded = self.env_call("load", source=self.env.source)
        if not loaded.ok:
            return self.fail(loaded)
        reset = self.env_call("reset", seed=self.seed)
        if not reset.ok:
            return self.fail(reset)
        self.replied_at = time.monotonic()
        # an ok reply has its op's types already (sandbox/replies.py): (str, dict) here
        observation = cap(reset.result[0], self.cfg.max_observation_chars)
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
        if self.env.id in self.blacklist:  # another play of this env ran out the clock
            return self.skip()
        action = completion.text if self.env.domain == "tool_use" else game_action(completion.text)
        self.waits.append(round(time.monotonic() - self.replied_at, 3))
        reply = self.env_call("step", action=action)
        self.replied_at = time.monotonic()
        turn = Turn(action=action, completion=completion.text, prompt_ids=completion.prompt_ids,
                    completion_ids=completion.completion_ids, logprobs=completion.logprobs,
                    finish_reason=completion.finish_reason)
        if not reply.ok:
            self.turns.append(turn)
            return self.fail(reply)
        observation, reward, terminated, truncated, _ = reply.result  # types checked, reward finite
        observation = cap(observation, self.cfg.max_observation_chars)
        self.last_reward = float(reward)
        self.turns.append(turn.model_copy(update={"observation": observation,
                                                  "reward": self.last_reward}))
        self.terminated = terminated
        over_time = time.monotonic() - self.started > self.cfg.episode_timeout
        self.truncated = not self.terminated and (
            truncated or len(self.turns) >= self.max_turns
            or completion.finish_reason == "length" or over_time)
        self.cut_at_max_tokens = (self.truncated and completion.finish_reason == "length"
                                  and not truncated and len(self.turns) < self.max_turns)
        if self.terminated or self.truncated:
            return self.finish("episode_timeout" if over_time and not self.terminated else "ok")
        role = "tool" if "<tool_call>" in action and self.env.domain == "tool_use" else "user"
        self.messages += [{"role": "assistant", "content": completion.text},
                          {"role": role, "content": observation}]

    # -- model side ------------------------------------------------------------------------------
    def request(self) -> tuple[list[dict], list[dict] | None]:
        """The conversation and tools of this play's next model call."""
        return self.messages, self.env.tools or None

    def sampling(self) -> Sampling:
        """This turn's own settings: a seed from (play, turn), whatever the schedule."""
        return replace(self.cfg.sampling, seed=derive_seed(self.seed, "turn", len(self.turns)),
                       seeds=(), deadlines=(self.deadline,))

    def env_call(self, op: str, **fields) -> Reply:
        """One call to the env, within what is left of the play's env budget, ended as
        `env_budget` too once the env's plays together use too much of theirs (Blacklist)."""
        reply = self.budget.call(self.worker, op, **fields)
        if reply.outcome == ENV_BUDGET:
            return Reply(ENV_BUDGET, error={"type": ENV_BUDGET, "msg": (
                f"{reply.error['msg']} for one play (load, reset and {len(self.turns)} steps)")})
        heavy = self.blacklist.charge(self.env.id, self.order,
                                      self.budget.used / self.cfg.env_budget)
        if heavy and reply.ok:
            return Reply(ENV_BUDGET, error={"type": ENV_BUDGET, "msg": heavy})
        return reply

    def skip(self) -> None:
        self.finish(BLACKLISTED, Failure(type=f"env.{BLACKLISTED}",
                                         msg=f"not played: {self.blacklist.why(self.env.id)}"))

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
                             "cut_at_max_tokens": self.cut_at_max_tokens,
                             "waits": self.waits[:len(turns)],
                             "seconds": round(time.monotonic() - self.started, 3),
                             "env_seconds": round(self.budget.used, 3)})

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


def run(envs: Iterable[Env], backend: Backend, cfg: Config,
        pool: WorkerPool | None = None, blacklist: Blacklist | None = None) -> Iterator[Rollout]:
    """Play every env `cfg.plays` times; yield rollouts in (env, play) order.

    Pass a `pool` started earlier (the CLI starts one while the model loads) to take jail
    start-up off the critical path; otherwise one is started here. `blacklist` holds what
    earlier rounds' plays of these envs showed (default: nothing yet)."""
    envs = hinted_only(envs, cfg)
    if blacklist is None:
        blacklist = Blacklist(cfg.blacklist_after)
    if pool is None:
        with WorkerPool(cfg.sandbox, cfg.concurrency, len(envs) * cfg.plays) as own:
            yield from run(envs, backend, cfg, own, blacklist)
        return
    episodes = (Episode(order, env, play, cfg, backend.policy, blacklist) for order, (env, play)
                in enumerate((env, play) for env in envs for play in range(cfg.plays)))
    schedule = turn_batched if cfg.barrier or not streams(backend) else streamed
    finished: dict[int, Rollout] = {}
    next_out = 0
    with ThreadPoolExecutor(max_workers=max(1, min(cfg.concurrency, 16))) as threads:
        for episode in schedule(episodes, backend, cfg, pool, threads):
            finished[episode.order] = episode.result
            blacklist.note(episode.result)
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1


def streamed(episodes: Iterator[Episode], backend: Streaming, cfg: Config, pool: WorkerPool,
             threads: ThreadPoolExecutor) -> Iterator[Episode]:
    """No turn barrier: each play's next step starts as soon as its previous one is done (env
    steps on `threads`, model calls in flight on the engine); yields plays as they end."""
    running: dict[Future, Episode] = {}

    def env_side(episode: Episode, work: Callable[[], None]) -> None:
        running[threads.submit(_isolated, episode, work)] = episode

    def start_next() -> None:
        episode = next(episodes, None)
        if episode is not None:
            env_side(episode, partial(episode.open, pool))

    try:
        for _ in range(cfg.concurrency):
            start_next()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                outcome = future.result()  # raises what stops the stage (no jail, no engine)
                episode = running.pop(future)
                if isinstance(outcome, Completion):
                    env_side(episode, partial(episode.act, outcome))
                elif episode.result is not None:
                    yield episode
                    start_next()
                else:
                    messages, tools = episode.request()
                    running[backend.submit(messages, episode.sampling(), tools)] = episode
    finally:
        for episode in running.values():
            episode.close()


def turn_batched(episodes: Iterator[Episode], backend: Backend, cfg: Config, pool: WorkerPool,
                 threads: ThreadPoolExecutor) -> Iterator[Episode]:
    """Turn by turn: one batched model call for every active play's next turn, so each turn
    waits for its longest completion (for backends that take whole batches: hf)."""
    active: list[Episode] = []
    try:
        while True:
            fresh = list(islice(episodes, cfg.concurrency - len(active)))
            if not fresh and not active:
                return
            active += fresh  # before opening, so `finally` closes them if an open raises
            list(threads.map(lambda e: _isolated(e, partial(e.open, pool)), fresh))
            yield from (e for e in active if e.result is not None)
            active = [e for e in active if e.result is None]
            if not active:
                continue
            requests = [e.request() for e in active]
            own = [e.sampling() for e in active]
            sampling = replace(cfg.sampling, seeds=tuple(s.seed for s in own),
                               deadlines=tuple(s.deadline(0) for s in own))
            completions = backend.chat([m for m, _ in requests], sampling,
                                       [t for _, t in requests])
            list(threads.map(lambda e, c: _isolated(e, partial(e.act, c)), active, completions))
            yield from (e for e in active if e.result is not None)
            active = [e for e in active if e.result is None]
    finally:
        for episode in active:
            episode.close()
