"""CI's must-run rule (tests/conftest.py): under CI=true a test that skips for want of what CI
installs fails, whether it skips inside the test or at import; other skips stay skips."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
MODULE_SKIP = '''import pytest
pytest.importorskip("no_such_module_here", reason="{reason}")

def test_never_collected():
    pass
'''
TEST_SKIP = '''import pytest

def test_skips():
    pytest.skip("{reason}")
'''


def pytest_run(tmp_path: Path, source: str, ci: bool) -> subprocess.CompletedProcess:
    test = tmp_path / "test_probe.py"
    test.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.conftest", "--rootdir", str(tmp_path), str(test)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("template, reason", [
    (MODULE_SKIP, "verifiers is not installed (pip install x)"),
    (TEST_SKIP, "openenv-core is not installed (pip install x)"),
    (MODULE_SKIP, "Ray is not installed: pip install x"),
    (TEST_SKIP, "nsjail cannot run here: no user namespaces")],
    ids=["verifiers-at-import", "openenv-in-test", "ray-at-import", "nsjail-in-test"])
def test_a_must_run_skip_fails_under_ci_and_skips_elsewhere(tmp_path, template, reason):
    source = template.format(reason=reason)
    elsewhere = pytest_run(tmp_path, source, ci=False)
    assert elsewhere.returncode in (0, 5) and "1 skipped" in elsewhere.stdout  # 5: none ran
    under_ci = pytest_run(tmp_path, source, ci=True)
    assert under_ci.returncode != 0 and "must-run test skipped" in under_ci.stdout


def test_an_optional_skip_stays_a_skip_under_ci(tmp_path):
    source = TEST_SKIP.format(reason="a gpu test: torch sees no CUDA device here")
    result = pytest_run(tmp_path, source, ci=True)
    assert result.returncode == 0 and "1 skipped" in result.stdout
