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
def test_rg_hard_is_the_papers_a3_split_under_the_reference_protocol():
    counts = {c: sum(t.category == c for t in ev.RG_HARD)
              for c in ("Math", "Algorithmic", "Cognition", "Logic")}
    assert counts == {"Math": 31, "Algorithmic": 36, "Cognition": 24, "Logic": 9}
    assert len({t.id for t in ev.RG_HARD}) == 100
    params = {t.dataset: t.params for t in ev.RG_HARD}
    # a few A.3 rows as the reference's rg_a3_hard.py has them
    assert params["graph_color"] == {"max_num_vertices": 20, "min_num_vertices": 10,
                                     "num_colors": 4}
    assert params["rubiks_cube"] == {"cube_size": 5, "max_scramble_steps": 50,
                                     "min_scramble_steps": 25}
    assert params["syllogism"] == {"allow_all": True, "allow_no": True, "allow_some": False,
                                   "allow_some_not": False}
    assert params["acre"] == {} and params["arc_agi"]["rotations_weights"] == [
        0.15, 0.3, 0.25, 0.3]
    assert next(t.category for t in ev.RG_HARD if t.dataset == "shortest_path") == "Math"
    cfg = ev.Config(suite="rg-hard")
    assert cfg.n_episodes == 8 and ev.rg_seeds(cfg) == list(range(8))
    assert (cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.top_k,
            cfg.sampling.max_tokens) == (0.6, 0.8, 20, 8192)
    quick = ev.rg_tasks("rg-quick")
    assert len(quick) == 8 and {t.category for t in quick} == set(counts)
    assert [t.category for t in ev.rg_tasks("rg-hard", limit=1)] == list(counts)


@pytest.mark.slow
def test_every_rg_hard_config_builds_with_the_installed_package():
    pytest.importorskip("reasoning_gym")
    for task in ev.RG_HARD:
        assert len(ev.rg_dataset(task)) == 500, task.id


def test_rg_episode_i_draws_the_entry_the_reference_env_resets_to():
    pytest.importorskip("reasoning_gym")
    import reasoning_gym

    task = next(t for t in ev.RG_HARD if t.dataset == "chain_sum")
    data = reasoning_gym.create_dataset("chain_sum", size=500, seed=42, **task.params)
    # gem's reset(seed=0) seeds `random` with 0, then random.choice picks index 432 of 500
    assert ev.rg_instance(ev.rg_dataset(task), 0)["question"] == data[432]["question"]
    assert ev.rg_instance(ev.rg_dataset(task), 1)["question"] == data[68]["question"]


def test_final_answer_prefers_answer_tags_then_the_last_box():
    assert ev.final_answer("\\boxed{1} <answer> 2 </answer> <ANSWER>3</ANSWER> \\boxed{4}") == "3"
    assert ev.final_answer("so \\boxed{\\frac{1}{2}} or \\boxed{x^{2}}") == "x^{2}"
    assert ev.final_answer("<answer>\n[1, 2]\n</answer>") == "[1, 2]"
    assert ev.final_answer("no answer <answer>unclosed") is None


def rg_gold(tasks, cfg):
    gold = {}
    for task in tasks:
        data = ev.rg_dataset(task)
        for seed in ev.rg_seeds(cfg):
            entry = ev.rg_instance(data, seed)
            gold[entry["question"].strip()] = entry
    return gold


def question_of(messages):
    return messages[-1]["content"].split("Problem:\n", 1)[1].strip()


