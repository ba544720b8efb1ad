"""scripts/mutation.sh: valid shell, and its helper's bookkeeping (equivalent list, scope,
summary line). Runs no mutant: mutation testing is not part of CI."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutation_helper", ROOT / "scripts" / "mutation.py")
mutation = importlib.util.module_from_spec(spec)
sys.modules.setdefault("mutation_helper", mutation)  # dataclasses look their module up
spec.loader.exec_module(mutation)


def test_the_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "mutation.sh")], check=True)


def test_every_target_is_a_module_and_its_mapped_tests_exist():
    for module in mutation.TARGETS:
        assert (ROOT / module).is_file(), module
        assert mutation.test_files(module), module  # at least one mapped test file exists


def test_the_mutation_extra_pins_the_tool():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'mutation = ["mutmut>=3.8,<4"]' in text


def test_the_equivalent_list_parses_and_every_entry_has_a_reason():
    listed = mutation.read_equivalents(mutation.EQUIVALENT.read_text())
    assert listed and all(reason for reason in listed.values())
    for name in listed:  # each names a mutant of a target module
        assert any(mutation.in_scope(name, m) for m in mutation.TARGETS), name


def test_an_entry_without_a_reason_is_refused():
    with pytest.raises(ValueError, match="no reason"):
        mutation.read_equivalents("# comment\n\nstages.rewards.x_clip__mutmut_1\n")
    assert mutation.read_equivalents("a.b.x_f__mutmut_1  why # not a comment\n") == {
        "a.b.x_f__mutmut_1": "why # not a comment"}


def test_scope_globs_cover_functions_and_methods():
    assert mutation.in_scope("stages.rewards.x_plateau__mutmut_3", "stages/rewards.py")
    assert mutation.in_scope("stages.train.grpo.x_token_loss__mutmut_1", "stages/train/grpo.py")
    samples = "stages/train/samples.py"
    assert mutation.in_scope("stages.train.samples.x\u01c1Sample\u01c1of_turn__mutmut_2", samples)
    loop = "stages/train/loop.py"
    assert mutation.in_scope("stages.train.loop.x_plan_steps__mutmut_1", loop)
    assert not mutation.in_scope("stages.train.loop.x_run__mutmut_1", loop)  # not loss code


def test_tally_counts_caught_mutants_and_leaves_equivalents_out_of_n():
    codes = {"stages.rewards.x_clip__mutmut_1": 1,     # killed
             "stages.rewards.x_clip__mutmut_2": 0,     # survived
             "stages.rewards.x_clip__mutmut_3": 36,    # timeout: caught
             "stages.rewards.x_clip__mutmut_4": 0,     # equivalent
             "stages.rewards.x_clip__mutmut_5": 33,    # no test reached it: a gap
             "stages.rewards.x_clip__mutmut_6": None}  # not checked: not killed
    equivalents = {"stages.rewards.x_clip__mutmut_4": "same value",
                   "stages.rewards.x_gone__mutmut_9": "renamed since"}
    t = mutation.tally("stages/rewards.py", codes, equivalents)
    assert (t.total, t.killed, t.equivalent, t.counted) == (6, 2, 1, 5)
    assert t.survivors == [("stages.rewards.x_clip__mutmut_2", "survived"),
                           ("stages.rewards.x_clip__mutmut_5", "no tests"),
                           ("stages.rewards.x_clip__mutmut_6", "not checked")]
    assert t.stale == ["stages.rewards.x_gone__mutmut_9"]
    assert mutation.summary_line([t]) == "mutation: 2/5 killed (1 equivalent)"


def test_an_equivalent_that_a_test_kills_is_reported():
    t = mutation.tally("stages/rewards.py", {"stages.rewards.x_clip__mutmut_1": 1},
                       {"stages.rewards.x_clip__mutmut_1": "thought the same"})
    assert t.stale == ["stages.rewards.x_clip__mutmut_1 (killed: not equivalent)"]


def test_summary_reads_mutmut_meta_files_and_ends_with_the_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(mutation, "EQUIVALENT", tmp_path / "none.txt")
    for module, codes in (("stages/rewards.py", {"stages.rewards.x_clip__mutmut_1": 1,
                                                  "stages.rewards.x_clip__mutmut_2": 0}),
                          ("stages/memory.py", {"stages.memory.x_seed__mutmut_1": 1})):
        meta = tmp_path / mutation.module_slug(module) / "mutants" / (module + ".meta")
        meta.parent.mkdir(parents=True)
        meta.write_text(json.dumps({"exit_code_by_key": codes}))
    mutation.summary(tmp_path, ["stages/rewards.py", "stages/memory.py", "stages/shards.py"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "mutation: 2/3 killed (0 equivalent)"
    assert "stages/shards.py: 0/0 killed (0 equivalent)" in lines


def test_the_setup_cfg_selects_the_mapped_tests_and_mutates_only_the_module():
    cfg = mutation.setup_cfg("stages/rewards.py")
    assert "only_mutate =\n    stages/rewards.py" in cfg
    assert "    tests/stages/test_rewards.py" in cfg and "tests/stages/test_rollout.py" not in cfg
