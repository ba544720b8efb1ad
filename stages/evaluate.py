"""eval: score a policy (any backend) on offline suites; one record per item plus roll-ups.

In: a backend, Config (suite, episodes, limit, ...), and for the `envs` suite env records.
Out: `eval` records: one per item (`task` set: an RG task config, a BFCL test id, an env id, a
question of a local file) with `score` in [0, 1] and `samples` = episodes played, then one
roll-up per category and one `overall` (`task` empty) whose `samples` is the number of items.
Every record carries a 95% confidence interval in ci_low/ci_high: Wilson when the values it
summarises are all 0 or 1, otherwise the normal approximation of the mean (clipped to [0, 1];
None for a single non-binary value). Roll-ups average item scores (each item weighs the same).
Items that could not be built (`ok: false`) are recorded and left out of the roll-ups.

Suites
- `rg-hard`: Reasoning-Gym (`reasoning-gym` package, generated locally). OUR RECONSTRUCTION, not
  the paper's list: SPADE evaluates 100 tasks with the RG paper's Appendix A.3 "hard" settings,
  which we do not have. We keep the same roster of 100 datasets and the same four buckets as
  SPADE's public eval config (Math 31, Algorithmic 36, Cognition 24, Logic 9), and chose our own
  parameters per dataset from its config class and curriculum, each clearly harder than the
  package default (RG_HARD below). Categories follow the package's module of each dataset:
  arithmetic, algebra, geometry, graphs -> Math; algorithmic, code -> Algorithmic; arc,
  cognition, games -> Cognition; logic, induction -> Logic. Datasets without a harder setting
  keep their defaults (gsm_symbolic only supports difficulty 1.0, list_functions has no knob,
  puzzle24 caps values at 10); acre uses its held-out split. One task = one config; each of its
  `episodes` (default 8) is a different generated instance (dataset seed derived from the task
  id and Config.seed). The agent gets the question in the `eval_answer` prompt; the last
  \\boxed{} of its reply (stripped) is scored by the dataset's own `score_answer` (partial
  credit where the package gives it). SPADE ran these through GEM with 2 turns; we ask once.
- `rg-quick`: 8 of those tasks (2 per category) x 2 episodes, for CPU smoke runs.
- `bfcl-mt`: BFCL v4 multi-turn (base, miss_func, miss_param, long_context) from the
  `bfcl-eval` wheel (install with `pip install --no-deps bfcl-eval`). Our agent loop drives the
  package's simulated API classes: per user turn the model may call tools (several
  <tool_call>{json}</tool_call> per reply); the calls run on the entry's instances through the
  package's own executor and their results come back as `tool` messages, until a reply has no
  valid call. Held-out functions (miss_func) join the tool list at their turn with the
  package's prompt. More than `max_steps` tool-calling replies in one turn (default 20,
  BFCL's limit) force-quit the entry, as does a tool request that times out. The package's
  `multi_turn_checker` then scores the entry in a fresh process (BFCL also scores apart from
  generation): state and execution results against the possible answers, 1 or 0. Our JSON
  calls are converted to the call strings that checker expects, exactly as BFCL's own
  `convert_to_function_call` writes them. A call naming a
  function the entry's classes do not have is answered with an error and never reaches the
  package (its executor would `eval` that name in its own module); argument names must be
  identifiers and values are JSON literals, so the strings it evaluates are plain literals.
  The simulated APIs are package code, not generated code: no jail is needed.
- `envs`: env records (e.g. held-out designed envs) played `episodes` times each without the
  hint through `stages.rollout.run` (jailed as always); an item's score is its success rate
  (reward > 0), categories are env skills.
- `file`: a local JSONL with `question` and `answer` (optional `id`, `category`): AIME, GPQA
  or other data the user provides; nothing is downloaded. The last boxed answer is compared
  with the gold one after normalisation (LaTeX wrappers, $, spaces, case, a trailing period, a
  parenthesised choice letter); numbers are compared as exact fractions. Exact match only:
  benchmarks graded by running code (LiveCodeBench) need their own runner.

Package code on model-chosen input runs in helper processes (multiprocessing forkserver): RG
scorers `eval()` or sympy-parse some answers, and simulated APIs take model-chosen arguments
(e.g. an mpmath precision), so a reply can make them hang or eat memory. Each request has a
wall-clock timeout and an address-space cap; a timed-out answer scores 0. This protects the run,
it is NOT a security boundary; on top of it we shadow `eval` with `ast.literal_eval` in the RG
modules that eval answers, and only let sympy see answers made of math names.
Model calls are batched: many conversations per `backend.chat`; the sampling seed of each call
derives from (seed, suite, call index), so a rerun with the same backend reproduces the run.
"""

from __future__ import annotations

import ast
import hashlib
import json
import keyword
import logging
import math
import os
import re
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Iterator

from stages import prompts
from stages.backends import Backend, BackendUnavailable, Completion, Sampling
from stages.records import Eval, Failure

log = logging.getLogger(__name__)

SUITES = ("rg-hard", "rg-quick", "bfcl-mt", "envs", "file")
OVERALL = "overall"
Z95 = 1.959963984540054
BFCL_CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
BFCL_MAX_STEPS = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
RG_INSTALL = "pip install 'spade-selfplay[eval]' (or: pip install reasoning-gym)"
BFCL_INSTALL = "pip install --no-deps bfcl-eval && pip install filelock mpmath"


