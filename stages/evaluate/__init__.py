"""eval: score a policy (any backend) on offline suites; one record per item plus roll-ups.

In: a backend, Config (suite, episodes, limit, ...), and for the `envs` suite env records.
Out: `eval` records: one per item (`task` set: an RG task config, a BFCL test id, an env id, a
question of a local file) with `score` in [0, 1] and `samples` = episodes played, then one
roll-up per category and one `overall` (`task` empty) whose `samples` is the number of items.
Every record carries a 95% confidence interval in ci_low/ci_high: Wilson when the values it
summarises are all 0 or 1, otherwise the normal approximation of the mean (clipped to [0, 1];
None for a single non-binary value). Roll-ups average item scores (each item weighs the same).
Items that could not be built (`ok: false`) are recorded and left out of the roll-ups.

Suites, one module each (its docstring has the details and cites the reference for its
protocol: episodes, sampling, answer extraction and scoring):
- `rg-hard`, `rg-quick`: Reasoning-Gym, the paper's 100 hard configs (A.3) under the reference's
  protocol, and an 8-task CPU smoke subset -> `stages.evaluate.rg`.
- `aime`, `gpqa`, `lcb`: local files in their upstream formats (`--data`): AIME scored with
  math-verify -> `stages.evaluate.aime`; GPQA-Diamond as shuffled multiple choice
  -> `stages.evaluate.gpqa`; LiveCodeBench, programs run on the tests in the jail
  -> `stages.evaluate.lcb`.
- `bfcl-mt`: BFCL v4 multi-turn, our agent loop over the package's simulated APIs, scored by
  its `multi_turn_checker` -> `stages.evaluate.bfcl`.
- `envs`: env records played without the hint through `stages.rollout.run`
  -> `stages.evaluate.envs`.
- `file`: a local question/answer JSONL, exact match after normalisation -> `stages.evaluate.qa`.
Each suite runs under its protocol (PROTOCOLS: episodes and sampling) unless Config says
otherwise. `stages.evaluate.compare` pairs two runs' items into the paper's table shape.
Shared: `stages.evaluate.rollup` (intervals, item and roll-up records), `stages.evaluate.batching`
(batched model calls, prompts, reading the answer of a reply), `stages.evaluate.helpers` (helper
processes for package code on model-chosen input).

Package code on model-chosen input runs in helper processes (multiprocessing forkserver) with a
wall-clock timeout and an address-space cap per request; a timed-out answer scores 0. This
protects the run, it is NOT a security boundary. Model calls are batched: many conversations per
`backend.chat`; each conversation's sampling seed derives from (seed, suite, its index), so a
rerun with the same backend reproduces the run.

This package holds Config, `check_available`, `run` and `summary_rows`, and re-exports the
public names of its modules (`from stages import evaluate as ev; ev.run_rg(...)` works).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from stages.backends import Backend, Sampling
from stages.evaluate.aime import math_equal, read_aime, require_math_verify, run_aime
from stages.evaluate.batching import Chat, answer_prompt, final_answer
from stages.evaluate.bfcl import (BFCL_CATEGORIES, BFCL_INSTALL, BFCL_MAX_STEPS, TOOL_CALL,
                                  BfclEpisode, bfcl_entries, call_string, openai_tool,
                                  parse_tool_calls, require_bfcl, run_bfcl)
from stages.evaluate.compare import AVERAGE, Column, compare, read_runs
from stages.evaluate.envs import _limited_envs, run_envs
from stages.evaluate.gpqa import choice_letter, read_gpqa, run_gpqa
from stages.evaluate.helpers import HASH_SEED, Helper, HelperError, HelperTimeout
from stages.evaluate.lcb import check_program, program_of, read_lcb, run_lcb
from stages.evaluate.qa import (answers_match, as_number, limited, normalize_answer, read_jsonl,
                                read_questions, run_file)
from stages.evaluate.rg import (RG_HARD, RG_INSTALL, RG_QUICK_IDS, RG_SYMPY_DATASETS, RGTask,
                                require_reasoning_gym, rg_dataset, rg_instance, rg_seeds,
                                rg_tasks, run_rg, safe_for_scorer)
from stages.evaluate.rollup import (OVERALL, Z95, failed_item, interval, item, normal_interval,
                                    rollups, wilson)
from stages.records import Eval

__all__ = [
    # this module
    "SUITES", "DATA_SUITES", "Protocol", "PROTOCOLS", "Config", "check_available", "run",
    "summary_rows",
    # rollup
    "OVERALL", "Z95", "wilson", "normal_interval", "interval", "item", "failed_item", "rollups",
    # batching
    "Chat", "answer_prompt", "final_answer",
    # helpers
    "HASH_SEED", "Helper", "HelperError", "HelperTimeout",
    # rg
    "RGTask", "RG_HARD", "RG_QUICK_IDS", "RG_SYMPY_DATASETS", "RG_INSTALL", "rg_tasks",
    "require_reasoning_gym", "rg_seeds", "rg_dataset", "rg_instance", "safe_for_scorer",
    "run_rg",
    # aime, gpqa, lcb
    "read_aime", "require_math_verify", "math_equal", "run_aime", "read_gpqa", "choice_letter",
    "run_gpqa", "read_lcb", "program_of", "check_program", "run_lcb",
    # compare
    "AVERAGE", "Column", "compare", "read_runs",
    # bfcl
    "BFCL_CATEGORIES", "BFCL_MAX_STEPS", "BFCL_INSTALL", "TOOL_CALL", "require_bfcl",
    "bfcl_entries", "openai_tool", "call_string", "parse_tool_calls", "BfclEpisode", "run_bfcl",
    # envs
    "run_envs",
    # qa
    "normalize_answer", "as_number", "answers_match", "read_jsonl", "read_questions", "limited",
    "run_file",
]

SUITES = ("rg-hard", "rg-quick", "aime", "gpqa", "lcb", "bfcl-mt", "envs", "file")
DATA_SUITES = ("aime", "gpqa", "lcb", "file")  # read a local file: --data PATH


@dataclass(frozen=True)
class Protocol:
    episodes: int
    sampling: Sampling


_RG = Sampling(temperature=0.6, top_p=0.8, top_k=20, max_tokens=8192)
# How each suite runs unless told otherwise. The reference's (github.com/spade-rl/spade @
# 9b2b813): rg from eval_offline/configs/_games_gem.yaml (8 episodes, T 0.6, 8192 tokens) and
# spade/core/eval/gem_evaluator.py (top-p 0.8, top-k 20); aime, gpqa and lcb from
# eval_offline/configs/games.yaml. Ours: rg-quick's 2 episodes (a smoke run), and greedy
# decoding with 1024 tokens for bfcl-mt, envs and file.
PROTOCOLS = {
    "rg-hard": Protocol(8, _RG),
    "rg-quick": Protocol(2, _RG),
    "aime": Protocol(64, Sampling(temperature=1.0, top_p=0.95, top_k=20, max_tokens=32768)),
    "gpqa": Protocol(8, Sampling(temperature=0.7, top_p=0.95, max_tokens=32768)),
    "lcb": Protocol(1, Sampling(temperature=0.2, top_p=0.95, max_tokens=16384)),
    "bfcl-mt": Protocol(1, Sampling(temperature=0.0, max_tokens=1024)),
    "envs": Protocol(8, Sampling(temperature=0.0, max_tokens=1024)),
    "file": Protocol(1, Sampling(temperature=0.0, max_tokens=1024)),
}


@dataclass(frozen=True)
class Config:
    suite: str
    episodes: int | None = None  # None: the suite's protocol
    limit: int | None = None  # at most this many items per category
    categories: tuple[str, ...] = ()  # keep only these categories (empty: all)
    round: int | None = 0
    seed: int = 0
    batch_size: int = 32  # conversations per backend.chat call
    prompts_dir: str | None = None
    sampling: Sampling | None = None  # None: the suite's protocol
    data: str | None = None  # aime, gpqa, lcb, file: the local file
    name: str | None = None  # those suites: the suite name in records (default: the file's stem)
    max_steps: int = BFCL_MAX_STEPS  # bfcl-mt: model replies with tool calls per user turn
    call_timeout: float = 30.0  # seconds one scoring or tool request may take
    helper_memory_mb: int = 8192  # address-space cap of a helper process
    rollout: Any = None  # envs, lcb: a stages.rollout.Config template (sandbox, turn caps)
    protocol: Protocol = field(init=False)

    def __post_init__(self) -> None:
        protocol = PROTOCOLS.get(self.suite, PROTOCOLS["file"])
        object.__setattr__(self, "protocol", protocol)
        if self.sampling is None:
            object.__setattr__(self, "sampling", protocol.sampling)

    @property
    def n_episodes(self) -> int:
        return self.episodes if self.episodes is not None else self.protocol.episodes

    @property
    def suite_name(self) -> str:
        if self.suite in DATA_SUITES:
            return self.name or os.path.basename(self.data or self.suite).split(".")[0]
        return self.suite


def check_available(suite: str) -> None:
    """Raise BackendUnavailable (exit 69) before any model is loaded."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
    if suite in ("rg-hard", "rg-quick"):
        require_reasoning_gym()
    elif suite == "aime":
        require_math_verify()
    elif suite == "bfcl-mt":
        require_bfcl()


_READERS = {"aime": (read_aime, run_aime), "gpqa": (read_gpqa, run_gpqa),
            "lcb": (read_lcb, run_lcb), "file": (read_questions, run_file)}


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
            raise ValueError(f"the {cfg.suite} suite needs a data path")
        read, run_suite = _READERS[cfg.suite]
        items = run_suite(read(cfg.data), backend, cfg, stats)
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
