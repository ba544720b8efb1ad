"""stages.report.plots: every legend names a drawn line, no empty axes, literal text, notes for
what matplotlib cannot draw, and y ranges that never stretch noise into a curve."""

from pathlib import Path

import pytest

from stages import report
from stages.records import Design, Env, Eval, Regret, Rollout, Train, Validation, dumps
from stages.report import plots
from stages.shards import write_atomic

HOSTILE_LABEL = "$\\undefinedmacro{x}^$ [/] <b>&amp; \x1b]0;title\x07"


def write_round(run: Path, number: int, records) -> None:
    (run / f"r{number:02d}" / "stage").mkdir(parents=True, exist_ok=True)
    for kind in sorted({r.kind for r in records}):
        write_atomic(run / f"r{number:02d}" / "stage" / f"{kind}-00000.jsonl",
                     [dumps(r) for r in records if r.kind == kind])


def designed_env(design: Design, family: str) -> Env:
    source = f"# family: {family}\nclass A: pass\n"
    return Env(domain="game", skill=design.skill, class_name="A", source=source,
               source_hash=family, max_turns=1, parents=[design.id])


@pytest.fixture
def figures(monkeypatch):
    """Every figure the report saves, kept for inspection."""
    kept = []
    save = plots.Charts.save

    def keep(self, fig, name, alt):
        kept.append((name, fig))
        return save(self, fig, name, alt)

    monkeypatch.setattr(plots.Charts, "save", keep)
    return kept


def one_round_run(root: Path) -> Path:
    """One round of everything: each per-round chart has a single point per series."""
    designs = [Design(skill=skill, round=1, slot=slot, completion=skill)
               for slot, skill in enumerate(("spatial", "memory", "deduction"))]
    envs = [designed_env(design, family) for design, family in zip(designs, ("maze", "cards"))]
    plays = [Rollout(env_id=env.id, round=1, seed=seed, reward=reward)
             for env, rewards in zip(envs, ([1.0, 0.0], [0.0, 0.0])) for seed, reward in
             enumerate(rewards)]
    regrets = [Regret(env_id=env.id, round=1, win=win, regret=regret, designer_reward=reward,
                      parents=[env.id, *env.parents])
               for env, win, regret, reward in zip(envs, (0.5, 0.0), (0.25, 0.5), (0.3, 0.9))]
    write_round(root, 1, [*designs, *envs, *plays, *regrets,
                          Validation(check="oracle", round=1, parents=[designs[2].id]),
                          Train(step=1, stats={"loss": 0.4, "agent_adv_std": 1.0}),
                          Train(step=2, stats={"loss": 0.2, "agent_adv_std": 0.8}),
                          Eval(suite="a", round=1, score=0.2), Eval(suite="b", round=1, score=0.6)])
    return root


def drawn(handle) -> bool:
    """Whether a legend's artist shows on the chart: a line of two points or with markers, a
    band of some width, bars of some height."""
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.container import BarContainer, ErrorbarContainer
    from matplotlib.lines import Line2D

    if isinstance(handle, ErrorbarContainer):
        return drawn(handle.lines[0])
    if isinstance(handle, Line2D):
        marker = handle.get_marker() not in (None, "None", "", " ")
        points = len(handle.get_xdata())
        return points > 0 and (marker or (points > 1 and handle.get_linestyle() != "None"))
    if isinstance(handle, PolyCollection):
        return any(p.get_extents().width > 0 for p in handle.get_paths())
    if isinstance(handle, LineCollection):
        return any(len(segment) > 1 for segment in handle.get_segments())
    if isinstance(handle, BarContainer):
        return any(bar.get_height() > 0 for bar in handle)
    return True