@dataclass(frozen=True)
class Config:
    suite: str
    episodes: int | None = None  # None: the suite's default (rg-hard 8, rg-quick 2, envs 8, else 1)
    limit: int | None = None  # at most this many items per category
    categories: tuple[str, ...] = ()  # keep only these categories (empty: all)
    round: int | None = 0
    seed: int = 0
    batch_size: int = 32  # conversations per backend.chat call
    prompts_dir: str | None = None
    sampling: Sampling = Sampling(temperature=0.0, max_tokens=1024)
    data: str | None = None  # file suite: the JSONL path
    name: str | None = None  # file suite: the suite name in records (default: the file's stem)
    max_steps: int = BFCL_MAX_STEPS  # bfcl-mt: model replies with tool calls per user turn
    call_timeout: float = 30.0  # seconds one scoring or tool request may take
    helper_memory_mb: int = 8192  # address-space cap of a helper process
    rollout: Any = None  # envs: a stages.rollout.Config template (sandbox, turn caps)

    @property
    def n_episodes(self) -> int:
        if self.episodes is not None:
            return self.episodes
        return {"rg-hard": 8, "rg-quick": 2, "envs": 8}.get(self.suite, 1)

    @property
    def suite_name(self) -> str:
        if self.suite == "file":
            return self.name or os.path.basename(self.data or "file").split(".")[0]
        return self.suite