def test_rg_answers_in_tags_win_boxes_count_and_partial_credit_does_not():
    pytest.importorskip("reasoning_gym")
    tasks = [t for t in ev.RG_HARD if t.dataset in ("chain_sum", "mini_sudoku")]
    cfg = ev.Config(suite="rg-quick", episodes=2, batch_size=3)
    gold = rg_gold(tasks, cfg)

    def tagged(messages, tools):
        answer = gold[question_of(messages)]["answer"]
        return f"Thinking... \\boxed{{-1}}\n<answer>{answer}</answer>"

    right = list(ev.run_rg(tasks, ScriptedBackend(tagged), cfg))
    assert [(r.task, r.category, r.score, r.samples) for r in right] == [
        ("chain_sum-hard", "Math", 1.0, 2), ("mini_sudoku-hard", "Cognition", 1.0, 2)]
    assert right[0].details["answered"] == 2 and right[0].details["seeds"] == [0, 1]
    assert right[0].ci_low == pytest.approx(0.3424, abs=1e-4)
    boxed = list(ev.run_rg(tasks[:1], ScriptedBackend(
        lambda m, t: f"\\boxed{{{gold[question_of(m)]['answer']}}}"), cfg))
    assert boxed[0].score == 1.0
    wrong = list(ev.run_rg(tasks, scripted("<answer>-1</answer>"), cfg))
    silent = list(ev.run_rg(tasks, scripted("no answer"), cfg))
    assert [r.score for r in wrong + silent] == [0.0] * 4
    assert silent[0].details["answered"] == 0

    def one_wrong_cell(messages, tools):  # mini_sudoku gives partial credit: not a win
        grid = gold[question_of(messages)]["answer"]
        return f"<answer>{grid[:-1]}{'1' if grid[-1] != '1' else '2'}</answer>"

    partial = next(ev.run_rg(tasks[1:], ScriptedBackend(one_wrong_cell), cfg))
    assert partial.score == 0.0 and 0 < max(partial.details["rewards"]) < 1


def test_the_scorer_guard_passes_what_rg_scores_and_refuses_code():
    pytest.importorskip("reasoning_gym")
    import reasoning_gym

    answer = "6*Integral(x**2*cos(x), x) + C"
    entry = {"metadata": {"variable": "x", "integrand": "6*x**2*cos(x)"}}
    data = reasoning_gym.create_dataset("intermediate_integration", size=1, seed=0)
    assert data.score_answer(answer=answer, entry=entry) == 1.0  # RG's own verdict
    assert ev.safe_for_scorer("intermediate_integration", answer)
    for fine in ("x**3/3 + 2*sin(x) + E**x + C", "sqrt(x) - atan(x)/2 + pi*log(x) + C",
                 "(6 - 4) * 3 * 4", "abs(25*4 - 1)", "Rational(1, 3)*x**3"):
        assert ev.safe_for_scorer("intermediate_integration", fine), fine
    for attack in ("__import__('os').system('touch x')", "exec(chr(49))", "x.__class__",
                   "open(x)", "eval(x)", "x.subs", "lambdify(x, x)", "preview(x)",
                   "getattr(x, x)"):
        assert not ev.safe_for_scorer("countdown", attack), attack
    assert ev.safe_for_scorer("chain_sum", "open('x')")  # a scorer that never parses it


def test_rg_integration_answers_left_unevaluated_score_as_rg_scores_them():
    pytest.importorskip("reasoning_gym")
    task = next(t for t in ev.RG_HARD if t.dataset == "intermediate_integration")
    cfg = ev.Config(suite="rg-hard", episodes=1)
    gold = rg_gold([task], cfg)

    def unevaluated(messages, tools):
        meta = gold[question_of(messages)]["metadata"]
        return f"<answer>Integral({meta['integrand']}, {meta['variable']}) + C</answer>"

    record = next(ev.run_rg([task], ScriptedBackend(unevaluated), cfg))
    assert record.score == 1.0 and record.details["answers"][0].startswith("Integral(")


def test_rg_scorers_never_eval_model_text_and_hangs_time_out(tmp_path):
    pytest.importorskip("reasoning_gym")
    marker = tmp_path / "pwned"
    attack = f"__import__('os').system('touch {marker}')"
    task = next(t for t in ev.RG_HARD if t.dataset == "string_insertion")
    cfg = ev.Config(suite="rg-quick", episodes=1)
    assert list(ev.run_rg([task], scripted(f"<answer>{attack}</answer>"), cfg))[0].score == 0.0
    assert not marker.exists()  # string_insertion's eval() is literal-only in the helper
    countdown = next(t for t in ev.RG_HARD if t.dataset == "countdown")
    slow = ev.Config(suite="rg-quick", episodes=1, call_timeout=1.0)
    record = next(ev.run_rg([countdown], scripted("<answer>9**9**9**9</answer>"), slow))
    assert record.score == 0.0 and record.details["timeouts"] == 1


