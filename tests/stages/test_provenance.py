"""Provenance stamps: the same code and config give the same digests; a change to either shows."""

import copy
import dataclasses
import subprocess
import sys

from sandbox import contract
from spade_cli import __version__
from stages import provenance
from stages.rewards import RewardConfig


def test_a_stamp_names_the_version_and_both_digests():
    stamp = provenance.stamp(reward=RewardConfig())
    assert stamp["spade"] == __version__
    assert len(stamp["validator"]) == 16 and len(stamp["reward"]) == 16
    assert "reward" not in provenance.stamp()


def test_digests_are_the_same_in_another_process():
    code = ("from stages import provenance; from stages.rewards import RewardConfig; "
            "print(provenance.stamp(reward=RewardConfig()))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other == str(provenance.stamp(reward=RewardConfig()))


def test_any_reward_parameter_changes_the_reward_digest():
    base = provenance.reward_digest(RewardConfig())
    for field in dataclasses.fields(RewardConfig):
        value = getattr(RewardConfig(), field.name)
        changed = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v + 0.01,
                   str: lambda v: v + "x"}.get(type(value))
        if changed is None:
            continue
        other = dataclasses.replace(RewardConfig(), **{field.name: changed(value)})
        assert provenance.reward_digest(other) != base, field.name


def test_a_changed_check_changes_the_validator_digest(monkeypatch, tmp_path):
    before = provenance.validator_digest()
    edited = tmp_path / "contract.py"
    edited.write_text(open(contract.__file__).read() + "\n# edited\n")
    real = provenance.importlib.util.find_spec

    def find_spec(name):
        spec = copy.copy(real(name))  # a loaded module's spec is its own: never edit it
        if name == "sandbox.contract":
            spec.origin = str(edited)
        return spec

    monkeypatch.setattr(provenance.importlib.util, "find_spec", find_spec)
    provenance.validator_digest.cache_clear()
    try:
        assert provenance.validator_digest() != before
    finally:
        monkeypatch.undo()
        provenance.validator_digest.cache_clear()
    assert provenance.validator_digest() == before
