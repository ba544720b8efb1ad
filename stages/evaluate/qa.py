"""Local question/answer file suite `file`: reading, answer normalisation, `run_file`.

In: a local JSONL with `question` and `answer` (optional `id`, default the line number, and
`category`): AIME, GPQA or other data the user provides; nothing is downloaded.
Out: one `eval` item per question (`score` = share of its episodes answered right), details
with the gold answer and the model's answers. `read_jsonl` (shared by the file-based suites)
raises InputMissing for a missing file and RecordError (with path:line) for a bad line.
Guarantees: the answer (`final_answer`: answer tags, else the last \\boxed{}) is compared with
the gold one after normalisation (LaTeX wrappers, $, spaces, case, a trailing period, a
parenthesised choice letter); numbers are compared as exact fractions. Exact match only: AIME,
GPQA and LiveCodeBench have their own suites (`aime`, `gpqa`, `lcb`).
"""

from __future__ import annotations

import json
import os
import re
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Iterator

from stages.backends import Backend
from stages.evaluate.batching import Chat, answer_prompt, final_answer
from stages.evaluate.rollup import _count, item
from stages.records import Eval

if TYPE_CHECKING:
    from stages.evaluate import Config

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


def read_jsonl(path: str) -> list[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a local JSONL (.gz/.zst too)."""
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
            rows.append((lineno, row))
    return rows


def read_questions(path: str) -> list[dict]:
    from stages.records import RecordError

    rows = []
    for lineno, row in read_jsonl(path):
        for key in ("question", "answer"):
            if row.get(key) is None:
                raise RecordError(f"field '{key}': missing", f"{path}:{lineno}")
        row.setdefault("id", f"{lineno}")
        rows.append(row)
    return rows


def limited(rows: list[dict], cfg: Config) -> list[dict]:
    """The rows of the wanted categories, at most `limit` per category, in file order."""
    wanted = {c.lower() for c in cfg.categories}
    kept, seen = [], {}
    for row in rows:
        name = str(row.get("category") or "")
        if wanted and name.lower() not in wanted:
            continue
        seen[name] = seen.get(name, 0) + 1
        if cfg.limit is None or seen[name] <= cfg.limit:
            kept.append(row)
    return kept


def run_file(rows: list[dict], backend: Backend, cfg: Config, stats: Any = None
             ) -> Iterator[Eval]:
    episodes = cfg.n_episodes
    kept = limited(rows, cfg)
    conversations = [answer_prompt(str(row["question"]), cfg) for row in kept
                     for _ in range(episodes)]
    completions = iter(Chat(backend, cfg)(conversations))
    for row in kept:
        answers = [final_answer(next(completions).text) for _ in range(episodes)]
        scores = [1.0 if answers_match(a, row["answer"]) else 0.0 for a in answers]
        if any(a is None for a in answers):
            _count(stats, "no_answer")
        yield item(cfg, str(row["id"]), str(row.get("category") or ""), scores, backend.policy,
                   {"gold": str(row["answer"])[:200],
                    "answers": [None if a is None else a[:200] for a in answers]})
