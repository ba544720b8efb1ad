"""LiveCodeBench suite `lcb`: code problems from a local file, the model's program run on their
tests inside the nsjail jail.

In: `--data PATH`, LiveCodeBench's release file (e.g. release_v6's test6.jsonl; nothing is
downloaded): per line `question_id`, `question_content`, `starter_code`, `difficulty`,
`public_test_cases` (JSON text: a list of {input, output, testtype}), `private_test_cases`
(JSON text, or as upstream ships most of them base64(zlib(pickle(JSON text)))) and `metadata`
(JSON text; `func_name` names the method the functional tests call).
Out: one `eval` item per problem, category = its difficulty, `score` = share of its episodes
whose program passes every test (LiveCodeBench's pass@1), details with per-episode verdicts.
Protocol (github.com/spade-rl/spade @ 9b2b813: eval_offline/configs/games.yaml and
spade/core/eval/livecodebench_env.py, which runs LiveCodeBench's official checker): 1 sample per
problem, temperature 0.2, top-p 0.95, 16384 max tokens, 6 seconds per test. The program is the
last fenced code block of the reply. Tests run as LiveCodeBench's checker runs them (facts of
its lcb_runner; this code is ours): a stdin test feeds `input` on stdin and compares the printed
lines with `output` line by line after stripping, a line that differs passing if both read as
the same list of decimals; a functional test calls `Solution().<func_name>(*args)` with one JSON
value per input line and compares the result (a tuple read as a list) with the JSON `output`.
Tests run in order and the first failure ends the episode. The prompt is ours (`eval_code`).

Guarantees: the model's program only ever runs in the jail (`sandbox.jail.Worker`, with
`--sandbox`'s mode), one worker per episode, each test a worker call with its own timeout. The
test cases are decoded there too: the parent never decodes them, so it never unpickles the
file's data. A test that times out, a jail error or a crash fails the episode.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterator

from stages.backends import Backend
from stages.evaluate.batching import Chat
from stages.evaluate.qa import limited, read_jsonl
from stages.evaluate.rollup import _count, item
from stages.records import Eval

if TYPE_CHECKING:
    from stages.evaluate import Config

LCB_TEST_TIMEOUT = 6.0  # livecodebench_env.py `timeout: int = 6` (seconds per test)
LCB_MEMORY_MB = 2048
LCB_WORKERS = 8  # episodes checked at once
FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)```", re.S)
REQUIRED = ("question_content", "public_test_cases", "private_test_cases")

# Trusted harness, loaded into a jailed worker as its env program; the {...} fields are filled
# with repr()s of the program and the test data, so they stay string literals.
HARNESS = '''
import base64, io, json, pickle, sys, threading, zlib
from decimal import Decimal, InvalidOperation

PROGRAM = {program}
PUBLIC = {public}
PRIVATE = {private}
FN_NAME = {fn_name}
HEADER = (
    "from typing import *\\nfrom collections import *\\nfrom itertools import *\\n"
    "from functools import *\\nfrom heapq import *\\nfrom bisect import *\\nfrom math import *\\n"
    "import bisect, collections, functools, heapq, itertools, math, random, re, string, sys\\n"
    "sys.setrecursionlimit(50000)\\n")


def decoded(text):
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(pickle.loads(zlib.decompress(base64.b64decode(text.encode()))))


def lines(text):
    return [line.strip() for line in text.strip().split("\\n")]


def decimals(line):
    try:
        return [Decimal(word) for word in line.split()]
    except InvalidOperation:
        return None


def same_output(got, want):
    got, want = lines(got), lines(want)
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a != b and (decimals(a) is None or decimals(a) != decimals(b)):
            return False
    return True


class LcbTestsEnv:
    def reset(self, seed=None):
        self.tests = decoded(PUBLIC) + decoded(PRIVATE)
        self.code = compile(HEADER + PROGRAM, "solution.py", "exec")
        return "%d tests" % len(self.tests), {{"tests": len(self.tests)}}

    def step(self, action):
        test = self.tests[int(action)]
        passed = self.functional(test) if FN_NAME else self.stdin(test)
        return "pass" if passed else "fail", float(passed), not passed, False, {{}}

    def stdin(self, test):
        data = test["input"]
        stdin = io.TextIOWrapper(io.BytesIO(data.encode()), encoding="utf-8")
        stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")

        def opened(file, *args, **kwargs):
            return io.TextIOWrapper(io.BytesIO(data.encode())) if file == 0 else open(
                file, *args, **kwargs)

        saved = sys.stdin, sys.stdout
        sys.stdin, sys.stdout = stdin, stdout
        try:
            exec(self.code, {{"__name__": "__main__", "exit": sys.exit, "quit": sys.exit,
                             "open": opened}})
            for thread in threading.enumerate():  # solutions that run main() on a big-stack thread
                if thread is not threading.current_thread():
                    thread.join()
        except SystemExit:
            pass
        finally:
            sys.stdin, sys.stdout = saved
        stdout.flush()
        return same_output(stdout.buffer.getvalue().decode("utf-8", "replace"), test["output"])

    def functional(self, test):
        namespace = {{"__name__": "solution"}}
        exec(self.code, namespace)
        owner = namespace["Solution"]() if "Solution" in namespace else None
        method = getattr(owner, FN_NAME) if owner is not None else namespace[FN_NAME]
        result = method(*[json.loads(line) for line in test["input"].split("\\n")])
        if isinstance(result, tuple):
            result = list(result)
        return result == json.loads(test["output"])
'''


def read_lcb(path: str) -> list[dict]:
    """Rows as {id, category, question, starter, fn_name, public, private}; the test data stay
    text (the private tests may be pickled: only the jail decodes them)."""
    from stages.records import RecordError

    rows = []
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        for key in REQUIRED:
            if not isinstance(row.get(key), str):
                raise RecordError(f"field '{key}': expected LiveCodeBench's text", where)
        metadata = row.get("metadata") or "{}"
        try:
            metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        except ValueError:
            raise RecordError("field 'metadata': not JSON", where) from None
        rows.append({"id": str(row.get("question_id") or lineno),
                     "category": str(row.get("difficulty") or ""),
                     "question": row["question_content"],
                     "starter": str(row.get("starter_code") or ""),
                     "fn_name": (metadata or {}).get("func_name") or None,
                     "public": row["public_test_cases"], "private": row["private_test_cases"]})
    return rows


def code_prompt(row: dict, cfg: Config) -> list[dict]:
    from stages import prompts

    if row["starter"]:
        form = ("Complete this starter code; the tests call its method directly:\n"
                f"```python\n{row['starter']}\n```")
    else:
        form = ("Read the input from standard input and print the answer to standard output; "
                "each test runs the whole program once.")
    return [{"role": "user", "content": prompts.render(
        "eval_code", cfg.prompts_dir, question=row["question"], format=form)}]


def program_of(text: str) -> str | None:
    """The last fenced code block of a reply, or None."""
    blocks = FENCE.findall(text)
    return blocks[-1] if blocks else None


def check_program(row: dict, program: str, sandbox: Any) -> dict[str, Any]:
    """Run one program on a problem's tests in a fresh jailed worker: {passed, tests, verdict}."""
    from sandbox.jail import Worker

    source = HARNESS.format(program=repr(program), public=repr(row["public"]),
                            private=repr(row["private"]), fn_name=repr(row["fn_name"]))
    with Worker(sandbox) as worker:
        for op, fields in (("load", {"source": source}), ("reset", {})):
            reply = worker.call(op, **fields)
            if not reply.ok:
                return {"passed": False, "tests": 0, "verdict": _verdict(op, reply)}
        total = reply.result[1].get("tests", 0)
        for index in range(total):
            reply = worker.call("step", action=str(index))
            if not reply.ok:
                return {"passed": False, "tests": index, "verdict": _verdict("test", reply)}
            if reply.result[1] < 1:
                return {"passed": False, "tests": index, "verdict": f"wrong answer on test "
                                                                    f"{index}"}
    return {"passed": True, "tests": total, "verdict": "accepted"}


