"""eval: CI math, roll-ups, and each suite scored right and wrong by scripted policies."""

import ast
import importlib
import inspect
import json
from pathlib import Path

import pytest

from stages import evaluate as ev
from stages.backends import Sampling
from stages.backends.scripted import ScriptedBackend
from stages.evaluate import rg as ev_rg
from stages.records import Eval, Failure

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"


def scripted(text):
    return ScriptedBackend(lambda messages, tools: text)


# -- confidence intervals and roll-ups -------------------------------------------------------
def test_wilson_on_known_values():
    assert ev.wilson(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert ev.wilson(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    assert ev.wilson(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-4)
    assert ev.wilson(1, 1) == pytest.approx((0.20654, 1.0), abs=1e-4)


def test_normal_interval_of_the_mean():
    # mean 0.4, sample sd 0.2, n 3: half width 1.96 * 0.2 / sqrt(3) = 0.22632
    assert ev.normal_interval([0.2, 0.4, 0.6]) == pytest.approx((0.17368, 0.62632), abs=1e-4)
    assert ev.normal_interval([0.0, 0.5, 1.0]) == (0.0, 1.0)  # clipped
    assert ev.normal_interval([0.3]) == (None, None)


def test_interval_picks_wilson_for_binary_values():
    assert ev.interval([1.0, 0.0] * 5) == ev.wilson(5, 10)
    assert ev.interval([0.5, 0.5]) == (0.5, 0.5)
    assert ev.interval([]) == (None, None)


def test_rollups_per_category_and_overall():
    items = [Eval(suite="s", task=t, category=c, score=v, samples=2)
             for t, c, v in (("a", "X", 1.0), ("b", "X", 0.0), ("c", "Y", 1.0))]
    broken = Eval(suite="s", task="d", category="Y", ok=False, error=Failure(type="t", msg="m"))
    x, y, overall = ev.rollups(items + [broken], "s", 3, "pol")
    assert (x.category, x.score, x.samples, x.task) == ("X", 0.5, 2, "")
    assert (x.ci_low, x.ci_high) == ev.wilson(1, 2)
    assert (y.category, y.score, y.samples) == ("Y", 1.0, 1)
    assert overall.category == ev.OVERALL and overall.samples == 3
    assert overall.score == pytest.approx(2 / 3) and overall.details["macro"] == 0.75
    assert overall.details["episodes"] == 6 and overall.round == 3 and overall.policy == "pol"
    assert overall.parents == [r.id for r in items]


# -- Reasoning-Gym ----------------------------------------------------------------------------
def test_rg_hard_roster_and_categories():
    rg = pytest.importorskip("reasoning_gym")
    from reasoning_gym.factory import DATASETS

    counts = {c: sum(t.category == c for t in ev.RG_HARD) for c in ev_rg._RG_TABLE}
    assert counts == {"Math": 31, "Algorithmic": 36, "Cognition": 24, "Logic": 9}
    assert len({t.id for t in ev.RG_HARD}) == 100
    for task in ev.RG_HARD:
        module = DATASETS[task.dataset][0].__module__.split(".")[1]
        assert ev.MODULE_CATEGORY[module] == task.category, task.dataset
    quick = ev.rg_tasks("rg-quick")
    assert len(quick) == 8 and {t.category for t in quick} == set(counts)
    assert [t.category for t in ev.rg_tasks("rg-hard", limit=1)] == list(counts)
    assert rg.create_dataset("gcd", size=1, seed=0, **quick[1].params)[0]["answer"]


def rg_gold(tasks, cfg):
    import reasoning_gym

    gold = {}
    for task in tasks:
        data = reasoning_gym.create_dataset(task.dataset, size=cfg.n_episodes,
                                            seed=ev.rg_seed(task, cfg.seed), **task.params)
        for i in range(cfg.n_episodes):
            gold[data[i]["question"].strip()] = data[i]["answer"]
    return gold


def test_rg_correct_answers_score_one_and_wrong_ones_zero():
    pytest.importorskip("reasoning_gym")
    tasks = [t for t in ev.RG_HARD if t.dataset in ("chain_sum", "mini_sudoku")]
    cfg = ev.Config(suite="rg-quick", episodes=2, batch_size=3)
    gold = rg_gold(tasks, cfg)

    def solve(messages, tools):
        question = messages[-1]["content"].split("Problem:\n", 1)[1].strip()
        return f"Thinking...\n\\boxed{{{gold[question]}}}"

    right = list(ev.run_rg(tasks, ScriptedBackend(solve), cfg))
    assert [(r.task, r.category, r.score, r.samples) for r in right] == [
        ("chain_sum-hard", "Math", 1.0, 2), ("mini_sudoku-hard", "Cognition", 1.0, 2)]
    assert right[0].details["answered"] == 2 and right[0].ci_low == pytest.approx(0.3424, abs=1e-4)
    wrong = list(ev.run_rg(tasks, scripted("\\boxed{-1}"), cfg))
    silent = list(ev.run_rg(tasks, scripted("no box"), cfg))
    assert [r.score for r in wrong + silent] == [0.0] * 4
    assert silent[0].details["answered"] == 0


def test_rg_scorers_never_eval_model_text_and_hangs_time_out(tmp_path):
    pytest.importorskip("reasoning_gym")
    marker = tmp_path / "pwned"
    attack = f"__import__('os').system('touch {marker}')"
    assert not ev.safe_for_scorer("countdown", attack)
    assert not ev.safe_for_scorer("simple_integration", "exec(chr(49))")
    assert ev.safe_for_scorer("simple_integration", "x**3/3 + 2*sin(x) + e**x + C")
    assert not ev.safe_for_scorer("countdown", "x.__class__")
    task = next(t for t in ev.RG_HARD if t.dataset == "string_insertion")
    cfg = ev.Config(suite="rg-quick", episodes=1)
    assert list(ev.run_rg([task], scripted(f"\\boxed{{{attack}}}"), cfg))[0].score == 0.0
    assert not marker.exists()  # string_insertion's eval() is literal-only in the helper
    countdown = next(t for t in ev.RG_HARD if t.dataset == "countdown")
    slow = ev.Config(suite="rg-quick", episodes=1, call_timeout=1.0)
    record = next(ev.run_rg([countdown], scripted("\\boxed{9**9**9**9}"), slow))
    assert record.score == 0.0 and record.details["timeouts"] == 1


def test_rg_quick_end_to_end_with_the_tiny_model(tiny_backend):
    pytest.importorskip("reasoning_gym")
    cfg = ev.Config(suite="rg-quick", episodes=1, sampling=Sampling(temperature=0.0,
                                                                      max_tokens=8))
    records = list(ev.run(tiny_backend, cfg))
    assert len(records) == 8 + 5 and all(r.ok for r in records)
    assert all(0.0 <= r.score <= 1.0 and r.policy == tiny_backend.policy for r in records)
    assert records[-1].category == ev.OVERALL and records[-1].samples == 8


# -- BFCL v4 multi-turn -----------------------------------------------------------------------
def replay_ground_truth(entries):
    """A policy that sends each turn's possible-answer calls as <tool_call>s, then stops."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    plans = {}
    for _, entry, truth in entries:
        params = {}
        for name in entry["involved_classes"]:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
            for method, fn in inspect.getmembers(cls, inspect.isfunction):
                params[method] = [p for p in inspect.signature(fn).parameters if p != "self"]
        turns = []
        for calls in truth:
            turn = []
            for call in calls:
                node = ast.parse(call, mode="eval").body
                arguments = {params[node.func.id][i]: ast.literal_eval(a)
                             for i, a in enumerate(node.args)}
                arguments.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
                turn.append({"name": node.func.id, "arguments": arguments})
            turns.append(turn)
        plans[json.dumps(entry["question"][0])] = turns

    def respond(messages, tools):
        plan = plans[json.dumps(messages[1:2])]
        turn = sum(m["role"] == "user" for m in messages) - 1
        if messages[-1]["role"] == "user" and plan[turn]:
            return "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in plan[turn])
        return "All done."

    return ScriptedBackend(respond)


def test_bfcl_replayed_answers_score_one_and_silence_zero():
    pytest.importorskip("bfcl_eval")
    entries = ev.bfcl_entries(["base"], limit=2)
    assert [e["id"] for _, e, _ in entries] == ["multi_turn_base_0", "multi_turn_base_1"]
    cfg = ev.Config(suite="bfcl-mt", limit=2, categories=("base",))
    right = list(ev.run(replay_ground_truth(entries), cfg))
    assert [(r.task, r.category, r.score) for r in right] == [
        ("multi_turn_base_0", "base", 1.0), ("multi_turn_base_1", "base", 1.0),
        ("", "base", 1.0), ("", ev.OVERALL, 1.0)]
    assert right[0].details["calls"] > 0 and right[0].details["errors"] == []
    silent = list(ev.run(scripted("I would rather not."), cfg))
    assert [r.score for r in silent] == [0.0] * 4
    assert silent[0].details["errors"] == ["multi_turn:empty_turn_model_response"]


def test_bfcl_calls_outside_the_apis_never_run(tmp_path):
    pytest.importorskip("bfcl_eval")
    target = tmp_path / "clobbered"
    call = {"name": "open", "arguments": {"file": str(target), "mode": "w"}}
    seen = []

    def respond(messages, tools):
        seen[:] = messages
        if messages[-1]["role"] == "tool":
            return "ok"
        return f"<tool_call>{json.dumps(call)}</tool_call><tool_call>{{bad json</tool_call>"

    cfg = ev.Config(suite="bfcl-mt", limit=1, categories=("base",))
    record = next(ev.run(ScriptedBackend(respond), cfg))
    assert not target.exists() and record.score == 0.0
    replies = [m["content"] for m in seen if m["role"] == "tool"]
    assert any("name 'open' is not defined" in r for r in replies)
    assert any("could not read the tool call" in r for r in replies)
    assert record.details["rejected"] > 0 and record.details["calls"] == 0


def test_tool_call_parsing_and_call_strings():
    calls, errors = ev.parse_tool_calls(
        '<tool_call>{"name": "cd", "arguments": {"folder": "a"}}</tool_call> and '
        '<tool_call>{"name": "mv", "arguments": "{\\"source\\": \\"x\\"}"}</tool_call>'
        "<tool_call>[1]</tool_call>")
    assert calls == [("cd", {"folder": "a"}), ("mv", {"source": "x"})] and len(errors) == 1
    assert ev.call_string("mean", {"numbers": [1, 2.5], "flag": True, "s": "it's"}) == \
        "mean(numbers=[1, 2.5],flag=True,s=\"it's\")"
    tool = ev.openai_tool({"name": "f", "description": "d", "response": {},
                           "parameters": {"type": "dict", "properties": {
                               "a": {"type": "float"}, "b": {"type": "tuple",
                                                             "items": {"type": "integer"}}}}},
                          {"float": "number", "tuple": "array", "integer": "integer"})
    assert tool["function"]["parameters"] == {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "array", "items": {"type": "integer"}}}}


# -- env shards -------------------------------------------------------------------------------
def test_envs_success_rate_per_env(jail_available):
    from stages import seed_library
    from stages.rollout import play_seed
    from stages.shards import read

    env = next(e for e in read([str(seed_library.ENV_SHARD)])
               if e.class_name == "RiverCrossingEnv")
    cfg = ev.Config(suite="envs", episodes=2, round=1, seed=5)
    namespace = {}
    exec(env.source, namespace)  # trusted seed-library code: precompute each play's solution
    solutions = {}
    for play in range(2):
        game = namespace[env.class_name]()
        observation, _ = game.reset(seed=play_seed(env.id, False, play, 1, 5))
        solutions[observation] = game.solution()

    def solve(messages, tools):
        plan = next(s for o, s in solutions.items() if o in messages[0]["content"])
        return plan[sum(m["role"] == "assistant" for m in messages)]

    right = list(ev.run(ScriptedBackend(solve), cfg, envs=[env]))
    assert [(r.task, r.category, r.score, r.samples) for r in right] == [
        (env.id, env.skill, 1.0, 2), ("", env.skill, 1.0, 1), ("", ev.OVERALL, 1.0, 1)]
    assert right[0].parents == [env.id] and right[0].round == 1
    wrong = list(ev.run(scripted("\\boxed{swim}"), cfg, envs=[env]))
    assert [r.score for r in wrong] == [0.0] * 3


# -- a local question/answer file -------------------------------------------------------------
QA = FIXTURES / "qa.jsonl"
RIGHT = {"What is 2 + 3?": "\\boxed{5}", "Write one thousand in digits.": "\\boxed{1,000}",
         "What is one half as a decimal?": "so \\boxed{\\frac{1}{2}}",
         "Which option is a prime? (A) 4 (B) 7 (C) 9": "\\boxed{(B)}",
         "Name the capital of France.": "$\\boxed{\\text{paris}.}$"}


def answer_file(messages, tools):
    question = messages[-1]["content"].split("Problem:\n", 1)[1].strip()
    return RIGHT[question]


def test_file_suite_normalises_answers():
    cfg = ev.Config(suite="file", data=str(QA), episodes=2)
    records = list(ev.run(ScriptedBackend(answer_file), cfg))
    items = [r for r in records if r.task]
    assert [r.task for r in items] == ["sum", "thousand", "half", "choice", "capital"]
    assert all(r.score == 1.0 and r.suite == "qa" for r in records)
    assert [r.samples for r in records] == [2] * 5 + [2, 1, 2, 5]
    assert [r.category for r in records if not r.task] == ["arithmetic", "fractions", "choice",
                                                           ev.OVERALL]
    wrong = list(ev.run(scripted("\\boxed{7}"), ev.Config(suite="file", data=str(QA),
                                                          name="mine", limit=1)))
    assert [r.task for r in wrong if r.task] == ["sum", "half", "choice"]
    assert all(r.score == 0.0 and r.suite == "mine" for r in wrong)


def test_answer_matching():
    assert ev.answers_match("033", 33) and ev.answers_match("-\\dfrac{3}{4}", "-0.75")
    assert ev.answers_match("\\text{ B }", "(b)") and ev.answers_match("12,345", "12345")
    assert not ev.answers_match("0.333", "1/3") and not ev.answers_match(None, "1")
    assert not ev.answers_match("A", "B")


def test_file_errors(tmp_path):
    from stages.records import RecordError
    from stages.shards import InputMissing

    with pytest.raises(InputMissing):
        ev.read_questions(str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{"question": "q"}\n')
    with pytest.raises(RecordError, match=r"bad.jsonl:2: field 'answer'"):
        ev.read_questions(str(bad))
