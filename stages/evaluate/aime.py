"""AIME suite `aime`: a local JSONL of competition problems, answers checked with math-verify.

In: `--data PATH`, a JSONL in one of the forms AIME is shared in (nothing is downloaded):
the problem in `problem` or `question` (Hugging Face dumps such as math-ai/aime25 or
opencompass/AIME2025), or in `prompt` as chat messages whose last user message is the problem
(the reference's preprocessed aime-<year>.jsonl); the answer in `answer` or `label`; `id`
optional (default: the line number), `category` optional.
Out: one `eval` item per problem: `score` = share of its episodes answered right (averaged over
problems: the reference's pass@1), details with the gold answer and the model's answers.
Protocol (github.com/spade-rl/spade @ 9b2b813: eval_offline/configs/games.yaml and
eval_offline/suites/aime.py): 64 samples per problem, temperature 1.0, top-p 0.95, top-k 20,
32768 max tokens; gold and answer are each read as `\\boxed{...}` by math-verify's `parse` and
compared by its `verify`. The answer is `final_answer` (answer tags, else the last \\boxed{});
the prompt is ours (`eval_answer`, which asks for \\boxed{}). One file per benchmark: name the
suite with `--name aime2025`.
Guarantees: math-verify parses model text with sympy, so it runs in a helper process with a
timeout (`stages.evaluate.helpers`); a timeout or an error scores 0.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterator

from stages.backends import Backend, BackendUnavailable
from stages.evaluate.batching import Chat, answer_prompt, final_answer
from stages.evaluate.helpers import Helper, HelperError, HelperTimeout
from stages.evaluate.qa import limited, read_jsonl
from stages.evaluate.rollup import _count, item
from stages.records import Eval

if TYPE_CHECKING:
    from stages.evaluate import Config

log = logging.getLogger("stages.evaluate")

MATH_VERIFY_INSTALL = "pip install 'spade-selfplay[eval]' (or: pip install math-verify)"


def require_math_verify():
    try:
        import math_verify
    except ImportError:
        raise BackendUnavailable(f"the aime suite needs the math-verify package: "
                                 f"{MATH_VERIFY_INSTALL}") from None
    return math_verify


def read_aime(path: str) -> list[dict]:
    """Rows as {id, question, answer, category}; RecordError (path:line) for a row without a
    problem or an answer."""
    from stages.records import RecordError

    rows = []
    for lineno, row in read_jsonl(path):
        question = row.get("problem", row.get("question"))
        if question is None and isinstance(row.get("prompt"), list):
            question = next((m.get("content") for m in reversed(row["prompt"])
                             if isinstance(m, dict) and m.get("role") == "user"), None)
        elif question is None:
            question = row.get("prompt")
        answer = row.get("answer", row.get("label"))
        if not isinstance(question, str) or not question.strip():
            raise RecordError("no problem: expected 'problem', 'question' or 'prompt'",
                              f"{path}:{lineno}")
        if answer is None or not str(answer).strip():
            raise RecordError("no answer: expected 'answer' or 'label'", f"{path}:{lineno}")
        rows.append({"id": str(row.get("id", row.get("ID", lineno))), "question": question,
                     "answer": str(answer).strip(), "category": str(row.get("category") or "")})
    return rows


class _MathVerify:
    """Lives in the helper process: math-verify's parse and verify."""

    def verify(self, gold: str, answer: str) -> bool:
        from math_verify import parse, verify

        return bool(verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{answer}}}")))


def math_equal(helper: Helper, gold: str, answer: str | None, stats: Any = None) -> bool:
    """math-verify's verdict, in the helper; False on a timeout or an error."""
    if answer is None:
        return False
    try:
        return bool(helper.request("verify", gold, answer))
    except HelperTimeout:
        _count(stats, "score_timeout")
    except HelperError as exc:
        log.debug("math-verify raised on %r: %s", answer[:80], exc)
        _count(stats, "score_error")
    return False


def run_aime(rows: list[dict], backend: Backend, cfg: Config, stats: Any = None
             ) -> Iterator[Eval]:
    require_math_verify()
    episodes = cfg.n_episodes
    kept = limited(rows, cfg)
    conversations = [answer_prompt(row["question"], cfg) for row in kept
                     for _ in range(episodes)]
    completions = iter(Chat(backend, cfg)(conversations))
    with Helper("math", _MathVerify, cfg.call_timeout, cfg.helper_memory_mb) as helper:
        for row in kept:
            answers = [final_answer(next(completions).text) for _ in range(episodes)]
            if None in answers:
                _count(stats, "no_answer")
            scores = [float(math_equal(helper, row["answer"], a, stats)) for a in answers]
            yield item(cfg, row["id"], row["category"], scores, backend.policy,
                       {"gold": row["answer"][:200],
                        "answers": [None if a is None else a[:200] for a in answers]})