DRAW_QUESTIONS = """
import json
from stages import evaluate as ev
from stages.backends.scripted import ScriptedBackend
seen = []
tasks = [t for t in ev.RG_HARD if t.dataset in ("isomorphic_strings", "ransom_note")]
backend = ScriptedBackend(lambda messages, tools: seen.append(messages[-1]["content"]) or "")
list(ev.run_rg(tasks, backend, ev.Config(suite="rg-hard", episodes=1)))
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_rg_instances_do_not_depend_on_the_processes_hash_seed():
    pytest.importorskip("reasoning_gym")
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    runs = [subprocess.run([sys.executable, "-c", DRAW_QUESTIONS], cwd=root, check=True,
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONHASHSEED": seed})
            for seed in ("1", "2")]
    first, second = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert len(first) == 2 and first == second


def test_rg_quick_end_to_end_with_the_tiny_model(tiny_backend):
    pytest.importorskip("reasoning_gym")
    cfg = ev.Config(suite="rg-quick", episodes=1, sampling=Sampling(temperature=0.0,
                                                                      max_tokens=8))
    records = list(ev.run(tiny_backend, cfg))
    assert len(records) == 8 + 5 and all(r.ok for r in records)
    assert all(0.0 <= r.score <= 1.0 and r.policy == tiny_backend.policy for r in records)
    assert records[-1].category == ev.OVERALL and records[-1].samples == 8


# -- BFCL v4 multi-turn -----------------------------------------------------------------------
ENTRY_ID = "spade_test_entry_id"  # a key only this test's policy reads


@pytest.fixture
def entries_named(monkeypatch):
    """Each BFCL episode's system message carries its entry id, so a test policy can look up
    the entry it plays (first user messages repeat across entries and categories)."""
    opened = ev.BfclEpisode.__init__

    def init(self, order, category, entry, *rest):
        opened(self, order, category, entry, *rest)
        self.messages[0][ENTRY_ID] = entry["id"]

    monkeypatch.setattr(ev.BfclEpisode, "__init__", init)


def replay_ground_truth(entries):
    """A policy that sends each turn's possible-answer calls as <tool_call>s, then stops; plans
    are keyed by entry id."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    plans, turn_of = {}, {}
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
        plans[entry["id"]] = turns
        missed = {str(k) for k in entry.get("missed_function") or {}}
        users = 0  # user messages once a turn has started -> that turn
        for index, messages in enumerate(entry["question"]):
            users += 1 if str(index) in missed else sum(m["role"] == "user" for m in messages)
            turn_of[entry["id"], users] = index

    def respond(messages, tools):
        entry_id = messages[0][ENTRY_ID]
        turn = turn_of[entry_id, sum(m["role"] == "user" for m in messages)]
        if messages[-1]["role"] == "user" and plans[entry_id][turn]:
            return "".join(f"<tool_call>{json.dumps(c)}</tool_call>"
                           for c in plans[entry_id][turn])
        return "All done."

    return ScriptedBackend(respond)


def test_bfcl_replayed_answers_score_one_and_silence_zero(entries_named):
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


@pytest.mark.slow
def test_bfcl_replaying_the_ground_truth_passes_all_800_entries(entries_named):
    pytest.importorskip("bfcl_eval")
    entries = ev.bfcl_entries()
    assert len(entries) == 800 and len({e["id"] for _, e, _ in entries}) == 800
    records = list(ev.run(replay_ground_truth(entries), ev.Config(suite="bfcl-mt")))
    failed = [(r.task, r.details["errors"]) for r in records if r.task and r.score < 1.0]
    assert failed == [] and len([r for r in records if r.task]) == 800


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
def test_envs_success_rate_per_env(nsjail_ok):
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