def assert_every_legend_line_is_drawn_and_no_axes_is_empty(figures):
    assert figures
    for name, fig in figures:
        for ax in fig.axes:
            if not ax.get_visible() or ax.get_label() == "<colorbar>":
                continue
            assert ax.has_data() or any(a.has_data() for a in ax.get_shared_x_axes()
                                        .get_siblings(ax) if a is not ax), f"{name}: empty axes"
            handles, labels = ax.get_legend_handles_labels()
            for handle, label in zip(handles, labels):
                assert drawn(handle), f"{name}: the legend names {label!r}, which is not drawn"


def test_one_round_charts_draw_every_line_their_legends_name(tmp_path, figures, embedder):
    result = report.build(one_round_run(tmp_path / "run"), tmp_path / "out", embedder=embedder)
    assert {name for name, _ in figures} == {"win_rate.png", "regret.png", "validation.png",
                                             "skills.png", "diversity.png", "eval.png",
                                             "train.png"}
    assert result.charts == len(figures)
    assert_every_legend_line_is_drawn_and_no_axes_is_empty(figures)


def test_the_fixture_runs_charts_draw_every_line_their_legends_name(run_dir, flat_dir, tmp_path,
                                                                     figures, embedder):
    report.build(run_dir, tmp_path / "a", embedder=embedder)
    report.build(flat_dir, tmp_path / "b", embedder=embedder)
    assert_every_legend_line_is_drawn_and_no_axes_is_empty(figures)


def test_a_y_range_is_never_narrower_than_a_hundredth_of_the_values(tmp_path, figures):
    charts = plots.Charts(tmp_path, embed=False)
    plots.chart_train(charts, [("entropy", {"all": [(1, 2.0), (2, 2.003), (3, 2.001)]})])
    low, high = figures[0][1].axes[0].get_ylim()
    assert high - low >= 0.01 * 2.003


def test_env_derived_labels_are_drawn_and_shown_literally(tmp_path):
    design = Design(skill=HOSTILE_LABEL, round=1, completion="x")
    env = Env(domain="game", skill=HOSTILE_LABEL, class_name="A", source="x", source_hash="h",
              max_turns=1, parents=[design.id])
    write_round(tmp_path, 1, [design, env, Validation(check=HOSTILE_LABEL, round=1),
                              Eval(suite=HOSTILE_LABEL, category=HOSTILE_LABEL, round=1,
                                   score=0.2),
                              Eval(suite="plain", round=1, score=0.7)])
    result = report.build(tmp_path, tmp_path / "out", embedder=None)
    page = result.path.read_text()
    assert result.charts == 3 and "not drawn" not in page  # validation, skills, eval
    assert "$\\undefinedmacro{x}^$ [/] &lt;b&gt;&amp;amp;" in page and "<b>" not in page


def test_numbers_matplotlib_cannot_place_leave_a_note_not_a_crash(tmp_path):
    huge = 1.7e308
    write_round(tmp_path, 1, [Regret(env_id=f"env_{i}", round=1, win=0.5, regret=sign * huge)
                              for i, sign in enumerate((1, -1, 1))]
                + [Eval(suite="s", round=1, score=huge, ci_low=-huge, ci_high=huge),
                   Eval(suite="t", round=1, score=0.0),
                   Train(step=1, stats={"loss": huge}), Train(step=2, stats={"loss": -huge})])
    result = report.build(tmp_path, tmp_path / "out", embedder=None)
    page = result.path.read_text()
    assert page.count("chart not drawn (") == 3  # regret, eval, train
    assert result.numbers["regret"][1]["regret"].mean == pytest.approx(huge / 3)


def test_many_rounds_use_a_heatmap(tmp_path):
    for n in range(20):
        write_round(tmp_path, n, [Regret(env_id=f"env_{n}_{i}", round=n, win=i / 10)
                                  for i in range(5)])
    result = report.build(tmp_path, tmp_path / "out", embedder=None)
    assert result.numbers["learnable_share"][19] == pytest.approx(0.6)  # 0.2, 0.3, 0.4 of 0..0.4
    assert (tmp_path / "out" / "win_rate.png").exists()