# -- confidence intervals and roll-ups -------------------------------------------------------
def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for `successes` out of `n` Bernoulli trials."""
    if n <= 0:
        raise ValueError("wilson needs n >= 1")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def normal_interval(values: list[float], z: float = Z95) -> tuple[float | None, float | None]:
    """mean +- z * s / sqrt(n) (s: sample standard deviation), clipped to [0, 1]."""
    if len(values) < 2:
        return None, None
    mean = statistics.fmean(values)
    half = z * statistics.stdev(values) / math.sqrt(len(values))
    return max(0.0, mean - half), min(1.0, mean + half)


def interval(values: list[float]) -> tuple[float | None, float | None]:
    """Wilson for 0/1 values, the normal approximation of the mean otherwise."""
    if not values:
        return None, None
    if all(v in (0.0, 1.0) for v in values):
        return wilson(sum(values), len(values))
    return normal_interval(values)


def _unit(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, number)) if math.isfinite(number) else 0.0


def item(cfg: Config, task: str, category: str, scores: list[float], policy: str | None,
         details: dict[str, Any], parents: list[str] | None = None) -> Eval:
    scores = [_unit(s) for s in scores]
    low, high = interval(scores)
    return Eval(suite=cfg.suite_name, task=task, category=category, round=cfg.round,
                score=statistics.fmean(scores) if scores else 0.0, samples=len(scores),
                ci_low=low, ci_high=high, details=details, policy=policy,
                parents=parents or [])


def failed_item(cfg: Config, task: str, category: str, policy: str | None, kind: str,
                msg: str) -> Eval:
    return Eval(suite=cfg.suite_name, task=task, category=category, round=cfg.round, score=0.0,
                samples=0, ok=False, error=Failure(type=kind, msg=msg[:500]), policy=policy)


def rollups(items: list[Eval], suite: str, round: int | None, policy: str | None) -> list[Eval]:
    """One record per category (first-seen order) and one `overall`, over the ok items."""
    good = [r for r in items if r.ok and r.task]
    groups: dict[str, list[Eval]] = {}
    for record in good:
        if record.category:
            groups.setdefault(record.category, []).append(record)
    out = [_rollup(suite, name, members, round, policy) for name, members in groups.items()]
    if good:
        overall = _rollup(suite, OVERALL, good, round, policy)
        if len(groups) > 1:
            macro = statistics.fmean(r.score for r in out)
            overall = overall.model_copy(update={"details": {**overall.details, "macro": macro}})
        out.append(overall)
    return out


def _rollup(suite: str, category: str, members: list[Eval], round: int | None,
            policy: str | None) -> Eval:
    scores = [r.score for r in members]
    low, high = interval(scores)
    return Eval(suite=suite, task="", category=category, round=round,
                score=statistics.fmean(scores), samples=len(members), ci_low=low, ci_high=high,
                details={"episodes": sum(r.samples for r in members)},
                parents=[r.id for r in members], policy=policy)


# -- batching ---------------------------------------------------------------------------------
def _seed(*parts: Any) -> int:
    key = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


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
                                   "seed": _seed("eval", self.cfg.suite, self.cfg.seed,
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


# -- helper processes -------------------------------------------------------------------------
class HelperTimeout(RuntimeError):
    """A helper request ran past its timeout (the helper was killed)."""


class HelperError(RuntimeError):
    """The request raised inside the helper, or the helper died."""


_PRELOAD = {
    "rg": ["reasoning_gym"],
    "bfcl": ["bfcl_eval.utils", "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
             *(f"bfcl_eval.eval_checker.multi_turn_eval.func_source_code.{m}" for m in (
                 "gorilla_file_system", "math_api", "message_api", "posting_api", "ticket_api",
                 "trading_bot", "travel_booking", "vehicle_control"))],
}


def _context(kind: str):
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    # Only the first call in a process counts (the fork server then exists); later kinds
    # import their modules in each child instead, which is merely slower.
    ctx.set_forkserver_preload(["stages.evaluate", *_PRELOAD.get(kind, [])])
    return ctx


class Helper:
    """One helper process running package code on model-chosen input; requests time out."""

    def __init__(self, kind: str, timeout: float, memory_mb: int = 8192):
        self.kind, self.timeout, self.memory_mb = kind, timeout, memory_mb
        self.proc = None
        self.conn = None

    def request(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        if self.proc is None:
            ctx = _context(self.kind)
            self.conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=_helper_main, args=(child, self.kind, self.memory_mb),
                                    daemon=True)
            self.proc.start()
            child.close()
        try:
            self.conn.send((op, args))
            if not self.conn.poll(timeout or self.timeout):
                self.close()
                raise HelperTimeout(f"{op} took longer than {timeout or self.timeout:g}s")
            status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.close()
            raise HelperError(f"helper process died during {op}: {exc or type(exc).__name__}")
        if status != "ok":
            raise HelperError(value)
        return value

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
            self.conn.close()
            self.proc = self.conn = None

    def __enter__(self) -> "Helper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _helper_main(conn, kind: str, memory_mb: int) -> None:
    import resource

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # package code prints; stdout carries records only
    sys.stdout = open(os.devnull, "w")
    limit = memory_mb << 20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    handler = _RGScorer() if kind == "rg" else _BfclEntry()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        op, args = message
        try:
            reply = ("ok", getattr(handler, op)(*args))
        except BaseException as exc:  # MemoryError, RecursionError, anything the package raises
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:400]}")
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable reply
            conn.send(("error", f"reply not sendable: {type(exc).__name__}"))


# -- Reasoning-Gym ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RGTask:
    dataset: str
    category: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.dataset}-hard"


MODULE_CATEGORY = {"arithmetic": "Math", "algebra": "Math", "geometry": "Math", "graphs": "Math",
                   "probability": "Math", "algorithmic": "Algorithmic", "code": "Algorithmic",
                   "arc": "Cognition", "cognition": "Cognition", "games": "Cognition",
                   "logic": "Logic", "induction": "Logic"}

# Our "hard" settings (package defaults in the comments where it helps to see the step up).
_RG_TABLE: dict[str, dict[str, dict[str, Any]]] = {
    "Math": {
        "complex_arithmetic": dict(min_real=-100, max_real=100, min_imag=-100, max_imag=100,
                                   operations_weights=[0.25, 0.25, 0.25, 0.25]),  # +-10; * / rare
        "intermediate_integration": dict(
            problem_type_weights=[0.05, 0.1, 0.15, 0.1, 0.2, 0.1, 0.15, 0.15],
            linear_upper_bound=20, max_linear_degree=5, outer_constant_max=6, max_poly_degree=4),
        "polynomial_equations": dict(min_terms=3, max_terms=5, min_degree=2, max_degree=4,
                                     max_value=200),  # degree 1-3
        "polynomial_multiplication": dict(min_terms=3, max_terms=6, min_value=10, max_value=1000,
                                          min_degree=1, max_degree=4, min_polynomials=3,
                                          max_polynomials=4),
        "simple_equations": dict(min_terms=3, max_terms=8, min_value=10, max_value=10000,
                                 operators_weights=[0.3, 0.3, 0.4]),
        "simple_integration": dict(min_terms=4, max_terms=6, min_degree=3, max_degree=12),
        "basic_arithmetic": dict(min_terms=5, max_terms=8, min_digits=3, max_digits=5),  # 2-6, 1-4
        "bitwise_arithmetic": dict(difficulty=6),  # 2
        "calendar_arithmetic": dict(offset_upper_bound=500, leap_year_range=400),  # 100, 200
        "chain_sum": dict(min_terms=6, max_terms=10, min_digits=4, max_digits=7,
                          allow_negation=True),
        "count_bits": dict(min_n=1_000_000, max_n=2**31 - 1),  # from 1
        "decimal_arithmetic": dict(min_num_decimal_places=4, max_num_decimal_places=6,
                                   min_terms=4, max_terms=8, precision=14),
        "decimal_chain_sum": dict(min_terms=5, max_terms=8, min_digits=3, max_digits=6,
                                  min_decimal_places=3, max_decimal_places=6,
                                  allow_negation=True),
        "dice": dict(num_dice=6, max_dice_size=30),  # 4 dice up to d20
        "fraction_simplification": dict(min_value=100, max_value=10000, min_factor=10,
                                         max_factor=1000),
        "gcd": dict(min_numbers=3, max_numbers=4, min_value=1000, max_value=100000),  # 2 <= 1000
        "gsm_symbolic": dict(),  # the package supports difficulty 1.0 only
        "lcm": dict(min_numbers=3, max_numbers=4, min_value=10, max_value=1000),  # 2 <= 100
        "leg_counting": dict(min_animals=8, max_animals=15, min_instances=8, max_instances=64),
        "number_format": dict(min_num_candidates=10, max_num_candidates=25, min_n=100_000,
                              max_delta=0.001),  # 2-5 candidates, delta 10
        "power_function": dict(min_exponent=4, max_exponent=10),  # 0-8
        "prime_factorization": dict(min_value=1000, max_value=10000),  # 2-1000
        "products": dict(min_terms=3, max_terms=4, min_digits=3, max_digits=5,
                         allow_negation=True),
        "time_intervals": dict(max_date_difference_days=1825),  # 100
        "advanced_geometry": dict(min_coord=-100, max_coord=100),  # +-10
        "simple_geometry": dict(min_sides=6, max_sides=12),  # 3-6
        "course_schedule": dict(min_num_courses=15, max_num_courses=25, min_num_prerequisites=2,
                                max_num_prerequisites=4, min_cycle_length=4,
                                max_cycle_length=6),  # 5-10 courses
        "family_relationships": dict(min_family_size=8, max_family_size=11),  # 4-8
        "largest_island": dict(min_rows=10, max_rows=20, min_cols=10, max_cols=20,
                               min_num_islands=3, max_num_islands=10, min_island_size=3,
                               max_island_size=20),
        "quantum_lock": dict(difficulty=15),  # 10
        "shortest_path": dict(min_rows=10, max_rows=20, min_cols=10, max_cols=20),  # 5-8
    },
    "Algorithmic": {
        "ab": dict(length=25),  # 10
        "base_conversion": dict(min_base=2, max_base=36, min_value=10_000, max_value=1_000_000),
        "binary_alternation": dict(min_n=50, max_n=200),  # 10-30
        "binary_matrix": dict(min_n=8, max_n=15, p_zero=0.1),
        "caesar_cipher": dict(min_words=15, max_words=30),  # 3-20
        "count_primes": dict(min_n=10_000, max_n=50_000),
        "cryptarithm": dict(min_words=3, max_words=5),  # 2-3
        "game_of_life": dict(grid_size_x=20, grid_size_y=20, filled_cells=60,
                             simulation_steps=2),  # 10x10, 10 cells, 1 step
        "game_of_life_halting": dict(grid_size_x=20, grid_size_y=20, difficulty=2,
                                     num_oscillators=7, max_simulation_steps=50),
        "graph_color": dict(num_colors=3, min_num_vertices=20, max_num_vertices=25,
                            edge_probability=0.15),  # 10 vertices, p 0.1
        "group_anagrams": dict(min_anagram_groups=10, max_anagram_groups=25,
                               min_words_per_group=3, max_words_per_group=6),
        "isomorphic_strings": dict(min_string_length=20, max_string_length=50),  # 2-10
        "jugs": dict(num_jugs=4, difficulty=15),  # 3, 10
        "letter_counting": dict(min_words=15, max_words=25),  # 5-15
        "letter_jumble": dict(min_words=20, max_words=40, min_corruption_level=0.3,
                              max_corruption_level=0.9),
        "manipulate_matrix": dict(min_rows=8, max_rows=15, min_cols=8, max_cols=15,
                                  min_transforms=5, max_transforms=10),
        "number_filtering": dict(min_numbers=20, max_numbers=50, min_decimals=2, max_decimals=4,
                                 min_value=-1000.0, max_value=1000.0),
        "number_sorting": dict(min_numbers=20, max_numbers=50, min_decimals=1, max_decimals=4,
                               min_value=-1000.0, max_value=1000.0),  # 3-10 numbers
        "palindrome_generation": dict(min_length=20, max_length=50),  # 3-10
        "palindrome_partitioning": dict(min_string_len=10, max_string_len=15,
                                        min_substring_palindrome_len=2,
                                        max_substring_palindrome_len=7),
        "pool_matrix": dict(min_rows=8, max_rows=15, min_cols=8, max_cols=15, min_pool_size=2,
                            max_pool_size=4),
        "ransom_note": dict(min_note_length=20, max_note_length=50, min_magazine_length=50,
                            max_magazine_length=100),
        "rotate_matrix": dict(min_n=6, max_n=12, min_rotations=3, max_rotations=15),
        "rotten_oranges": dict(min_n=20, max_n=30),  # 10-30
        "sentence_reordering": dict(min_words_in_sentence=15, max_words_in_sentence=30),
        "spell_backward": dict(min_word_len=8, max_word_len=10),  # 3-10
        "spiral_matrix": dict(min_n=8, max_n=15),  # 2-10
        "string_insertion": dict(min_string_length=30, max_string_length=60),  # 5-20
        "string_manipulation": dict(min_string_length=20, max_string_length=50,
                                    min_num_rules=8, max_num_rules=15),  # 3-8 rules
        "string_splitting": dict(min_initial_machines=10, max_initial_machines=30),  # 0-5
        "string_synthesis": dict(min_initial_blocks=10, max_initial_blocks=30),  # 0-5
        "word_ladder": dict(min_word_length=5, max_word_length=5),  # 4
        "word_sequence_reversal": dict(min_words=20, max_words=40),  # 3-8
        "word_sorting": dict(min_words=20, max_words=40, min_word_length=5, max_word_length=12),
        "bf": dict(difficulty=2),  # 1
        "codeio": dict(difficulty=8),  # any
    },
    "Cognition": {
        "arc_1d": dict(min_size=25, max_size=50),  # 10-30
        "arc_agi": dict(use_train=False, use_eval=True),  # the ARC evaluation set only
        "rearc": dict(diff_lb=0.1, diff_ub=0.2,
                      rng_difficulty_weights=[0, 0, 0, 0.2, 0.2, 0.3, 0.3],
                      pso_difficulty_weights=[0, 0, 0, 0.2, 0.2, 0.3, 0.3]),
        "color_cube_rotation": dict(min_rotations=5, max_rotations=10),  # 1-3
        "figlet_font": dict(min_word_len=5, max_word_len=10),  # 3-7
        "modulo_grid": dict(size_x=40, size_y=40, max_divisor=15, max_target=7, max_holes=5),
        "needle_haystack": dict(min_num_statements=100, max_num_statements=500),  # 10-100
        "number_sequence": dict(min_terms=8, max_terms=12, min_value=-1000, max_value=1000,
                                max_complexity=4),
        "rectangle_count": dict(max_rectangles=15),  # 10
        "rubiks_cube": dict(min_scramble_steps=10, max_scramble_steps=25),  # 3-10
        "countdown": dict(min_numbers=5, max_numbers=7, min_target=500, max_target=1000),
        "emoji_mystery": dict(min_words_in_sentence=20, max_words_in_sentence=40),
        "futoshiki": dict(min_board_size=6, max_board_size=7, min_difficulty=2,
                          max_difficulty=3),
        "knight_swap": dict(min_nodes=8, max_nodes=10, min_pieces=2, max_pieces=3, min_steps=10,
                            max_steps=30),
        "mahjong_puzzle": dict(min_num_rounds=50, max_num_rounds=100),  # 10-50
        "maze": dict(min_dist=10, max_dist=20, min_grid_size=15, max_grid_size=25),
        "mini_sudoku": dict(min_empty=10, max_empty=12),  # 8-12
        "n_queens": dict(n=8, min_remove=5, max_remove=8),  # remove 1-7
        "puzzle24": dict(),  # values are capped at 10: defaults
        "rush_hour": dict(min_moves=20, max_moves=50),  # 1-50
        "sokoban": dict(min_w=8, max_w=10, min_h=8, max_h=10),  # 6-10
        "sudoku": dict(min_empty=45, max_empty=55),  # 30-50
        "tower_of_hanoi": dict(min_disks=5, max_disks=8),  # 3-7
        "tsumego": dict(min_board_size=13, max_board_size=19),  # 9-13
    },
    "Logic": {
        "acre": dict(train=0),  # the held-out (compositional/systematic) split
        "list_functions": dict(),  # no difficulty parameters
        "aiw": dict(max_entities=10, task_type_weights=[0.2, 0.4, 0.4]),
        "circuit_logic": dict(min_terms=5, max_terms=10, min_inputs=4, max_inputs=6),
        "knights_knaves": dict(n_people=4, depth_constraint=3, width_constraint=3),  # 2, 2, 2
        "propositional_logic": dict(min_vars=4, max_vars=6, min_statements=4, max_statements=6,
                                    min_complexity=2, max_complexity=4),
        "self_reference": dict(difficulty=8),  # 5
        "syllogism": dict(invalid_ratio=0.5, inversion_probability=0.5),  # 0.3, 0.3
        "zebra_puzzles": dict(num_people=5, num_characteristics=5),  # 4, 4
    },
}

RG_HARD: tuple[RGTask, ...] = tuple(
    RGTask(name, category, params)
    for category, table in _RG_TABLE.items() for name, params in table.items())
RG_QUICK_IDS = ("chain_sum", "gcd", "spell_backward", "letter_counting", "number_sequence",
                "mini_sudoku", "syllogism", "aiw")

# Scorers that eval() the model's answer in their own module: `eval` there becomes literal-only.
RG_EVAL_MODULES = ("reasoning_gym.algorithmic.string_insertion",
                   "reasoning_gym.algorithmic.spiral_matrix",
                   "reasoning_gym.algorithmic.binary_matrix", "reasoning_gym.games.n_queens")
# Scorers that hand the answer to sympy's parse_expr (which evals): math names only.
RG_SYMPY_DATASETS = frozenset({"simple_integration", "intermediate_integration",
                               "polynomial_multiplication", "puzzle24", "countdown"})
MATH_NAMES = frozenset("x X y z C E I pi oo exp log ln sqrt sin cos tan cot sec csc asin acos "
                       "atan acot sinh cosh tanh asinh acosh atanh Abs abs sign".split())
MATH_TEXT = re.compile(r"[0-9A-Za-z\s+\-*/^().,=]*")


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


def rg_seed(task: RGTask, seed: int) -> int:
    return _seed("rg", task.id, seed)


@contextmanager
def _quiet() -> Iterator[None]:
    """Package generators print to stdout, which carries records only."""
    with redirect_stdout(sys.stderr):
        yield


def safe_for_scorer(dataset: str, answer: str) -> bool:
    """False for an answer a sympy-parsing scorer must not see: only digits, operators,
    brackets, single letters and common function names pass (no quotes, no underscores)."""
    if dataset not in RG_SYMPY_DATASETS:
        return True
    if not MATH_TEXT.fullmatch(answer) or "__" in answer:
        return False
    return all(name in MATH_NAMES or len(name) == 1
               for name in re.findall(r"[A-Za-z_]\w*", answer))


def _literal_eval(source: Any, *_: Any) -> Any:
    return ast.literal_eval(source)


class _RGScorer:
    """Lives in the helper process: datasets built on demand, answers scored there."""

    def __init__(self) -> None:
        import importlib

        self.datasets: dict[str, Any] = {}
        for name in RG_EVAL_MODULES:
            importlib.import_module(name).eval = _literal_eval

    def score(self, dataset: str, params: dict, seed: int, size: int, entry: dict,
              answer: str) -> float:
        import reasoning_gym

        key = json.dumps([dataset, params, seed, size], sort_keys=True)
        if key not in self.datasets:
            self.datasets[key] = reasoning_gym.create_dataset(dataset, size=size, seed=seed,
                                                              **params)
        return float(self.datasets[key].score_answer(answer=answer, entry=entry))


def run_rg(tasks: list[RGTask], backend: Backend, cfg: Config, stats: Any = None
           ) -> Iterator[Eval]:
    """Generate `episodes` instances per task, ask the model, score with the package."""
    rg = require_reasoning_gym()
    episodes = cfg.n_episodes
    built: list[tuple[RGTask, int, list[dict]]] = []
    for task in tasks:
        seed = rg_seed(task, cfg.seed)
        try:
            with _quiet():
                dataset = rg.create_dataset(task.dataset, size=episodes, seed=seed, **task.params)
                entries = [dataset[i] for i in range(episodes)]
        except Exception as exc:  # a dataset this package version cannot build
            log.warning("rg: %s cannot be built: %s", task.id, exc)
            _count(stats, "construct_failed")
            yield failed_item(cfg, task.id, task.category, backend.policy, "rg.construct",
                              f"{type(exc).__name__}: {exc}")
            continue
        built.append((task, seed, entries))
    conversations = [answer_prompt(e["question"], cfg) for _, _, entries in built for e in entries]
    completions = iter(Chat(backend, cfg)(conversations))
    with Helper("rg", cfg.call_timeout, cfg.helper_memory_mb) as scorer:
        for task, seed, entries in built:
            scores, answered, timeouts, truncated, answers = [], 0, 0, 0, []
            for entry in entries:
                completion = next(completions)
                truncated += completion.finish_reason == "length"
                answer = boxed_answer(completion.text)
                answers.append(None if answer is None else answer[:200])
                if answer is None:
                    scores.append(0.0)
                    continue
                answered += 1
                if not safe_for_scorer(task.dataset, answer):
                    _count(stats, "unsafe_answer")
                    scores.append(0.0)
                    continue
                try:
                    scores.append(_unit(scorer.request(
                        "score", task.dataset, task.params, seed, episodes, entry, answer)))
                except HelperTimeout:
                    timeouts += 1
                    _count(stats, "score_timeout")
                    scores.append(0.0)
                except HelperError as exc:
                    log.debug("rg: %s scorer raised: %s", task.id, exc)
                    _count(stats, "score_error")
                    scores.append(0.0)
            yield item(cfg, task.id, task.category, scores, backend.policy, {
                "dataset": task.dataset, "params": task.params, "seed": seed, "scores": scores,
                "answered": answered, "truncated": truncated, "timeouts": timeouts,
                "answers": answers})


def _count(stats: Any, reason: str) -> None:
    if stats is not None:
        stats.reasons[reason] += 1


# -- BFCL v4 multi-turn -----------------------------------------------------------------------
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def require_bfcl():
    import importlib

    try:
        from bfcl_eval.constants import default_prompts, type_mappings
        from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

        importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    except ImportError as exc:
        raise BackendUnavailable(f"the bfcl-mt suite needs the bfcl-eval package ({exc.name} "
                                 f"is missing): {BFCL_INSTALL}") from None
    return load_dataset_entry, load_ground_truth_entry, default_prompts, type_mappings


def bfcl_entries(categories: Iterable[str] = (), limit: int | None = None
                 ) -> list[tuple[str, dict, list]]:
    """(category, test entry with its function docs, ground truth), in the package's order."""
    load_entries, load_truth, _, _ = require_bfcl()
    chosen = {c.lower() for c in categories}
    wanted = [c for c in BFCL_CATEGORIES if not chosen or c in chosen]
    out = []
    for category in wanted:
        entries = load_entries(f"multi_turn_{category}")
        truth = {row["id"]: row["ground_truth"] for row in load_truth(f"multi_turn_{category}")}
        for entry in entries[:limit] if limit is not None else entries:
            out.append((category, entry, truth[entry["id"]]))
    return out


