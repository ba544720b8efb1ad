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
