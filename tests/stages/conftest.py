"""Fixtures of the stage tests."""

import errno
import os

import pytest


@pytest.fixture
def refuse_temp_files(monkeypatch):
    """`refuse_temp_files(code)`: from then on, making any `*.tmp` file (what write_atomic
    writes first) fails with that errno, as a read-only or unwritable directory would."""

    def install(code: int = errno.EACCES) -> None:
        real = os.open

        def refuse(path, *args, **kwargs):
            if str(path).endswith(".tmp"):
                raise OSError(code, os.strerror(code), str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)

    return install
