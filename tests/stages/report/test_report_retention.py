"""The report's retention section: the first env set's mean score per eval point (from the
items in r<NN>/eval-retention, the interval from their roll-up), each env's first and latest
score, kept apart from the Evaluation section; no section in a run without retention evals."""

import re
from pathlib import Path

import orjson
import pytest

from stages import report
from stages.records import Eval, dumps
from stages.shards import write_atomic
from tests.stages.report.test_report_plots import (  # noqa: F401 (figures: a fixture)
    assert_every_legend_line_is_drawn_and_no_axes_is_empty, figures)


def items(round_: int, scores: dict[str, float]) -> list[Eval]:
    return [Eval(suite="envs", task=env_id, category="logic", round=round_, score=score,
                 samples=4, parents=[env_id]) for env_id, score in scores.items()]


def write(run: Path, where: str, records: list[Eval]) -> None:
    (run / where).mkdir(parents=True)
    write_atomic(run / where / "eval-00000.jsonl", [dumps(r) for r in records])


def retention_run(run: Path) -> Path:
    """r01 and r03 evals of the retention set (an env new in r03, a failed item), r02 another
    suite's roll-up."""
    run.mkdir()
    (run / "recipe.json").write_text(orjson.dumps({"name": "kept", "rounds": 4}).decode())
    write(run, "r01/eval-retention", items(1, {"env_a": 1.0, "env_b": 0.5, "env_c": 0.25}) + [
        Eval(suite="envs", task="", category="overall", round=1, score=7 / 12, samples=3,
             ci_low=0.2, ci_high=0.9)])
    write(run, "r02/eval-rg-quick", [Eval(suite="rg-quick", round=2, score=0.4, samples=8)])
    write(run, "r03/eval-retention", items(3, {"env_a": 0.5, "env_b": 0.5, "env_c": 0.0,
                                               "env_d": 0.75}) + [
        Eval(suite="envs", task="env_e", category="logic", round=3, ok=False, samples=0,
             error={"type": "internal", "msg": "boom"}),
        Eval(suite="envs", task="", category="overall", round=3, score=0.4375, samples=4,
             ci_low=0.1, ci_high=0.8)])
    return run


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    run = retention_run(tmp_path_factory.mktemp("retention") / "run")
    return report.build(run, tmp_path_factory.mktemp("retention-out"), embedder=None)


def test_the_curve_is_the_mean_item_score_per_eval_point(built):
    # r01: (1 + 0.5 + 0.25) / 3; r03: (0.5 + 0.5 + 0 + 0.75) / 4, the failed env left out
    assert built.numbers["retention"] == {1: (3, pytest.approx(7 / 12)),
                                         3: (4, pytest.approx(0.4375))}
    assert built.numbers["retention_envs"] == {
        "env_a": ((1, 1.0), (3, 0.5)), "env_b": ((1, 0.5), (3, 0.5)),
        "env_c": ((1, 0.25), (3, 0.0)), "env_d": ((3, 0.75), (3, 0.75))}


def test_the_page_shows_the_section_after_evaluation_with_the_numbers(built):
    page = built.path.read_text()
    ids = re.findall(r'<section id="([^"]+)" class="report-section">', page)
    assert ids[ids.index("eval") + 1] == "retention"
    section = page[page.index('<section id="retention"'):]
    section = section[:section.index("</section>")]
    assert "a falling curve is forgetting" in section and 'src="retention.png"' in section
    assert '<td data-metric="retention_score" data-round="1">0.583</td>' in section
    assert re.search(r'<tr><td>r03</td><td>4</td><td[^>]*>0.438</td><td>0.100</td>'
                     r'<td>0.800</td><td>1</td></tr>', section)
    # per env, the largest drop first
    assert [m for m in re.findall(r"<tr><td>(env_\w)</td>", section)] == [
        "env_a", "env_c", "env_b", "env_d"]
    assert "<td>-0.500</td>" in section and (built.path.parent / "retention.png").exists()


def test_retention_evals_stay_out_of_the_evaluation_section(built):
    assert built.numbers["eval"] == {"rg-quick": [(2, 0.4)]}


def test_a_run_without_retention_evals_has_no_retention_section(built_flat):
    assert '<section id="retention"' not in built_flat.path.read_text()
    assert "retention" not in built_flat.numbers


def test_the_curve_draws_what_its_legend_names(tmp_path, figures):
    report.build(retention_run(tmp_path / "run"), tmp_path / "out", embedder=None)
    assert "retention.png" in [name for name, _ in figures]
    assert_every_legend_line_is_drawn_and_no_axes_is_empty(figures)