# -- AIME, GPQA-Diamond, LiveCodeBench from local files ---------------------------------------
def test_aime_answers_are_checked_with_math_verify_in_both_file_forms():
    pytest.importorskip("math_verify")
    hf = ev.read_aime(str(FIXTURES / "aime.jsonl"))
    assert [(r["id"], r["answer"]) for r in hf] == [("2025-I-1", "9"), ("2025-I-2", "999")]
    reference = ev.read_aime(str(FIXTURES / "aime_prompt_label.jsonl"))
    assert reference[0]["answer"] == "9" and reference[0]["question"].startswith("Find 3")
    cfg = ev.Config(suite="aime", data=str(FIXTURES / "aime.jsonl"), episodes=2)
    assert cfg.n_episodes == 2 and ev.Config(suite="aime").n_episodes == 64
    # equal as numbers but not as text: exact match would score these 0
    worked = {"Find 3 squared.": "\\boxed{3^{2}}",
              "Find 10 cubed minus 1.": "<answer>10^3-1</answer>"}
    records = list(ev.run(ScriptedBackend(lambda m, t: worked[question_of(m)]), cfg))
    assert [(r.task, r.score) for r in records] == [("2025-I-1", 1.0), ("2025-I-2", 1.0),
                                                    ("", 1.0)]
    assert records[0].suite == "aime" and records[0].details["answers"] == ["3^{2}"] * 2
    wrong = list(ev.run(scripted("\\boxed{10}"), cfg))
    assert [r.score for r in wrong] == [0.0] * 3


def test_gpqa_shuffles_options_as_the_reference_and_reads_letters():
    rows = ev.read_gpqa(str(FIXTURES / "gpqa_diamond.csv"))
    # random.Random(42) through the rows: the right option lands on D, C, D
    assert [(r["id"], r["answer"], r["category"]) for r in rows] == [
        ("recA", "D", "Physics"), ("recB", "C", "Chemistry"), ("recC", "D", "Biology")]
    assert "\nD. -1" in rows[0]["question"] and "\nA. 0" in rows[0]["question"]
    assert ev.read_gpqa(str(FIXTURES / "gpqa_choices.jsonl"))[0]["answer"] == "C"
    right = {"-1": "D", "Carbon": "C", "Mitochondrion": "D", "Mercury": "C"}

    def choose(messages, tools):
        text = messages[-1]["content"]
        return f"The answer is ({next(v for k, v in right.items() if f'. {k}' in text)})."

    cfg = ev.Config(suite="gpqa", data=str(FIXTURES / "gpqa_diamond.csv"), episodes=2)
    records = list(ev.run(ScriptedBackend(choose), cfg))
    assert [r.score for r in records if r.task] == [1.0] * 3 and records[0].suite == "gpqa_diamond"
    assert [r.category for r in records if not r.task] == ["Physics", "Chemistry", "Biology",
                                                           ev.OVERALL]
    assert [r.score for r in ev.run(scripted("\\boxed{A}"), cfg) if r.task] == [0.0] * 3
    assert ev.choice_letter("so \\boxed{\\text{(b)}}") == "B"
    assert ev.choice_letter("Answer: C") == "C" and ev.choice_letter("maybe E") is None


LCB = FIXTURES / "lcb.jsonl"
PROGRAMS = {"Read two": "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)",
            "Read an integer": "n = int(input())\nprint(n / 2)",
            "Given an array": ("class Solution:\n    def twoSum(self, nums, target):\n"
                               "        seen = {}\n        for i, x in enumerate(nums):\n"
                               "            if target - x in seen:\n"
                               "                return (seen[target - x], i)\n"
                               "            seen[x] = i\n")}


def lcb_reply(programs):
    def reply(messages, tools):
        text = messages[-1]["content"]
        code = next(code for start, code in programs.items() if start in text)
        return f"Here it is:\n```python\n{code}\n```\n"
    return reply


def test_lcb_rows_keep_their_tests_undecoded():
    rows = ev.read_lcb(str(LCB))
    assert [(r["id"], r["category"], r["fn_name"]) for r in rows] == [
        ("abc001_a", "easy", None), ("abc002_b", "medium", None), ("3000", "hard", "twoSum")]
    assert not rows[0]["private"].startswith("[")  # base64(zlib(pickle)), decoded in the jail


