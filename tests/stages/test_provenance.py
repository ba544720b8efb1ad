"""Provenance stamps: a validate or score-regret manifest names the code and settings that
judged or scored each shard, the digest moves exactly when those do, and a shard a rerun kept
keeps the stamp of the code that wrote it."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from stages import __version__
from stages import provenance, shards
from stages.provenance import REWARD_CODE, VALIDATOR_CODE, stamp
from stages.records import Env
from stages.shards import Stats, find_shards, run_stage, write_atomic, dumps

VALIDATE_CONFIG = {"sandbox": "nsjail", "call_timeout": 5.0, "memory_mb": 512, "budget": 30.0,
                   "seed": None}


def env(n: int) -> Env:
    source = f"class E{n}:\n    pass\n"
    return Env(domain="game", class_name=f"E{n}", source=source, source_hash=str(n),
               max_turns=1)


def entries(out: Path) -> dict:
    return orjson.loads((out / "_manifest.json").read_bytes())["shards"]


def pass_through(tmp_path: Path, config: dict, names: list[str]) -> Path:
    inputs = tmp_path / "in"
    inputs.mkdir(exist_ok=True)
    for n, name in enumerate(names):
        write_atomic(inputs / name, [dumps(env(n))])
    out = tmp_path / "out"
    run_stage("validate", find_shards([str(inputs)]), str(out), lambda records: records,
              config, Stats())
    return out


def test_every_stage_names_its_version_and_only_the_judges_and_scorers_a_digest():
    assert stamp("rollout", {}) == {"spade_version": __version__}
    assert set(stamp("validate", VALIDATE_CONFIG)) == {"spade_version", "validator"}
    assert set(stamp("score-regret", {"rewards": {}, "window": 4})) == {"spade_version",
                                                                      "reward"}


def test_a_validate_manifest_entry_carries_the_validator_digest(tmp_path):
    out = pass_through(tmp_path, VALIDATE_CONFIG, ["env-00000.jsonl"])
    [entry] = entries(out).values()
    assert entry["provenance"] == stamp("validate", VALIDATE_CONFIG)
    assert len(entry["provenance"]["validator"]) == provenance.DIGEST_CHARS


def test_the_validator_digest_moves_with_a_verdict_setting_but_not_the_seed():
    base = stamp("validate", VALIDATE_CONFIG)["validator"]
    assert stamp("validate", {**VALIDATE_CONFIG, "seed": 7})["validator"] == base
    for key, value in (("call_timeout", 6.0), ("memory_mb", 256), ("sandbox", "none"),
                       ("budget", 60.0)):
        assert stamp("validate", {**VALIDATE_CONFIG, key: value})["validator"] != base, key


def test_the_reward_digest_moves_with_the_reward_config_and_window_not_the_round():
    config = {"round": 3, "window": 4, "rewards": {"band_low": 0.1}, "inputs": ["a"]}
    base = stamp("score-regret", config)["reward"]
    assert stamp("score-regret", {**config, "round": 4, "inputs": ["b"]})["reward"] == base
    assert stamp("score-regret", {**config, "window": 2})["reward"] != base
    assert stamp("score-regret", {**config, "rewards": {"band_low": 0.2}})["reward"] != base


@pytest.mark.parametrize("code", [VALIDATOR_CODE, REWARD_CODE])
def test_an_edit_to_the_judging_code_changes_its_digest(tmp_path, monkeypatch, code):
    installed = provenance.code_digest(code)
    for relative in code:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(provenance.ROOT / relative, tmp_path / relative)
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    provenance.code_digest.cache_clear()
    try:
        before = provenance.code_digest(code)
        assert before == installed  # the same code elsewhere: the same digest
        edited = tmp_path / code[-1]
        edited.write_text(edited.read_text() + "\n# edited\n")
        provenance.code_digest.cache_clear()
        assert provenance.code_digest(code) != before
    finally:
        provenance.code_digest.cache_clear()


def test_a_shard_a_rerun_kept_keeps_the_stamp_of_the_code_that_judged_it(tmp_path,
                                                                           monkeypatch):
    out = pass_through(tmp_path, VALIDATE_CONFIG, ["env-00000.jsonl"])
    old = entries(out)["00000"]["provenance"]
    monkeypatch.setattr(shards, "stamp", lambda stage, config: {"spade_version": "9.9",
                                                                "validator": "newer"})
    pass_through(tmp_path, VALIDATE_CONFIG, ["env-00000.jsonl", "env-00001.jsonl"])
    kept, new = entries(out)["00000"], entries(out)["00001"]
    assert kept["provenance"] == old  # skipped by the rerun: judged by the old code
    assert new["provenance"] == {"spade_version": "9.9", "validator": "newer"}


def test_the_version_records_carry_is_the_installed_distributions():
    from importlib.metadata import version

    assert __version__ == version("spade-selfplay")
