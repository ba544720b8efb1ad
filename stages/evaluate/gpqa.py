"""GPQA-Diamond suite `gpqa`: four-option questions from a local file, options shuffled.

In: `--data PATH`, GPQA-Diamond as its authors ship it (nothing is downloaded): the CSV
(gpqa_diamond.csv) or a JSONL/CSV with its columns `Question`, `Correct Answer`,
`Incorrect Answer 1..3` (optional `Record ID`, `High-level domain`); or a JSONL already in
choice form: `question`, `options` (4 strings) and `answer` (the right option's letter).
Out: one `eval` item per question (id: `Record ID`, else the row number), category = its
high-level domain when the file has one, `score` = share of its episodes answered with the
right letter (the reference's avg@8), details with the gold letter and the letters given.
Protocol (github.com/spade-rl/spade @ 9b2b813: eval_offline/configs/games.yaml and
eval_offline/suites/gpqa_diamond.py): 8 samples per question, temperature 0.7, top-p 0.95,
32768 max tokens; the options of the author's columns are shuffled by one `random.Random(42)`
drawn through the rows in file order (`shuffle` of [correct, incorrect 1, 2, 3]), so the letters
match the reference's. The letter is read from `final_answer` (answer tags, else the last
\\boxed{}), else from a closing "answer is X" / "Answer: X"; the prompt is ours (`eval_choice`).
"""

from __future__ import annotations

import csv
import os
import random
import re
from typing import TYPE_CHECKING, Any, Iterator

from stages.backends import Backend
from stages.evaluate.batching import Chat, answer_prompt, final_answer
from stages.evaluate.qa import limited, normalize_answer, read_jsonl
from stages.evaluate.rollup import _count, item
from stages.records import Eval

if TYPE_CHECKING:
    from stages.evaluate import Config

LETTERS = "ABCD"
GPQA_SHUFFLE_SEED = 42  # gpqa_diamond.py `random.Random(42)`; gem_adapter.py shuffle_seed 42
AUTHOR_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                  "Incorrect Answer 3")
LETTER_PHRASE = re.compile(r"(?:answer is|Answer:)\s*\(?([A-D])\b", re.I)


def read_gpqa(path: str) -> list[dict]:
    """Rows as {id, question (with its lettered options), answer (a letter), category}."""
    from stages.records import RecordError

    rng = random.Random(GPQA_SHUFFLE_SEED)
    rows = []
    for where, row in _raw_rows(path):
        if all(key in row for key in AUTHOR_COLUMNS):
            choices = [str(row[key]).strip() for key in AUTHOR_COLUMNS[1:]]
            order = list(range(4))
            rng.shuffle(order)
            options, answer = [choices[j] for j in order], LETTERS[order.index(0)]
            question = str(row["Question"]).strip()
        elif {"question", "options", "answer"} <= set(row):
            options, answer, question = row["options"], str(row["answer"]).strip().upper(), \
                str(row["question"]).strip()
            if (not isinstance(options, list) or len(options) != 4
                    or answer not in LETTERS):
                raise RecordError("expected 4 options and an answer letter A-D", where)
        else:
            raise RecordError(f"expected GPQA's columns ({', '.join(AUTHOR_COLUMNS)}) or "
                              "question, options and answer", where)
        lines = "\n".join(f"{letter}. {option}" for letter, option in zip(LETTERS, options))
        rows.append({"id": str(row.get("Record ID") or row.get("question_id")
                               or where.rsplit(":", 1)[1]),
                     "question": f"{question}\n\n{lines}", "answer": answer,
                     "category": str(row.get("High-level domain") or row.get("category") or "")})
    return rows


def _raw_rows(path: str) -> list[tuple[str, dict]]:
    """(path:line, row) from a CSV (by its suffix) or a JSONL."""
    from stages.shards import InputMissing

    if not path.lower().endswith(".csv"):
        return [(f"{path}:{lineno}", row) for lineno, row in read_jsonl(path)]
    if not os.path.exists(path):
        raise InputMissing(f"{path}: no such file or directory")
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return [(f"{path}:{reader.line_num}", row) for row in reader]


def choice_letter(text: str) -> str | None:
    """The letter a reply chose: its final answer if that is a letter, else a closing phrase."""
    answer = final_answer(text)
    if answer is not None:
        letter = normalize_answer(answer).upper()
        if letter in tuple(LETTERS):
            return letter
    found = LETTER_PHRASE.findall(text)
    return found[-1].upper() if found else None


def run_gpqa(rows: list[dict], backend: Backend, cfg: Config, stats: Any = None
             ) -> Iterator[Eval]:
    episodes = cfg.n_episodes
    kept = limited(rows, cfg)
    conversations = [answer_prompt(row["question"], cfg, "eval_choice") for row in kept
                     for _ in range(episodes)]
    completions = iter(Chat(backend, cfg)(conversations))
    for row in kept:
        letters = [choice_letter(next(completions).text) for _ in range(episodes)]
        if None in letters:
            _count(stats, "no_answer")
        yield item(cfg, row["id"], row["category"],
                   [float(letter == row["answer"]) for letter in letters], backend.policy,
                   {"gold": row["answer"], "answers": letters})
