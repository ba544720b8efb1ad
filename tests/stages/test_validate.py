"""validate: every broken or gaming fixture is rejected by its own check; every valid fixture and
the seed library pass; validation seeds are fresh, recorded and replayable."""

import random
import re
from pathlib import Path

import pytest

from stages import seed_library
from stages import validate as stage
from stages.records import Design, Env, Validation, dumps
from stages.shards import Stats, read

FIXTURES = Path(__file__).parent.parent / "fixtures" / "validate"
BROKEN = FIXTURES / "broken"
VALID = FIXTURES / "valid"
OLD_FIXED_SEEDS = {0, 1, 2, 3, 5, 7, 42, 123}


def expected_check(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' line"
    return first.split(":", 1)[1].strip()


def design_for(path: Path) -> Design:
    if path.suffix == ".txt":  # a model answer, not a source file
        text = path.read_text()
        cut = "# finish_reason: length" in text.splitlines()[:3]  # the designer ran out of tokens
        return Design(completion=text, meta={"finish_reason": "length"} if cut else {})
    return stage.designs_from_files([path])[0]


@pytest.mark.parametrize("path", sorted(BROKEN.iterdir()), ids=lambda p: p.name)
def test_each_broken_fixture_fails_its_own_check(path, nsjail_ok):
    record = stage.validate_one(design_for(path), stage.Config())
    assert isinstance(record, Validation), f"{path.name} was accepted"
    assert record.check == expected_check(path), record.error.msg
    assert record.error.type == record.check and record.error.msg
    assert record.ok is False
    # the env's own exception is recorded as such, whichever check met it (repairs say so)
    raised = re.match(r"(\w+) raised (\w+)", record.error.msg)
    assert record.meta["validation"].get("raised") == (
        {"op": raised[1], "type": raised[2]} if raised else None)


@pytest.mark.parametrize("path", sorted(VALID.glob("*.py")), ids=lambda p: p.name)
def test_each_valid_fixture_is_accepted(path, nsjail_ok):
    record = stage.validate_one(design_for(path), stage.Config())
    assert isinstance(record, Env), f"{record.check}: {record.error.msg}"


REFERENCE = FIXTURES / "reference"
WITHOUT_SOLUTION = {"code_lock.py", "vault_keys.py"}  # the reference's multi-turn game template


@pytest.mark.parametrize("path", sorted(REFERENCE.glob("*.py")), ids=lambda p: p.name)
def test_each_reference_format_fixture_is_accepted_and_says_when_no_oracle_ran(
        path, nsjail_ok):
    record = stage.validate_one(design_for(path), stage.Config())
    assert isinstance(record, Env), f"{record.check}: {record.error.msg}"
    assert record.meta.get("oracle") == ("none" if path.name in WITHOUT_SOLUTION else None)


def test_reference_corpus_follows_both_templates_where_they_differ_from_ours():
    sources = {path.name: path.read_text() for path in REFERENCE.glob("*.py")}
    tool_use = {name for name, source in sources.items() if "(ToolUseBaseEnv)" in source}
    assert len(tool_use) >= 4 and len(sources) - len(tool_use) >= 4
    assert all("def reset" in sources[n] and "def setup" not in sources[n] and
               "self._tools = " in sources[n] for n in tool_use)
    assert sum("self._message_criteria = " in sources[n] for n in tool_use) >= 3
    games = set(sources) - tool_use
    assert all("def __init__(self, max_turns=" in sources[name] for name in games)
    assert sum("from math_verify import parse, verify" in s for s in sources.values()) >= 3
    assert {name for name, source in sources.items() if "def solution" not in source} == \
        WITHOUT_SOLUTION
    assert any("import" not in source.split('"""', 2)[2] for source in sources.values())


def test_valid_corpus_is_varied_and_says_what_each_env_is():
    paths = sorted(VALID.glob("*.py"))
    assert len(paths) >= 20
    for path in paths:
        first = path.read_text().splitlines()[0]
        assert first.startswith('"""Valid: '), f"{path.name} lacks its docstring line"
    sources = "\n".join(path.read_text() for path in paths)
    for module in ("datetime", "hashlib", "uuid", "time", "sys", "json", "re", "collections",
                   "itertools"):
        assert f"import {module}\n" in sources, module


def test_every_check_has_a_broken_fixture():
    from sandbox.contract import CHECKS

    covered = {expected_check(path) for path in BROKEN.iterdir()}
    assert covered == set(CHECKS)


def test_seed_library_passes_and_covers_every_skill(nsjail_ok):
    from stages.skills import GAME_SKILLS

    designs = seed_library.designs()
    records = list(stage.run(designs, stage.Config(), Stats()))
    rejects = [(r.check, r.error.msg) for r in records if isinstance(r, Validation)]
    assert rejects == []
    games = [r for r in records if r.domain == "game"]
    tools = [r for r in records if r.domain == "tool_use"]
    assert len(games) >= 8 and len(tools) >= 4
    assert {r.skill for r in games} == set(GAME_SKILLS)
    assert all(r.tools for r in tools)
    assert [r.parents for r in records] == [[d.id] for d in designs]


def test_shipped_env_shard_matches_what_validate_produces(nsjail_ok):
    shipped = list(read([str(seed_library.ENV_SHARD)]))
    fresh = list(stage.run(seed_library.designs(), stage.Config(seed=0), Stats()))
    assert [dumps(r) for r in shipped] == [dumps(r) for r in fresh], \
        "stages/seed_library/envs.jsonl is stale: run `just seeds`"


def test_answer_with_prose_around_the_code_is_extracted(nsjail_ok):
    source = seed_library.files("game")[0].read_text()
    answer = f"Here is my environment.\n\n```python\n{source}```\nIt is fun."
    record = stage.validate_one(Design(completion=answer, skill="x"), stage.Config())
    assert isinstance(record, Env) and record.source.strip() == source.strip()


def test_domain_mismatch_is_a_structure_reject(nsjail_ok):
    source = seed_library.files("game")[0].read_text()
    design = Design(domain="tool_use", completion=f"```python\n{source}```")
    record = stage.validate_one(design, stage.Config())
    assert isinstance(record, Validation) and record.check == "structure"
    assert "asked for a tool_use env" in record.error.msg


def test_output_is_in_input_order_with_more_designs_than_workers(nsjail_ok):
    designs = seed_library.designs()[:5]
    records = list(stage.run(designs, stage.Config(workers=2), Stats()))
    assert [r.parents[0] for r in records] == [d.id for d in designs]


def test_validation_seeds_are_fresh_recorded_and_replayable(nsjail_ok):
    design = design_for(BROKEN / "oracle.py")
    first, second = (stage.validate_one(design, stage.Config()) for _ in range(2))
    seeds = first.meta["validation"]["seeds"]
    assert len(set(seeds)) == len(seeds) == 5 and not OLD_FIXED_SEEDS & set(seeds)
    assert second.meta["validation"]["seeds"] != seeds
    assert str(seeds[0]) in first.error.msg  # the failing episode names its seed
    replay = stage.validate_one(design, stage.Config(seed=first.meta["validation"]["seed"]))
    assert dumps(replay) == dumps(first)


def coin_sides(seeds: list[int]) -> set[str]:
    """The sides valid/coin_call.py hides on these seeds (its one draw, redone here)."""
    return {random.Random(seed).choice(("heads", "tails")) for seed in seeds}


def test_a_two_answer_game_is_accepted_whatever_seeds_validate_it(nsjail_ok):
    """All five fresh seeds hide the same side one time in sixteen: the same first observation
    and solution on every seed, which alone must not reject a game whose answer is random."""
    design = design_for(VALID / "coin_call.py")
    bases = range(200)
    agreeing = [b for b in bases if len(coin_sides(stage.validation_seeds(b, design))) == 1]
    assert len(agreeing) >= 5  # 12 of these 200: the case is exercised
    checked = agreeing + [b for b in bases[::25] if b not in agreeing]
    for base in checked:
        record = stage.validate_one(design, stage.Config(seed=base))
        assert isinstance(record, Env), f"--seed {base}: {record.check}: {record.error.msg}"
        seeds = record.meta["validation"]["seeds"]
        assert seeds[:5] == stage.validation_seeds(base, design)
        if base in agreeing:  # spare seeds drawn until one hid the other side, and no further
            assert len(seeds) > 5 and len(coin_sides(seeds[:-1])) == 1
            assert len(coin_sides(seeds)) == 2
        else:
            assert len(seeds) == 5
        if base == agreeing[0]:  # replayed exactly, spare seeds included
            again = stage.validate_one(design, stage.Config(seed=base))
            assert dumps(again) == dumps(record)


def test_an_env_that_ignores_its_seed_is_rejected_after_every_spare_seed(nsjail_ok):
    from sandbox.contract import SPARE_SEEDS, VALIDATION_SEEDS

    record = stage.validate_one(design_for(BROKEN / "trivial_fixed_answer.py"), stage.Config())
    assert isinstance(record, Validation) and record.check == "trivial"
    seeds = record.meta["validation"]["seeds"]
    assert len(set(seeds)) == VALIDATION_SEEDS + SPARE_SEEDS
    assert f"all {len(seeds)} seeds give the same episode" in record.error.msg


def test_a_given_seed_makes_validation_reproducible_per_design():
    designs = seed_library.designs()[:2]
    assert stage.validation_seeds(7, designs[0]) == stage.validation_seeds(7, designs[0])
    assert stage.validation_seeds(7, designs[0]) != stage.validation_seeds(8, designs[0])
    assert stage.validation_seeds(7, designs[0]) != stage.validation_seeds(7, designs[1])


# -- trivial: what a model emits when it does not know (stages/trivial.py) ---------------------

def test_near_misses_change_only_the_final_answer_and_never_its_case():
    from stages.trivial import control, near_misses

    assert near_misses("\\boxed{50}") == {
        "number 1 -1": "\\boxed{49}", "number 1 +1": "\\boxed{51}",
        "number 1 -2%": "\\boxed{49.00}", "number 1 +2%": "\\boxed{51.00}"}
    assert near_misses("\\boxed{1.2}") == {"number 1 -1": "\\boxed{0.2}",
                                            "number 1 +1": "\\boxed{2.2}"}  # 2% < 0.1: none
    assert near_misses("\\boxed{-12.50}")["number 1 +2%"] == "\\boxed{-12.7500}"
    big = "9" * 40
    assert near_misses(f"\\boxed{{{big}}}")["number 1 +1"] == "\\boxed{1" + "0" * 40 + "}"
    assert near_misses("I go \\boxed{Paris}") == {"one letter changed": "I go \\boxed{Qaris}"}
    assert near_misses("\\boxed{zebra crossing}") == {
        "one letter changed": "\\boxed{zebra drossing}"}
    assert near_misses("<answer>Zed</answer>") == {"one letter changed": "<answer>Aed</answer>"}
    call = '<tool_call>{"name": "pay", "arguments": {"amount": 100}}</tool_call>'
    assert set(near_misses(call)) == {"number 1 -1", "number 1 +1", "number 1 -2%",
                                      "number 1 +2%"}  # numbers only: no letters in JSON
    assert near_misses("done") == {} and control("done") is None
    assert control(call) == '<tool_call>{"name": "zzz", "arguments": {}}</tool_call>'
    assert control("\\boxed{42}") == "\\boxed{zzz}"


def test_literals_are_short_action_like_deduplicated_and_capped():
    from stages.trivial import MAX_LITERALS, literals

    source = ('"""A long docstring that is prompt text, not an action."""\n'
              'X = ["a", "a", " b ", ".", "two words", "one two three four", "north"]\n')
    assert literals(source) == ["a", "b", "north", "two words"]  # shortest first
    crowded = source + "".join(f'Y{i} = "w{i:02d}"\n' for i in range(MAX_LITERALS))
    found = literals(crowded)
    assert len(found) == MAX_LITERALS and found[:3] == ["a", "b", "w00"]


def test_trivial_records_what_it_played_and_replays_exactly(nsjail_ok):
    design = design_for(VALID / "coin_call.py")
    first, again = (stage.validate_one(design, stage.Config(seed=3)) for _ in range(2))
    assert isinstance(first, Env) and dumps(first) == dumps(again)
    tally = first.meta["trivial"]
    assert tally["policies"] > 10 and tally["plays"] > tally["policies"] and not tally["capped"]
    assert all(re.fullmatch(r"\d+/\d+", count) for count in tally["wins"].values())


def test_chance_is_the_share_of_other_seeds_solutions_that_win(nsjail_ok):
    """A coin call's blind player wins the seeds that hid the side it remembers."""
    record = stage.validate_one(design_for(VALID / "coin_call.py"), stage.Config(seed=3))
    sides = [random.Random(seed).choice(("heads", "tails"))
             for seed in record.meta["validation"]["seeds"]]
    shares = [sum(other == side for j, other in enumerate(sides) if j != i) / (len(sides) - 1)
              for i, side in enumerate(sides)]
    assert record.meta["trivial"]["chance"] == round(sum(shares) / len(shares), 4)
    assert 0 < record.meta["trivial"]["chance"] < 1


def test_a_puzzle_whose_answer_differs_by_seed_is_at_chance_zero():
    shipped = {e.class_name: e for e in read([str(seed_library.ENV_SHARD)])}
    assert shipped["KeyDoorMazeEnv"].meta["trivial"]["chance"] == 0.0
    assert all(0 <= e.meta["trivial"]["chance"] < 0.5 for e in shipped.values())


@pytest.mark.parametrize("name, policy", [
    ("hack_tolerance_grader", "near misses"), ("hack_prose_pays", "plain prose"),
    ("hack_unknown_pays", '"I don\'t know"'), ("hack_secret_word", "\\boxed{xyzzy}"),
    ("hack_last_turn_pays", "\\boxed{0} every turn"), ("hack_short_unboxed_pays", "plain prose"),
    ("hack_fuzzy_word_grader", "one letter changed")])
def test_a_reward_hack_is_a_trivial_reject_naming_its_policy(name, policy, nsjail_ok):
    path = Path(__file__).parents[1] / "adversarial" / "programs" / f"{name}.py"
    record = stage.validate_one(design_for(path), stage.Config(seed=0))
    assert isinstance(record, Validation) and record.check == "trivial", record
    assert policy in record.error.msg and "of 5 seeds" in record.error.msg
    assert record.meta["trivial"]["wins"]


PROGRAMS = Path(__file__).parents[1] / "adversarial" / "programs"


def test_an_env_that_runs_trivial_out_of_time_is_rejected_naming_the_cap(nsjail_ok):
    """Slow only once its jail has taken 300 steps: the contract's checks pass, trivial's time
    cap (a third of a 6 s lifetime) comes before the literal that wins every seed. Accepted on
    the policies played so far, it would pay that backdoor."""
    from sandbox.jail import Limits, Sandbox

    sandbox = Sandbox(limits=Limits(call_timeout=2, lifetime=6, cpu_seconds=6))
    record = stage.validate_one(design_for(PROGRAMS / "slow_trivial_backdoor.py"),
                                stage.Config(seed=0, sandbox=sandbox))
    assert isinstance(record, Validation), "accepted on a partial trivial"
    assert (record.check, record.outcome) == ("resources", "timeout")
    assert re.fullmatch(r"trivial stopped at its 2 s cap after \d+ of at most \d+ plays "
                        r"\(\d+ steps\): an env must let every check finish; make every step "
                        r"take milliseconds", record.error.msg), record.error.msg
    assert record.meta["trivial"]["capped"] == "time"


@pytest.mark.parametrize("cap, limit, name", [("MAX_STEPS_PER_SEED", 10, "50-step cap"),
                                              ("MAX_PLAYS_PER_SEED", 4, "20-play cap")])
def test_trivial_stopped_by_its_step_or_play_cap_rejects_the_env(cap, limit, name, monkeypatch,
                                                                 nsjail_ok):
    """Caps per seed (five seeds here), shrunk so a fair env reaches them: never accepted."""
    from stages import trivial

    monkeypatch.setattr(trivial, cap, limit)
    record = stage.validate_one(design_for(VALID / "coin_call.py"), stage.Config(seed=3))
    assert isinstance(record, Validation) and record.check == "trivial", record
    assert record.error.msg.startswith(f"trivial stopped at its {name} after ")
    assert record.meta["trivial"]["capped"] == cap.split("_")[1].lower()


def test_a_solution_action_no_reply_carries_fails_the_oracle_naming_it(nsjail_ok):
    """"\\boxed{\\frac{1}{2}}" in an ordinary literal holds a form feed: only solution() can
    send it; written raw, the same env is accepted."""
    path = BROKEN / "oracle_control_char.py"
    record = stage.validate_one(design_for(path), stage.Config(seed=0))
    assert isinstance(record, Validation) and record.check == "oracle"
    assert "action 1" in record.error.msg and 'form feed ("\\f")' in record.error.msg
    assert 'r"\\boxed{...}"' in record.error.msg
    raw = path.read_text().replace('self.answer = "\\\\boxed{\\frac',
                                   'self.answer = r"\\boxed{\\frac')
    assert raw != path.read_text()
    fixed = stage.designs_from_files([path])[0]
    record = stage.validate_one(Design(completion=raw, domain=fixed.domain, skill=fixed.skill,
                                       meta=fixed.meta), stage.Config(seed=0))
    assert isinstance(record, Env), f"{record.check}: {record.error.msg}"


def test_an_ordinary_boxed_literal_is_mended_and_the_mend_recorded(nsjail_ok):
    """The coder's "\\boxed{open 3}": a backspace nobody means, mended to a backslash."""
    record = stage.validate_one(design_for(VALID / "chests_boxed_backspace.py"),
                                stage.Config(seed=0))
    assert isinstance(record, Env), f"{record.check}: {record.error.msg}"
    assert record.meta["validation"]["mended_boxed_escapes"] == 1
    assert 'self.answer = "\\\\boxed{open %d}"' in record.source


def test_a_design_cut_at_max_tokens_is_truncated_only_when_its_code_breaks(nsjail_ok):
    cut = Design(completion=(BROKEN / "truncated.txt").read_text(),
                 meta={"finish_reason": "length"})
    record = stage.validate_one(cut, stage.Config(seed=0))
    assert record.check == "truncated" and "--max-tokens" in record.error.msg
    assert "parse" in record.error.msg
    uncut = Design(completion=cut.completion)
    assert stage.validate_one(uncut, stage.Config(seed=0)).check == "parse"
    looped = Design(completion=cut.completion, meta={"finish_reason": "repetition"})
    record = stage.validate_one(looped, stage.Config(seed=0))
    assert record.check == "truncated" and "repeating the same text" in record.error.msg
    example = Path(__file__).parents[2] / "docs" / "examples" / "guess_number.py"
    whole = Design(completion=f"```python\n{example.read_text()}```",
                   meta={"finish_reason": "length"})
    assert isinstance(stage.validate_one(whole, stage.Config(seed=0)), Env)


TAGGED_SOLUTION = '''        return [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                for n, a in self._plan] + ["<answer>done</answer>"]'''


def test_a_tool_use_solution_built_with_call_and_finish_is_accepted(nsjail_ok):
    """The base class writes the action text, so a designer never types `<tool_call>`."""
    source = next(p for p in seed_library.files("tool_use")
                  if p.name == "bank_transfers.py").read_text()
    assert TAGGED_SOLUTION in source
    untagged = source.replace(TAGGED_SOLUTION, "        return [self.call(n, **a) for n, a in "
                                               "self._plan] + [self.finish()]")
    helper_overridden = untagged.replace("    def solution(self):", "    def call(self, n, **a):\n"
                                         "        return 'win'\n\n    def solution(self):")
    designs = [Design(domain="tool_use", skill="tool_selection", completion=f"```python\n{s}```")
               for s in (untagged, helper_overridden)]
    accepted, rejected = stage.run(designs, stage.Config(), Stats())
    assert accepted.kind == "env" and "<tool_call>" not in accepted.source
    assert rejected.check == "structure" and "call" in rejected.error.msg


def test_a_tool_use_env_gets_its_tools_from_its_methods_and_literal_without_an_import(nsjail_ok):
    """The prompt's sketch annotates a choice with `Literal`; a designer that drops the import
    still loads, and the agent's tools come from the methods' signatures."""
    example = (Path(__file__).parents[2] / "docs" / "examples" / "todo_list.py").read_text()
    unimported = example.replace("from typing import Literal\n", "")
    assert "Literal[" in unimported and "import Literal" not in unimported
    record = stage.validate_one(Design(domain="tool_use", completion=f"```python\n{unimported}```"),
                                stage.Config(seed=0))
    assert isinstance(record, Env), f"{record.check}: {record.error.msg}"
    add_task = next(t["function"] for t in record.tools if t["function"]["name"] == "add_task")
    assert add_task["parameters"]["properties"]["priority"] == {
        "type": "string", "enum": ["low", "normal", "high"]}
    assert add_task["parameters"]["required"] == ["name"]


def prompt_showing(*examples) -> str:
    """A design prompt whose memory shows these envs, as the design stage writes it."""
    from stages import memory

    good, _ = memory.describe(memory.seed(examples), [])
    return f"Write a new game.\n\n## Environments from earlier rounds\n{good}\nAnswer."


def test_a_design_that_repeats_an_example_of_its_prompt_is_a_copy_reject(nsjail_ok):
    shown = [e for e in read([str(seed_library.EXAMPLES_SHARD)]) if e.domain == "game"][:2]
    renamed = shown[1].source.replace(shown[1].class_name, "MyOwnEnv").replace("5", "6")
    asked = prompt_showing(*shown)
    conversation = [{"role": "user", "content": asked}, {"role": "assistant", "content": "..."},
                    {"role": "user", "content": "Your module was rejected: fix it."}]
    fresh, repair = (stage.validate_one(Design(completion=f"```python\n{renamed}```",
                                               prompt=prompt), stage.Config(seed=0))
                     for prompt in (asked, conversation))
    assert fresh.check == repair.check == "copy"  # a repair that copies is no repair either
    record = fresh
    assert re.fullmatch(r"\d+ of the module's \d+ lines are lines of Example 2 of the prompt: "
                        r"the examples show how an env is built, design a new game of your own",
                        record.error.msg)


def test_a_design_of_its_own_beside_examples_is_accepted(nsjail_ok):
    shown = [e for e in read([str(seed_library.EXAMPLES_SHARD)]) if e.domain == "game"][:2]
    own = seed_library.files("game")[0].read_text()
    record = stage.validate_one(Design(completion=f"```python\n{own}```",
                                       prompt=prompt_showing(*shown)), stage.Config(seed=0))
    assert isinstance(record, Env), record.error