def test_lcb_programs_pass_stdin_and_functional_tests_in_the_jail(nsjail_ok, monkeypatch):
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("the parent unpickled test data")

    monkeypatch.setattr(pickle, "loads", refuse)
    cfg = ev.Config(suite="lcb", data=str(LCB))
    assert (cfg.n_episodes, cfg.sampling.temperature, cfg.sampling.max_tokens) == (1, 0.2, 16384)
    records = list(ev.run(ScriptedBackend(lcb_reply(PROGRAMS)), cfg))
    assert [(r.task, r.score) for r in records if r.task] == [
        ("abc001_a", 1.0), ("abc002_b", 1.0), ("3000", 1.0)]
    assert records[0].details["verdicts"] == ["accepted"]
    assert records[0].details["tests_passed"] == [3]  # 1 public + 2 pickled private
    wrong = dict(PROGRAMS, **{"Read two": "print(3)", "Read an integer": "print('1.5 x')",
                              "Given an array": "class Solution:\n    def twoSum(self, n, t):\n"
                                                "        return [1, 0]"})
    failed = list(ev.run(ScriptedBackend(lcb_reply(wrong)), cfg))
    assert [r.score for r in failed if r.task] == [0.0] * 3
    assert failed[0].details["verdicts"] == ["wrong answer on test 1"]


def test_lcb_programs_stay_in_the_jail(nsjail_ok, tmp_path):
    marker = tmp_path / "escaped"
    hostile = {"Read two": f"open({str(marker)!r}, 'w').write('x')\nprint(3)",
               "Read an integer": "while True:\n    pass", "Given an array": "no code"}
    cfg = ev.Config(suite="lcb", data=str(LCB), limit=1)
    records = list(ev.run(ScriptedBackend(lcb_reply(hostile)), cfg))
    assert [r.score for r in records if r.task] == [0.0] * 3 and not marker.exists()
    assert "timeout" in records[1].details["verdicts"][0]


# -- comparing two runs -----------------------------------------------------------------------
def eval_items(suite, scores, category=""):
    return [Eval(suite=suite, task=f"t{i}", category=category, score=s, samples=1)
            for i, s in enumerate(scores)]


def test_compare_pairs_items_per_benchmark_with_bootstrap_intervals():
    base = (eval_items("aime2025", [0.0, 0.5, 1.0, 0.25]) + eval_items("rg-hard", [0, 0], "Math")
            + [Eval(suite="rg-hard", task="m2", category="Math", score=1.0, samples=1)])
    trained = (eval_items("aime2025", [0.25, 0.75, 1.0, 0.5])
               + eval_items("rg-hard", [1, 0], "Math")
               + eval_items("gpqa", [1.0]))
    aime, math_, average = ev.compare(base, trained)
    assert (aime.benchmark, aime.items, aime.base, aime.trained) == ("aime2025", 4, 0.4375,
                                                                     0.625)
    # differences 0.25, 0.25, 0, 0.25: resampled means lie in [0, 0.25]
    assert 0.0 <= aime.low < aime.difference < aime.high <= 0.25
    assert (math_.benchmark, math_.items, math_.unpaired) == ("rg-hard Math", 2, 1)
    assert average.benchmark == ev.AVERAGE and average.unpaired == 2
    assert average.base == pytest.approx((0.4375 + 0.0) / 2)
    assert average.trained == pytest.approx((0.625 + 0.5) / 2)
    assert average.low <= average.difference <= average.high
    assert ev.compare(base, trained) == [aime, math_, average]  # a fixed bootstrap seed
    same = ev.compare(eval_items("s", [0.5] * 3), eval_items("s", [0.75] * 3))[0]
    assert (same.low, same.high) == pytest.approx((0.25, 0.25))
    with pytest.raises(ValueError, match="no item is in both"):
        ev.compare(eval_items("a", [1.0]), eval_items("b", [1.0]))
