"""Shared fixtures: whether a jail can run here, and small env sources."""

import pytest

from sandbox.jail import SandboxUnavailable, Worker


@pytest.fixture(scope="session")
def jail_available():
    try:
        with Worker():
            pass
    except SandboxUnavailable as exc:
        pytest.skip(f"nsjail cannot run here: {exc}")
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
