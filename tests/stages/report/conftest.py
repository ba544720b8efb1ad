"""Shared fixtures of the report tests: the synthetic runs of tests/fixtures/report/make_run.py
(a varied 3-round run and a quickstart-like flat one), built once per session."""

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the report needs matplotlib (the `report` extra)")

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "report" / "make_run.py"


def _load():
    spec = importlib.util.spec_from_file_location("report_make_run", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fixture():
    """The fixture module: make_run, make_flat_run, EXPECTED, EXPECTED_FLAT."""
    return _load()


def one_hot_by_family(texts):
    """A stand-in embedder: one axis per `# family: X` line (first line of every fixture env)."""
    families = sorted({text.split()[2] for text in texts})
    return [[1.0 if text.split()[2] == family else 0.0 for family in families] for text in texts]


@pytest.fixture(scope="session")
def embedder():
    return one_hot_by_family


@pytest.fixture(scope="session")
def run_dir(fixture, tmp_path_factory):
    return fixture.make_run(tmp_path_factory.mktemp("report") / "tiny-run")


@pytest.fixture(scope="session")
def flat_dir(fixture, tmp_path_factory):
    return fixture.make_flat_run(tmp_path_factory.mktemp("report") / "flat-run")


@pytest.fixture(scope="session")
def built(run_dir, tmp_path_factory):
    from stages import report

    return report.build(run_dir, tmp_path_factory.mktemp("report-out"), embedder=one_hot_by_family)


@pytest.fixture(scope="session")
def built_flat(flat_dir, tmp_path_factory):
    from stages import report

    return report.build(flat_dir, tmp_path_factory.mktemp("report-flat"),
                        embedder=one_hot_by_family)


@pytest.fixture(scope="session")
def metric():
    """metric(page, name, round) -> the text of that metric cell."""

    def find(page: str, name: str, round_) -> str:
        match = re.search(rf'<td data-metric="{name}" data-round="{round_}">([^<]*)</td>', page)
        assert match, f"no {name} cell for round {round_}"
        return match.group(1)

    return find