def openai_tool(doc: dict, mapping: dict[str, str]) -> dict:
    """A BFCL function doc as an OpenAI tool (BFCL's own type mapping; `response` dropped)."""

    def cast(schema: Any) -> Any:
        if not isinstance(schema, dict):
            return schema
        out = dict(schema)
        if "type" in out:
            out["type"] = mapping.get(out["type"], "string")
        if isinstance(out.get("properties"), dict):
            out["properties"] = {k: cast(v) for k, v in out["properties"].items()}
        if isinstance(out.get("items"), dict):
            out["items"] = cast(out["items"])
        return out

    parameters = cast(doc.get("parameters") or {"type": "dict", "properties": {}})
    parameters["type"] = "object"
    return {"type": "function", "function": {"name": doc["name"],
                                             "description": doc.get("description", ""),
                                             "parameters": parameters}}


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """BFCL's decoded form of one call (as its `convert_to_function_call` writes it)."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def parse_tool_calls(text: str) -> tuple[list[tuple[str, dict]], list[str]]:
    """Well-formed <tool_call> blocks as (name, arguments), and one message per malformed one."""
    calls, errors = [], []
    for block in TOOL_CALL.findall(text):
        try:
            data = json.loads(block)
            name, arguments = data["name"], data.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"Error: could not read the tool call ({type(exc).__name__}: {exc})")
            continue
        calls.append((name, arguments))
    return calls, errors


class _BfclEntry:
    """Lives in a helper process: one test entry's API instances, executor and checker."""

    MODEL = "spade"

    def open(self, entry: dict, category: str) -> list[str]:
        import inspect

        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call)

        self.entry, self.category = entry, category
        self.long_context = "long_context" in category
        _, instances = execute_multi_turn_func_call(
            [], entry["initial_config"], entry["involved_classes"], self.MODEL, entry["id"],
            long_context=self.long_context, is_evaL_run=False)
        return sorted({name for instance in instances.values()
                       for name, _ in inspect.getmembers(instance, inspect.ismethod)
                       if not name.startswith("_")})

    def execute(self, calls: list[str]) -> list[str]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call)

        results, _ = execute_multi_turn_func_call(
            calls, self.entry["initial_config"], self.entry["involved_classes"], self.MODEL,
            self.entry["id"], long_context=self.long_context, is_evaL_run=False)
        return [str(r) for r in results]

    def check(self, entry: dict, category: str, decoded: list, ground_truth: list) -> dict:
        # Run in a fresh helper: some API classes keep state at class level, so instances the
        # episode mutated would leak into the checker's replay (BFCL scores in a new process).
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
            multi_turn_checker)

        result = multi_turn_checker(decoded, ground_truth, entry, f"multi_turn_{category}",
                                    self.MODEL)
        return {"valid": bool(result.get("valid")),
                "error_type": result.get("error_type"),
                "error_message": str(result.get("error_message", ""))[:500]}


