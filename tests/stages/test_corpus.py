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


@pytest.mark.parametrize("name", ["builtin:games", "builtin:tool_use"])
def test_builtin_corpora_are_offline_and_a_few_hundred_docs(name):
    docs = corpus.load(name)
    assert len(docs) >= 300
    assert len({d.id for d in docs}) == len(docs)
    assert docs == corpus.load(name)  # generated deterministically
