"""benchmarks/designer.py end to end on the tiny model: 2 designs per domain, then --revalidate."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "designer.py"


def load():
    spec = importlib.util.spec_from_file_location("designer_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_paper_sampling_is_read_from_the_recipe():
    sampling = load().paper_sampling()
    assert sampling["temperature"] == 0.6 and sampling["max-tokens"] == 16384


@pytest.mark.slow
def test_a_study_prints_its_table_and_revalidates_the_same_designs(tiny_model, tmp_path, capsys,
                                                                    nsjail_ok):
    study = load()
    out = tmp_path / "study"
    study.main(["-m", tiny_model, "-n", "2", "--max-tokens", "24", "-o", str(out),
                "--design-arg=--no-corpus"])
    printed = capsys.readouterr().out
    assert "max tokens 24" in printed
    rows = json.loads((out / "study.json").read_text())["rows"]
    assert [r["domain"] for r in rows] == ["game", "tool_use"]
    for r in rows:
        assert r["designs"] == 2 and r["accepted"] + sum(r["rejects"].values()) == 2
        assert r["tokens"] is not None and r["seconds"] > 0
    # 24 tokens of a random model never hold a whole module: cut, so `truncated`, not `parse`
    assert all(set(r["rejects"]) <= {"truncated", "extract"} for r in rows), rows
    study.main(["--revalidate", str(out)])
    printed = capsys.readouterr().out
    assert "before" in printed and "after" in printed
    assert (out / "game" / "part-00" / "revalidated").is_dir()


@pytest.mark.slow
def test_a_study_rerun_keeps_its_finished_parts_and_adds_the_new_ones(tiny_model, tmp_path,
                                                                     nsjail_ok):
    study = load()
    out = tmp_path / "study"
    argv = ["-m", tiny_model, "--max-tokens", "8", "-o", str(out), "--domains", "game",
            "--part", "1", "--design-arg=--no-corpus"]
    study.main([*argv, "-n", "2"])
    first = out / "game" / "part-00" / "designs" / "design-00000.jsonl"
    made = first.stat().st_mtime_ns
    study.main([*argv, "-n", "3", "--jobs", "2"])
    assert first.stat().st_mtime_ns == made  # part 0 was not designed again
    rows = json.loads((out / "study.json").read_text())["rows"]
    assert rows[0]["designs"] == 3
    seeds = [json.loads((out / "game" / f"part-{k:02d}" / "designs" / "_manifest.json")
                        .read_text())["config"]["seed"] for k in range(3)]
    assert seeds == [0, 1, 2]


@pytest.mark.slow
def test_a_study_with_repairs_counts_slots_filled_by_turn(tiny_model, tmp_path, capsys,
                                                          nsjail_ok):
    """The tiny model never writes a module: each repair turn asks for every slot again, and
    the table shows 0 filled at every turn."""
    study = load()
    out = tmp_path / "study"
    study.main(["-m", tiny_model, "-n", "2", "--max-tokens", "8", "-o", str(out), "--domains",
                "game", "--repairs", "2", "--design-arg=--no-corpus"])
    assert "slots filled by designer turn" in capsys.readouterr().out
    (turns,) = json.loads((out / "study.json").read_text())["turns"]
    assert turns["slots"] == 2 and turns["filled"] == [0, 0, 0]
    assert [t["designs"] for t in turns["turns"]] == [2, 2, 2]
    repairs = study.records(out / "game" / "part-00" / "repair-3")
    assert {d["turn"] for d in repairs} == {3}