class BfclEpisode:
    """One BFCL entry played by the model: turns, steps, and what the checker will replay."""

    def __init__(self, order: int, category: str, entry: dict, truth: list, play: int,
                 cfg: Config, tools_mapping: dict, additional_prompt: str):
        self.order, self.category, self.entry, self.truth, self.play = (
            order, category, entry, truth, play)
        self.cfg, self.mapping, self.additional_prompt = cfg, tools_mapping, additional_prompt
        self.docs = list(entry["function"])
        self.missed = {str(k): v for k, v in (entry.get("missed_function") or {}).items()}
        self.messages = [{"role": "system",
                          "content": prompts.render("eval_bfcl", cfg.prompts_dir)}]
        self.turn, self.steps = 0, 0
        self.decoded: list[list[list[str]]] = []  # per turn, per step: call strings
        self.current: list[list[str]] = []
        self.methods: set[str] = set()
        self.helper = Helper("bfcl", cfg.call_timeout, cfg.helper_memory_mb)
        self.result: dict[str, Any] | None = None
        self.counts = {"calls": 0, "rejected": 0, "malformed": 0, "steps": 0}

    @property
    def tools(self) -> list[dict]:
        return [openai_tool(doc, self.mapping) for doc in self.docs]

    def open(self) -> None:
        try:
            self.methods = set(self.helper.request("open", self.entry, self.category))
        except (HelperTimeout, HelperError) as exc:
            return self.finish({"valid": False, "error_type": "spade:helper",
                                "error_message": str(exc)})
        self.start_turn()

    def start_turn(self) -> None:
        key = str(self.turn)
        if key in self.missed:
            self.docs += self.missed[key]
            messages = [{"role": "user", "content": self.additional_prompt}]
        else:
            messages = list(self.entry["question"][self.turn])
        self.messages += messages
        self.steps, self.current = 0, []

    def act(self, completion: Completion) -> None:
        self.messages.append({"role": "assistant", "content": completion.text})
        calls, errors = parse_tool_calls(completion.text)
        self.counts["malformed"] += len(errors)
        if not calls:
            return self.end_turn()
        self.steps += 1
        self.counts["steps"] += 1
        replies: list[str] = list(errors)
        accepted: list[str] = []
        for name, arguments in calls:
            problem = self._reject(name, arguments)
            if problem:
                self.counts["rejected"] += 1
                replies.append(problem)
            else:
                accepted.append(call_string(name, arguments))
        self.counts["calls"] += len(accepted)
        if accepted:
            try:
                replies += self.helper.request("execute", accepted)
            except (HelperTimeout, HelperError) as exc:
                self.current.append(accepted)
                return self.finish({"valid": False, "error_type": "spade:tool_timeout"
                                    if isinstance(exc, HelperTimeout) else "spade:helper",
                                    "error_message": str(exc)})
            self.current.append(accepted)
        self.messages += [{"role": "tool", "content": reply} for reply in replies]
        if self.steps > self.cfg.max_steps:
            self.decoded.append(self.current)
            return self.finish({"valid": False, "error_type": "multi_turn:force_terminated",
                                "error_message": f"more than {self.cfg.max_steps} steps in "
                                                 f"turn {self.turn}"})

    def _reject(self, name: str, arguments: dict) -> str | None:
        if name not in self.methods:
            return f"Error during execution: name '{name}' is not defined"
        for key in arguments:
            if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
                return f"Error during execution: {key!r} is not a valid argument name"
        return None

    def end_turn(self) -> None:
        self.decoded.append(self.current)
        self.turn += 1
        if self.turn >= len(self.entry["question"]):
            return self.check()
        self.start_turn()

    def check(self) -> None:
        if len(self.decoded) != len(self.truth):
            return self.finish({"valid": False, "error_type": "multi_turn:force_terminated",
                                "error_message": "turn count differs from the ground truth"})
        self.helper.close()
        try:
            result = self.helper.request("check", self.entry, self.category, self.decoded,
                                         self.truth, timeout=self.cfg.call_timeout * 4)
        except (HelperTimeout, HelperError) as exc:
            result = {"valid": False, "error_type": "spade:check_failed",
                      "error_message": str(exc)}
        self.finish(result)

    def finish(self, result: dict[str, Any]) -> None:
        self.result = result
        self.helper.close()

    def close(self) -> None:
        self.helper.close()


