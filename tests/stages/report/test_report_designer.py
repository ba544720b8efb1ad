"""stages.report names the model that designed: a recipe's separate, frozen `[designer]`, or the
run's own model."""

import json
import re
import shutil

from stages import report
from stages.report.page import designer_text


def validation_section(page: str) -> str:
    return re.search(r'<section id="validation".*?</section>', page, re.S).group(0)


def test_the_page_names_a_separate_designer_in_its_header_and_validation(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["designer"] = {"backend": "openai", "base-url": "http://10.0.0.5:8000/v1",
                          "model": "big-designer", "api-key-env": "DESIGNER_KEY"}
    (run / "recipe.json").write_text(json.dumps(recipe))
    page = report.build(run, tmp_path / "out", embedder=None).path.read_text()
    said = "big-designer (frozen, openai at http://10.0.0.5:8000/v1)"
    assert f"<dt>designer</dt><dd>{said}</dd>" in page
    assert f"Designer: {said}." in validation_section(page)


def test_without_a_designer_table_the_runs_model_designed(built):
    page = built.path.read_text()
    assert "<dt>designer</dt><dd>the run&#x27;s model</dd>" in page
    assert "Designer: the run&#x27;s model." in validation_section(page)


def test_a_local_designer_is_named_by_its_directory_and_backend():
    recipe = {"designer": {"backend": "vllm", "model": "/models/Qwen3-8B"}}
    assert designer_text(recipe) == "/models/Qwen3-8B (frozen, vllm)"
    assert designer_text({"designer": {"backend": "openai", "base_url": "http://h/v1",
                                       "model": "m"}}) == "m (frozen, openai at http://h/v1)"
    assert designer_text(None) == "the run's model"
