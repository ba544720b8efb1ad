"""Bounded env programs and tool-use oracle reasons: a source over MAX_SOURCE_BYTES is an
extract reject, nesting too deep for the parser a parse reject, global random in reset/setup
named; the host-memory check on jails at once; the jails' CPU share."""

import ast

import pytest

from sandbox import contract
from sandbox.contract import ContractError, global_random_use, static_checks
from sandbox.jail import Limits, nsjail_argv
from sandbox.pool import available_mb, fit_concurrency
from stages import validate as stage
from stages.records import Design, Validation

GAME = '''
class TinyEnv:
    def reset(self, seed=None):
        return "hi", {}
    def step(self, action):
        return "ok", 1.0, True, False, {}
    def solution(self):
        return [r"\\boxed{1}"]
'''


def test_a_source_over_the_cap_is_an_extract_reject():
    big = GAME + "#" + "x" * contract.MAX_SOURCE_BYTES + "\n"
    for text, is_source in ((big, True), (f"```python\n{big}```", False)):
        with pytest.raises(ContractError) as raised:
            static_checks(text, is_source=is_source)
        assert raised.value.check == "extract"
        assert f"more than the {contract.MAX_SOURCE_BYTES} (256 KiB)" in raised.value.msg


def test_a_source_under_the_cap_passes_the_static_checks():
    assert static_checks(GAME, is_source=True) == GAME


@pytest.mark.parametrize("expression", ["-" * 100_000 + "1", "1+" * 100_000 + "1",
                                        "not " * 50_000 + "1"], ids=["minus", "plus", "not"])
def test_nesting_too_deep_for_the_parser_is_a_parse_reject(expression):
    with pytest.raises(ContractError) as raised:
        static_checks(GAME + f"X = {expression}\n", is_source=True)
    assert raised.value.check == "parse" and "nests too deeply" in raised.value.msg


def test_a_deep_design_is_a_parse_reject_not_internal():
    source = GAME + "X = " + "-" * 100_000 + "1\n"
    record = stage.validate_isolated(Design(completion=f"```python\n{source}```"), stage.Config())
    assert isinstance(record, Validation) and record.check == "parse", record.error


def random_reason(source):
    return global_random_use(ast.parse(source))


def test_global_random_in_setup_or_its_helpers_is_named():
    source = '''
import random
class ShopEnv(ToolUseBaseEnv):
    def setup(self):
        self._fill()
    def _fill(self):
        self.items = random.sample(range(9), 2)
    def solution(self):
        return []
'''
    reason = random_reason(source)
    assert reason.startswith("_fill() draws from the global random module (line 7: random.sample)")


@pytest.mark.parametrize("body", [
    "self.rng = random.Random(seed)\n        self.x = self.rng.randint(1, 9)",
    "random.seed(seed)\n        self.x = random.randint(1, 9)",
])
def test_seeded_randomness_is_not_named(body):
    source = f'''
import random
class KeyEnv:
    def reset(self, seed=None):
        {body}
        return "hi", {{}}
    def step(self, action):
        return "ok", 0.0, True, False, {{}}
'''
    assert random_reason(source) is None


def test_from_random_import_is_seen():
    source = '''
from random import choice
class KeyEnv:
    def reset(self, seed=None):
        self.x = choice("ab")
        return "hi", {}
    def step(self, action):
        return "ok", 0.0, True, False, {}
'''
    assert "line 5: choice" in random_reason(source)


# -- host memory and CPU -------------------------------------------------------------------

def test_concurrency_is_capped_to_what_the_host_memory_holds():
    fits, warning = fit_concurrency(32, 512, available=10_000)
    assert warning == ("--concurrency 32 x 512 MiB of jail memory = 16384 MiB, more than the "
                       "10000 MiB this host has available: running 19 at once")
    fits, warning = fit_concurrency(32, 512, available=10_000)
    assert fits == 19 and "running 19 at once" in warning and "\n" not in warning


def test_concurrency_that_fits_is_kept_silently():
    assert fit_concurrency(8, 512, available=20_000) == (8, None)
    assert fit_concurrency(4, 512, jails_each=2, available=4096) == (4, None)


def test_validate_workers_count_two_jails_each_and_never_go_below_one():
    fits, warning = fit_concurrency(8, 512, jails_each=2, available=3000, what="--workers")
    assert fits == 2 and warning.startswith("--workers 8 x 2 x 512 MiB")
    assert fit_concurrency(8, 512, available=100)[0] == 1


def test_unknown_host_memory_changes_nothing(tmp_path):
    assert available_mb(str(tmp_path / "missing")) is None
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable:   2097152 kB\n")
    assert available_mb(str(tmp_path / "meminfo")) == 2048


def test_jails_get_a_cpu_quota_only_where_the_cpu_controller_is():
    with_cpu = nsjail_argv("nsjail", "python", "/w", Limits(), "/l",
                           {"memory": True, "pids": True, "cpu": True})
    without = nsjail_argv("nsjail", "python", "/w", Limits(), "/l",
                          {"memory": True, "pids": True, "cpu": False})
    assert with_cpu[with_cpu.index("--cgroup_cpu_ms_per_sec") + 1] == "1000"
    assert "--cgroup_cpu_ms_per_sec" not in without


# -- tool-use oracle reasons (fixtures in tests/fixtures/validate/broken/oracle_*.py) ---------

from pathlib import Path  # noqa: E402

BROKEN = Path(__file__).parent.parent / "fixtures" / "validate" / "broken"


@pytest.mark.parametrize("name, reason", [
    ("oracle_criterion_raises.py", "criterion 2 raises after the solution's actions (KeyError"),
    ("oracle_global_random.py", "setup() draws from the global random module (line 16: "
                                "random.sample), not self.rng"),
])
def test_each_tool_use_oracle_failure_says_why(name, reason, nsjail_ok):
    record = stage.validate_one(stage.designs_from_files([BROKEN / name])[0], stage.Config())
    assert isinstance(record, Validation) and record.check == "oracle"
    assert "did not win" in record.error.msg and reason in record.error.msg


def test_a_determinism_failure_names_global_random(nsjail_ok):
    record = stage.validate_one(stage.designs_from_files([BROKEN / "determinism.py"])[0],
                                stage.Config())
    assert record.check == "determinism"
    assert "reset() draws from the global random module (line 21" in record.error.msg