def run_bfcl(entries: list[tuple[str, dict, list]], backend: Backend, cfg: Config,
             stats: Any = None) -> Iterator[Eval]:
    """Play every entry `episodes` times, batched across entries; yield in entry order."""
    _, _, default_prompts, type_mappings = require_bfcl()
    additional = default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    mapping = type_mappings.GORILLA_TO_OPENAPI
    plays = cfg.n_episodes
    tasks = iter([(i, e, p) for i, e in enumerate(entries) for p in range(plays)])
    chat = Chat(backend, cfg)
    results: dict[int, list[BfclEpisode]] = {}
    next_out, active = 0, []
    width = max(1, cfg.batch_size)
    with ThreadPoolExecutor(max_workers=min(16, width)) as pool:
        try:
            exhausted = False
            while active or not exhausted:
                fresh = []
                while not exhausted and len(active) + len(fresh) < width:
                    task = next(tasks, None)
                    if task is None:
                        exhausted = True
                        break
                    index, (category, entry, truth), play = task
                    fresh.append(BfclEpisode(index, category, entry, truth, play, cfg, mapping,
                                             additional))
                active += fresh
                list(pool.map(BfclEpisode.open, fresh))
                running = [e for e in active if e.result is None]
                if running:
                    completions = chat([e.messages for e in running], [e.tools for e in running])
                    list(pool.map(BfclEpisode.act, running, completions))
                for episode in [e for e in active if e.result is not None]:
                    results.setdefault(episode.order, []).append(episode)
                active = [e for e in active if e.result is None]
                while len(results.get(next_out, ())) == plays:
                    yield _bfcl_record(results.pop(next_out), cfg, backend.policy, stats)
                    next_out += 1
        finally:
            for episode in active:
                episode.close()


