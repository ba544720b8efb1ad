"""Reasoning-Gym suites `rg-hard` and `rg-quick`: the configs, the reference's protocol, `run_rg`.

In: RGTask list (`rg_tasks(suite, categories, limit)`), a backend, Config; needs the
`reasoning-gym` package (instances generated locally, nothing downloaded).
Out: one `eval` item per task config: `score` = win rate over its episodes (a win: the
dataset's own `score_answer` gives full credit), details with the episode seeds, per-episode
rewards (partial credit as the package gives it) and answers; a task none of whose instances
the installed package can draw gives a failed item (`rg.construct`).

`rg-hard` runs as the SPADE reference code does (github.com/spade-rl/spade @ 9b2b813, MIT):
- configs: the Reasoning-Gym paper's Appendix A.3 "hard" parameters of 100 tasks, in the four
  columns of the paper's table (Math 31, Algorithmic 36, Cognition 24, Logic 9): our data file
  `rg_hard.toml`, which cites its sources;
- instances: per task one `create_dataset(name, size=500, seed=42, **params)`; episode i seeds
  Python's and numpy's global generators with i and draws `random.choice(dataset)`
  (spade/core/envs/gem_adapter.py: SpadeReasoningGymEnv registered with seed 42, size 500, its
  reset under gem's Env.reset; spade/core/eval/gem_evaluator.py: `env.reset(seed=episode_idx)`);
- 8 episodes per config, temperature 0.6, 8192 max tokens, 2 turns
  (eval_offline/configs/_games_gem.yaml, "mirror the settings used for the paper runs"), top-p
  0.8 and top-k 20 (hard-coded in gem_evaluator.py). The second turn is never played: the RG
  env's `step` scores the first reply and ends the episode (terminated), so an episode is one
  reply, here too. The reference's in-loop eval (eval_configs/gem_eval_inloop.yaml) runs the
  same configs with 4 episodes: `--episodes 4`;
- the answer: the last <answer>...</answer> of the reply, else its last \\boxed{} (the prompt
  asks for answer tags, as the RG paper's does), scored by the dataset's `score_answer`; only a
  full-credit reward (>= 1) is a win (gem_evaluator.py).
`--seed S` draws episode i with seed S + i (S = 0: the reference's draws). `rg-quick` is 8 of
those tasks (2 per category) x 2 episodes, for CPU smoke runs.

Guarantees: instances are generated, and answers scored, in a helper process
(`stages.evaluate.helpers`) whose hash seed is fixed, so the instances do not depend on the
eval process's PYTHONHASHSEED (some generators iterate over sets of strings). An instance whose
generator raises or does not finish within RG_DRAW_TIMEOUT is skipped, the same for every
model, and listed in details.skipped_seeds (with reasoning-gym 0.1.25, number_sequence's draw
for seed 3 squares its terms without end; the reference would hang there). A timed-out or
raising scorer scores 0. In the helper, `eval` is shadowed by `ast.literal_eval` in the RG
modules that eval answers, and sympy-parsing scorers never see an answer whose parsing could
run code (`safe_for_scorer`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import logging
import os
import re
import tomllib
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from stages.backends import Backend, BackendUnavailable
from stages.evaluate.batching import Chat, answer_prompt, final_answer
from stages.evaluate.helpers import HASH_SEED, Helper, HelperError, HelperTimeout
from stages.evaluate.rollup import _count, _unit, failed_item, item
from stages.records import Eval

if TYPE_CHECKING:
    from stages.evaluate import Config

log = logging.getLogger("stages.evaluate")  # the name log lines carried before the split

RG_INSTALL = "pip install 'spade-selfplay[eval]' (or: pip install reasoning-gym)"
RG_CONFIGS = Path(__file__).with_name("rg_hard.toml")
RG_DATASET_SEED = 42  # gem_adapter.py: every rg:<name>-hard env is registered with seed=42
RG_DATASET_SIZE = 500  # gem_adapter.py: SpadeReasoningGymEnv's default size
RG_WIN = 1.0 - 1e-9  # gem_evaluator.py: "only full-credit terminal rewards count as wins"
RG_DRAW_TIMEOUT = 120.0  # seconds to build a dataset and draw one instance (most take < 1 s)


@dataclass(frozen=True)
class RGTask:
    dataset: str
    category: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.dataset}-hard"


def _load_configs() -> tuple[RGTask, ...]:
    with open(RG_CONFIGS, "rb") as fh:
        table = tomllib.load(fh)
    return tuple(RGTask(name, category, params)
                 for category, tasks in table.items() for name, params in tasks.items())


RG_HARD: tuple[RGTask, ...] = _load_configs()
RG_QUICK_IDS = ("chain_sum", "gcd", "spell_backward", "letter_counting", "number_sequence",
                "mini_sudoku", "syllogism", "aiw")

# Scorers that eval() the model's answer in their own module: `eval` there becomes literal-only.
RG_EVAL_MODULES = ("reasoning_gym.algorithmic.string_insertion",
                   "reasoning_gym.algorithmic.spiral_matrix",
                   "reasoning_gym.algorithmic.binary_matrix", "reasoning_gym.games.n_queens")
# Scorers that hand the answer to sympy's parse_expr, which evals it with sympy's namespace and
# the builtin functions in scope.
RG_SYMPY_DATASETS = frozenset({"simple_integration", "intermediate_integration",
                               "polynomial_multiplication", "puzzle24", "countdown"})
# What such an answer may contain: no quotes (strings), underscores (dunders) or brackets.
MATH_TEXT = re.compile(r"[0-9A-Za-z\s+\-*/^().,=]*")
ATTRIBUTE = re.compile(r"\.\s*[A-Za-z]")
ARITHMETIC_BUILTINS = frozenset({"abs", "min", "max", "pow", "round"})


def rg_tasks(suite: str, categories: Iterable[str] = (), limit: int | None = None
             ) -> list[RGTask]:
    tasks = list(RG_HARD)
    if suite == "rg-quick":
        tasks = [t for name in RG_QUICK_IDS for t in tasks if t.dataset == name]
    wanted = {c.lower() for c in categories}
    if wanted:
        tasks = [t for t in tasks if t.category.lower() in wanted]
    if limit is not None:
        seen: dict[str, int] = {}
        kept = []
        for task in tasks:
            seen[task.category] = seen.get(task.category, 0) + 1
            if seen[task.category] <= limit:
                kept.append(task)
        tasks = kept
    return tasks


def require_reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise BackendUnavailable(f"the rg suites need the reasoning-gym package: {RG_INSTALL}"
                                 ) from None
    return reasoning_gym


def rg_seeds(cfg: Config) -> list[int]:
    """The reset seed of each episode: seed + i (seed 0: the reference's draws)."""
    return [cfg.seed + i for i in range(cfg.n_episodes)]


def rg_dataset(task: RGTask) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(task.dataset, size=RG_DATASET_SIZE,
                                        seed=RG_DATASET_SEED, **task.params)


def rg_instance(dataset: Any, seed: int) -> dict:
    """One episode's entry, drawn as the reference's env reset draws it. Some generators depend
    on the hash seed of the process they run in: the suite draws in its helper."""
    import random

    import numpy

    random.seed(seed)
    numpy.random.seed(seed)
    return random.choice(dataset)


@functools.cache
def _parser_namespace() -> dict[str, Any]:
    """What sympy's parse_expr resolves names against: sympy's public names and every builtin
    function (sympy_parser.parse_expr builds its global_dict the same way)."""
    namespace: dict[str, Any] = {}
    exec("from sympy import *", namespace)  # noqa: S102 - a fixed import, not input
    namespace.update({name: obj for name, obj in vars(builtins).items()
                      if isinstance(obj, types.BuiltinFunctionType)})
    return namespace


def _mathematical(name: str) -> bool:
    import sympy
    from sympy.core.function import FunctionClass

    namespace = _parser_namespace()
    if name not in namespace:
        return True  # parse_expr turns an unknown name into a Symbol
    obj = namespace[name]
    if isinstance(obj, types.BuiltinFunctionType) and getattr(builtins, name, None) is obj:
        return name in ARITHMETIC_BUILTINS
    return (isinstance(obj, (sympy.Basic, FunctionClass))
            or isinstance(obj, type) and issubclass(obj, sympy.Basic)
            or getattr(obj, "__module__", "").startswith("sympy.functions."))


def safe_for_scorer(dataset: str, answer: str) -> bool:
    """False for an answer a sympy-parsing scorer must not see because parsing it could run
    code: quotes, underscores, attribute access, or a name sympy's parser resolves to something
    other than a mathematical object (builtins such as open or __import__ beyond abs, min, max,
    pow and round; sympy helpers such as lambdify, preview or plot). Math objects (Integral,
    sin, pi, ...) and unknown names (they become symbols) pass; an answer that merely takes long
    to score is left to the helper's timeout."""
    if dataset not in RG_SYMPY_DATASETS:
        return True
    if not MATH_TEXT.fullmatch(answer) or ATTRIBUTE.search(answer):
        return False
    return all(_mathematical(name) for name in set(re.findall(r"[A-Za-z]\w*", answer)))


def _literal_eval(source: Any, *_: Any) -> Any:
    return ast.literal_eval(source)


class _RGTasks:
    """Lives in the helper process: draws instances (kept for scoring), scores answers."""

    def __init__(self) -> None:
        import importlib

        if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
            raise RuntimeError("the RG helper runs without a fixed hash seed: its instances "
                               "would depend on the process")
        self.datasets: dict[str, Any] = {}
        self.entries: dict[tuple[str, int], dict] = {}
        for name in RG_EVAL_MODULES:
            importlib.import_module(name).eval = _literal_eval

    def draw(self, task: RGTask, seed: int) -> str:
        return self._entry(task, seed)["question"]

    def score(self, task: RGTask, seed: int, answer: str) -> float:
        entry = self._entry(task, seed)
        return float(self._dataset(task).score_answer(answer=answer, entry=entry))

    def _dataset(self, task: RGTask) -> Any:
        key = json.dumps([task.dataset, task.params], sort_keys=True)
        if key not in self.datasets:
            self.datasets[key] = rg_dataset(task)
        return self.datasets[key]

    def _entry(self, task: RGTask, seed: int) -> dict:
        key = (json.dumps([task.dataset, task.params], sort_keys=True), seed)
        if key not in self.entries:
            self.entries[key] = rg_instance(self._dataset(task), seed)
        return self.entries[key]


def run_rg(tasks: list[RGTask], backend: Backend, cfg: Config, stats: Any = None
           ) -> Iterator[Eval]:
    """Draw each episode's instance in the helper, ask the model once, score there."""
    require_reasoning_gym()
    with Helper("rg", _RGTasks, cfg.call_timeout, cfg.helper_memory_mb) as helper:
        drawn: list[tuple[RGTask, dict[int, str], list[int]]] = []
        for task in tasks:
            questions: dict[int, str] = {}
            skipped, why = [], ""
            for seed in rg_seeds(cfg):
                try:
                    questions[seed] = helper.request("draw", task, seed,
                                                     timeout=RG_DRAW_TIMEOUT)
                except (HelperError, HelperTimeout) as exc:  # a generator that fails or hangs
                    _count(stats, "draw_failed")
                    skipped, why = skipped + [seed], str(exc)
            if not questions:  # a config this package cannot build
                log.warning("rg: %s cannot be built: %s", task.id, why)
                yield failed_item(cfg, task.id, task.category, backend.policy, "rg.construct",
                                  why)
                continue
            drawn.append((task, questions, skipped))
        conversations = [answer_prompt(question, cfg, "eval_rg")
                         for _, questions, _ in drawn for question in questions.values()]
        completions = iter(Chat(backend, cfg)(conversations))
        for task, questions, skipped in drawn:
            replies = {seed: next(completions) for seed in questions}
            yield _scored(task, replies, skipped, helper, cfg, backend.policy, stats)


def _scored(task: RGTask, replies: dict[int, Any], skipped: list[int], helper: Helper,
            cfg: Config, policy: str | None, stats: Any) -> Eval:
    rewards, answers, timeouts = [], [], 0
    for seed, completion in replies.items():
        answer = final_answer(completion.text)
        answers.append(None if answer is None else answer[:200])
        reward = 0.0
        if answer is not None and not safe_for_scorer(task.dataset, answer):
            _count(stats, "unsafe_answer")
        elif answer is not None:
            try:
                # instant, unless a timeout restarted the helper and it must draw again
                helper.request("draw", task, seed, timeout=RG_DRAW_TIMEOUT)
                reward = _unit(helper.request("score", task, seed, answer))
            except HelperTimeout:
                timeouts += 1
                _count(stats, "score_timeout")
            except HelperError as exc:
                log.debug("rg: %s scorer raised: %s", task.id, exc)
                _count(stats, "score_error")
        rewards.append(reward)
    completions = list(replies.values())
    return item(cfg, task.id, task.category, [float(r >= RG_WIN) for r in rewards], policy, {
        "dataset": task.dataset, "params": task.params, "seeds": list(replies),
        "skipped_seeds": skipped, "rewards": rewards,
        "answered": sum(a is not None for a in answers), "timeouts": timeouts,
        "truncated": sum(c.finish_reason == "length" for c in completions),
        "answers": answers})