def _verdict(stage: str, reply: Any) -> str:
    error = reply.error or {}
    return f"{stage}: {reply.outcome} {error.get('type', '')}: {error.get('msg', '')}"[:300]


def lcb_sandbox(cfg: Config) -> Any:
    from dataclasses import replace

    from sandbox.jail import Limits, Sandbox

    base = cfg.rollout.sandbox if cfg.rollout is not None else Sandbox()
    return replace(base, limits=Limits(call_timeout=LCB_TEST_TIMEOUT, memory_mb=LCB_MEMORY_MB,
                                       lifetime=3600, cpu_seconds=3600, pids=32))


def run_lcb(rows: list[dict], backend: Backend, cfg: Config, stats: Any = None
            ) -> Iterator[Eval]:
    episodes = cfg.n_episodes
    kept = limited(rows, cfg)
    completions = iter(Chat(backend, cfg)([code_prompt(row, cfg) for row in kept
                                           for _ in range(episodes)]))
    sandbox = lcb_sandbox(cfg)
    no_code = {"passed": False, "tests": 0, "verdict": "no code block"}
    with ThreadPoolExecutor(max_workers=LCB_WORKERS) as pool:
        checks = [[pool.submit(check_program, row, program, sandbox) if program else None
                   for program in (program_of(next(completions).text) for _ in range(episodes))]
                  for row in kept]
        for row, row_checks in zip(kept, checks):
            verdicts = [check.result() if check else no_code for check in row_checks]
            for verdict in verdicts:
                _count(stats, "accepted" if verdict["passed"] else "rejected")
            yield item(cfg, row["id"], row["category"],
                       [float(v["passed"]) for v in verdicts], backend.policy,
                       {"verdicts": [v["verdict"] for v in verdicts],
                        "tests_passed": [v["tests"] for v in verdicts]})