def _bfcl_record(plays: list[BfclEpisode], cfg: Config, policy: str | None, stats: Any) -> Eval:
    plays.sort(key=lambda e: e.play)
    first = plays[0]
    scores = [1.0 if e.result.get("valid") else 0.0 for e in plays]
    errors = [e.result.get("error_type") for e in plays if not e.result.get("valid")]
    for error in errors:
        _count(stats, str(error))
    return item(cfg, first.entry["id"], first.category, scores, policy, {
        "turns": len(first.entry["question"]), "errors": errors,
        "error_message": next((e.result.get("error_message") for e in plays
                               if not e.result.get("valid")), None),
        **{k: sum(e.counts[k] for e in plays) for k in first.counts}})


# -- held-out env shards ----------------------------------------------------------------------
def run_envs(envs: Iterable[Any], backend: Backend, cfg: Config, stats: Any = None
             ) -> Iterator[Eval]:
    """Play each env `episodes` times without the hint; score = success rate (reward > 0)."""
    from stages import rollout

    template = cfg.rollout or rollout.Config()
    rcfg = rollout.Config(**{**template.__dict__, "plays": cfg.n_episodes, "hint": False,
                             "round": cfg.round or 0, "seed": cfg.seed,
                             "prompts_dir": cfg.prompts_dir, "sampling": cfg.sampling,
                             "concurrency": max(1, cfg.batch_size)})
    envs = list(envs)
    by_id = {env.id: env for env in envs}
    plays: dict[str, list] = {}
    for play in rollout.run(envs, backend, rcfg):
        plays.setdefault(play.env_id, []).append(play)
        if play.outcome != "ok":
            _count(stats, f"env.{play.outcome}")
        if len(plays[play.env_id]) == rcfg.plays:
            env = by_id[play.env_id]
            done = plays.pop(play.env_id)
            rewards = [p.reward for p in done]
            outcomes: dict[str, int] = {}
            for p in done:
                outcomes[p.outcome] = outcomes.get(p.outcome, 0) + 1
            yield item(cfg, env.id, env.skill or env.domain, [float(r > 0) for r in rewards],
                       backend.policy, {"class_name": env.class_name, "domain": env.domain,
                                        "mean_reward": statistics.fmean(rewards),
                                        "mean_turns": statistics.fmean(len(p.turns) for p in done),
                                        "outcomes": outcomes},
                       parents=[env.id])


