"""Corpus: formats, errors with path:line, sampling without replacement, truncation."""

import pytest

from stages import corpus
from stages.records import RecordError
from stages.shards import InputMissing


def test_jsonl_reads_text_or_orig_doc(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "alpha beta"}\n\n{"orig_doc": "gamma"}\n')
    assert [d.text for d in corpus.load(str(path))] == ["alpha beta", "gamma"]


def test_bad_corpus_line_names_path_and_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(RecordError, match=rf"^{path}:2: field 'text'"):
        corpus.load(str(path))


def test_directory_of_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("one two three")
    (tmp_path / "b.md").write_text("four")
    (tmp_path / "c.bin").write_text("ignored")
    assert [d.title for d in corpus.load(str(tmp_path))] == ["a", "b"]


def test_missing_corpus(tmp_path):
    with pytest.raises(InputMissing):
        corpus.load(str(tmp_path / "none.jsonl"))


def test_truncation_by_words(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "' + " ".join(["w"] * 50) + '"}\n')
    assert corpus.load(str(path), max_words=10)[0].text.split() == ["w"] * 10 + ["..."]


def test_sampling_is_without_replacement_and_seeded():
    docs = [corpus.Document(str(i), "", str(i)) for i in range(5)]

    def draw(seed, n):
        sampler = corpus.Sampler(docs, seed=seed)
        return [sampler.next().id for _ in range(n)]

    assert sorted(draw(3, 5)) == ["0", "1", "2", "3", "4"]
    assert sorted(draw(3, 10)[5:]) == ["0", "1", "2", "3", "4"]  # a second full pass
    assert draw(3, 5) == draw(3, 5)
    assert draw(3, 5) != draw(4, 5)


@pytest.mark.parametrize("name,least", [("builtin:games", 2000), ("builtin:tool_use", 300)])
def test_builtin_corpora_are_offline_and_large(name, least):
    docs = corpus.load(name)
    assert len(docs) >= least
    assert len({d.id for d in docs}) == len(docs)
    assert docs == corpus.load(name)


def test_builtin_games_corpus_is_math_and_science():
    titles = {d.title.split(".")[0] for d in corpus.load("builtin:games")}
    assert {"sympy", "mpmath"} <= titles  # torch depends on both: always there with it
    assert not titles & {"json", "csv", "sqlite3", "pathlib"}


@pytest.mark.slow
def test_builtin_corpus_is_the_same_in_every_process(tmp_path, monkeypatch):
    """Built once per machine and read back: scipy renders some docstrings from random draws."""
    import subprocess
    import sys

    monkeypatch.setenv("SPADE_CACHE", str(tmp_path))
    script = "from stages import corpus; print(len(corpus.load('builtin:games')))"
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True)
    assert list(tmp_path.glob("corpus-games-*.jsonl"))
    assert int(first.stdout) == len(corpus.load("builtin:games"))


def test_tool_use_documents_are_cut_at_4000_words_by_default():
    from stages import design

    assert design.CORPUS_WORDS == {"game": 6000, "tool_use": 4000}
