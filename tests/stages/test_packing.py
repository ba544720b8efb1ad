"""Packing and bounded logits: the same numbers as a plain forward, in less memory."""

from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from stages import packing  # noqa: E402


@dataclass
class Seq:
    ids: list[int]
    loss_positions: list[int]
    temperature: float = 1.0


@pytest.fixture(scope="module")
def model(tiny_model):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model.config.use_cache = False
    return model.eval()


def sequences():
    gen = torch.Generator().manual_seed(0)
    lengths = [(9, 4), (17, 6), (5, 1)]  # (prompt, completion)
    out = []
    for (prompt, completion), temperature in zip(lengths, [1.0, 0.7, 0.0]):
        ids = torch.randint(0, 2000, (prompt + completion,), generator=gen).tolist()
        out.append(Seq(ids, list(range(prompt, prompt + completion)), temperature))
    # a sequence with loss in two separate places, as a multi-turn episode has
    ids = torch.randint(0, 2000, (20,), generator=gen).tolist()
    out.append(Seq(ids, [4, 5, 6, 12, 13, 19]))
    return out


def plain_logprobs(model, seq: Seq):
    """What the model's own forward gives for one sequence on its own: full logits."""
    logits = model(input_ids=torch.tensor([seq.ids])).logits[0].float()
    logits = logits / (seq.temperature or 1.0)
    logp = logits.log_softmax(-1)
    return torch.stack([logp[p - 1, seq.ids[p]] for p in seq.loss_positions]), \
        torch.stack([-(logp[p - 1].exp() * logp[p - 1]).sum() for p in seq.loss_positions])


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_packed_chunked_logprobs_equal_each_sequence_on_its_own(model, chunk):
    seqs = sequences()
    packed = packing.pack(torch, seqs, "cpu")
    assert packed.counts == [4, 6, 1, 6] and packed.tokens == sum(len(s.ids) for s in seqs)
    with torch.no_grad():
        logp, entropy = packing.loss_logprobs(torch, model, packed, False, with_entropy=True,
                                              chunk=chunk)
        expected = [plain_logprobs(model, s) for s in seqs]
    torch.testing.assert_close(logp, torch.cat([e[0] for e in expected]), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, torch.cat([e[1] for e in expected]), atol=1e-5, rtol=0)


def test_gradients_through_the_chunks_equal_the_full_logits_gradients(model):
    seqs = sequences()
    weights = torch.linspace(-1.0, 2.0, sum(len(s.loss_positions) for s in seqs))

    def grads(loss_fn):
        model.zero_grad(set_to_none=True)
        loss_fn().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    packed = packing.pack(torch, seqs, "cpu")
    chunked = grads(lambda: (packing.loss_logprobs(torch, model, packed, False, chunk=4)[0]
                             * weights).sum())
    full = grads(lambda: (torch.cat([plain_logprobs(model, s)[0] for s in seqs])
                          * weights).sum())
    assert chunked.keys() == full.keys() and len(full) > 10
    for name in full:
        torch.testing.assert_close(chunked[name], full[name], atol=1e-5, rtol=1e-4)


def test_the_output_head_never_sees_more_than_a_chunk_of_positions(model, monkeypatch):
    """The bound that keeps [positions, vocabulary] logits small, forward and backward."""
    seqs = sequences()
    head = model.get_output_embeddings()
    rows = []
    handle = head.register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))
    try:
        packed = packing.pack(torch, seqs, "cpu")
        logp, _ = packing.loss_logprobs(torch, model, packed, False, chunk=5)
        logp.sum().backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    loss_tokens = sum(len(s.loss_positions) for s in seqs)
    assert max(rows) == 5
    # forward once per chunk, and once more in backward (recomputed, never kept)
    assert sum(rows) == 2 * loss_tokens


def test_micro_batches_fill_a_token_budget_and_never_split_a_sequence():
    lengths = [700, 300, 300, 200, 1500, 100, 900]
    batches = packing.micro_batches(lengths, 1000)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [sum(lengths[i] for i in b) for b in batches] == [1500, 1000, 1000, 500]
    assert batches[0] == [4]  # longer than the budget: alone
    assert packing.micro_batches(lengths, 1000) == batches  # deterministic
    assert packing.micro_batches([], 10) == []