# -- a local question/answer file -------------------------------------------------------------
_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def normalize_answer(text: Any) -> str:
    s = str(text).strip()
    for _ in range(3):
        s = _WRAPPERS.sub(r"\1", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$"):
        s = s.replace(token, "")
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    choice = re.fullmatch(r"\(\s*([A-Za-z])\s*\)", s)
    if choice:
        s = choice.group(1)
    return s.lower()


def as_number(text: str) -> Fraction | None:
    s = text.replace(" ", "")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    frac = _FRAC.match(s)
    try:
        if frac:
            value = Fraction(as_number(frac.group(2))) / Fraction(as_number(frac.group(3)))
            return -value if frac.group(1) else value
        return Fraction(s)
    except (ValueError, ZeroDivisionError, TypeError):
        return None


def answers_match(predicted: str | None, gold: Any) -> bool:
    if predicted is None:
        return False
    a, b = normalize_answer(predicted), normalize_answer(gold)
    if a == b:
        return True
    x, y = as_number(a), as_number(b)
    return x is not None and y is not None and x == y


def read_questions(path: str) -> list[dict]:
    from stages.records import RecordError
    from stages.shards import InputMissing, open_text

    if not os.path.exists(path):
        raise InputMissing(f"{path}: no such file or directory")
    rows = []
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise RecordError(f"invalid JSON: {exc}", f"{path}:{lineno}") from None
            if not isinstance(row, dict):
                raise RecordError("expected a JSON object", f"{path}:{lineno}")
            for key in ("question", "answer"):
                if row.get(key) is None:
                    raise RecordError(f"field '{key}': missing", f"{path}:{lineno}")
            row.setdefault("id", f"{lineno}")
            rows.append(row)
    return rows


def run_file(rows: list[dict], backend: Backend, cfg: Config, stats: Any = None
             ) -> Iterator[Eval]:
    episodes = cfg.n_episodes
    wanted = {c.lower() for c in cfg.categories}
    kept, seen = [], {}
    for row in rows:
        category = str(row.get("category") or "")
        if wanted and category.lower() not in wanted:
            continue
        seen[category] = seen.get(category, 0) + 1
        if cfg.limit is None or seen[category] <= cfg.limit:
            kept.append(row)
    conversations = [answer_prompt(str(row["question"]), cfg) for row in kept
                     for _ in range(episodes)]
    completions = iter(Chat(backend, cfg)(conversations))
    for row in kept:
        answers = [boxed_answer(next(completions).text) for _ in range(episodes)]
        scores = [1.0 if answers_match(a, row["answer"]) else 0.0 for a in answers]
        if any(a is None for a in answers):
            _count(stats, "no_answer")
        yield item(cfg, str(row["id"]), str(row.get("category") or ""), scores, backend.policy,
                   {"gold": str(row["answer"])[:200],
                    "answers": [None if a is None else a[:200] for a in answers]})


# -- entry point ------------------------------------------------------------------------------
def check_available(suite: str) -> None:
    """Raise BackendUnavailable (exit 69) before any model is loaded."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
    if suite in ("rg-hard", "rg-quick"):
        require_reasoning_gym()
    elif suite == "bfcl-mt":
        require_bfcl()


def run(backend: Backend, cfg: Config, envs: Iterable[Any] | None = None, stats: Any = None
        ) -> Iterator[Eval]:
    """Item records in suite order, then the roll-ups."""
    check_available(cfg.suite)
    if cfg.suite in ("rg-hard", "rg-quick"):
        items = run_rg(rg_tasks(cfg.suite, cfg.categories, cfg.limit), backend, cfg, stats)
    elif cfg.suite == "bfcl-mt":
        items = run_bfcl(bfcl_entries(cfg.categories, cfg.limit), backend, cfg, stats)
    elif cfg.suite == "envs":
        items = run_envs(_limited_envs(envs or [], cfg), backend, cfg, stats)
    else:
        if not cfg.data:
            raise ValueError("the file suite needs a data path")
        items = run_file(read_questions(cfg.data), backend, cfg, stats)
    produced = []
    for record in items:
        produced.append(record)
        yield record
    yield from rollups(produced, cfg.suite_name, cfg.round, backend.policy)


def _limited_envs(envs: Iterable[Any], cfg: Config) -> Iterator[Any]:
    wanted = {c.lower() for c in cfg.categories}
    seen: dict[str, int] = {}
    for env in envs:
        category = env.skill or env.domain
        if wanted and category.lower() not in wanted:
            continue
        seen[category] = seen.get(category, 0) + 1
        if cfg.limit is None or seen[category] <= cfg.limit:
            yield env


def summary_rows(records: Iterable[Eval]) -> list[tuple[str, str, int, float, float | None,
                                                        float | None]]:
    """(suite, category, n, score, ci_low, ci_high) for every roll-up record."""
    return [(r.suite, r.category, r.samples, r.score, r.ci_low, r.ci_high)
            for r in records if not r.task and r.ok]

