"""eval: score a policy (any backend) on offline suites; one record per item plus roll-ups.

In: a backend, Config (suite, episodes, limit, ...), and for the `envs` suite env records.
Out: `eval` records: one per item (`task` set: an RG task config, a BFCL test id, an env id, a
question of a local file) with `score` in [0, 1] and `samples` = episodes played, then one
roll-up per category and one `overall` (`task` empty) whose `samples` is the number of items.
Every record carries a 95% confidence interval in ci_low/ci_high: Wilson when the values it
summarises are all 0 or 1, otherwise the normal approximation of the mean (clipped to [0, 1];
None for a single non-binary value). Roll-ups average item scores (each item weighs the same).
Items that could not be built (`ok: false`) are recorded and left out of the roll-ups.

Suites, one module each (its docstring has the details):
- `rg-hard`, `rg-quick`: Reasoning-Gym tasks with our reconstruction of "hard" settings
  (100 tasks, 4 categories), and an 8-task CPU smoke subset -> `stages.evaluate.rg`.
- `bfcl-mt`: BFCL v4 multi-turn, our agent loop over the package's simulated APIs, scored by
  its `multi_turn_checker` -> `stages.evaluate.bfcl`.
- `envs`: env records played without the hint through `stages.rollout.run`
  -> `stages.evaluate.envs`.
- `file`: a local question/answer JSONL, exact match after normalisation -> `stages.evaluate.qa`.
Shared: `stages.evaluate.rollup` (intervals, item and roll-up records), `stages.evaluate.batching`
(batched model calls, the answer prompt, boxed answers), `stages.evaluate.helpers` (helper
processes for package code on model-chosen input).

Package code on model-chosen input runs in helper processes (multiprocessing forkserver) with a
wall-clock timeout and an address-space cap per request; a timed-out answer scores 0. This
protects the run, it is NOT a security boundary. Model calls are batched: many conversations per
`backend.chat`; the sampling seed of each call derives from (seed, suite, call index), so a rerun
with the same backend reproduces the run.

This package holds Config, `check_available`, `run` and `summary_rows`, and re-exports the
public names of its modules (`from stages import evaluate as ev; ev.run_rg(...)` works).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from stages.backends import Backend, Sampling
from stages.evaluate.batching import Chat, answer_prompt, boxed_answer
from stages.evaluate.bfcl import (BFCL_CATEGORIES, BFCL_INSTALL, BFCL_MAX_STEPS, TOOL_CALL,
                                  BfclEpisode, bfcl_entries, call_string, openai_tool,
                                  parse_tool_calls, require_bfcl, run_bfcl)
from stages.evaluate.envs import _limited_envs, run_envs
from stages.evaluate.helpers import Helper, HelperError, HelperTimeout
from stages.evaluate.qa import answers_match, as_number, normalize_answer, read_questions, run_file
from stages.evaluate.rg import (MATH_NAMES, MATH_TEXT, MODULE_CATEGORY, RG_EVAL_MODULES, RG_HARD,
                                RG_INSTALL, RG_QUICK_IDS, RG_SYMPY_DATASETS, RGTask,
                                require_reasoning_gym, rg_seed, rg_tasks, run_rg,
                                safe_for_scorer)
from stages.evaluate.rollup import (OVERALL, Z95, failed_item, interval, item, normal_interval,
                                    rollups, wilson)
from stages.records import Eval

__all__ = [
    # this module
    "SUITES", "Config", "check_available", "run", "summary_rows",
    # rollup
    "OVERALL", "Z95", "wilson", "normal_interval", "interval", "item", "failed_item", "rollups",
    # batching
    "Chat", "answer_prompt", "boxed_answer",
    # helpers
    "Helper", "HelperError", "HelperTimeout",
    # rg
    "RGTask", "MODULE_CATEGORY", "RG_HARD", "RG_QUICK_IDS", "RG_EVAL_MODULES",
    "RG_SYMPY_DATASETS", "MATH_NAMES", "MATH_TEXT", "RG_INSTALL", "rg_tasks",
    "require_reasoning_gym", "rg_seed", "safe_for_scorer", "run_rg",
    # bfcl
    "BFCL_CATEGORIES", "BFCL_MAX_STEPS", "BFCL_INSTALL", "TOOL_CALL", "require_bfcl",
    "bfcl_entries", "openai_tool", "call_string", "parse_tool_calls", "BfclEpisode", "run_bfcl",
    # envs
    "run_envs",
    # qa
    "normalize_answer", "as_number", "answers_match", "read_questions", "run_file",
]

SUITES = ("rg-hard", "rg-quick", "bfcl-mt", "envs", "file")


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


def summary_rows(records: Iterable[Eval]) -> list[tuple[str, str, int, float, float | None,
                                                        float | None]]:
    """(suite, category, n, score, ci_low, ci_high) for every roll-up record."""
    return [(r.suite, r.category, r.samples, r.score, r.ci_low, r.ci_high)
            for r in records if not r.task and r.ok]
