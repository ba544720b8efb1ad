"""Packing and bounded logits: the same numbers as a plain forward, in less memory."""

from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from stages.train import packing  # noqa: E402


@dataclass
class Seq:
    ids: list[int]
    loss_positions: list[int]
    temperature: float = 1.0


def load(tiny_model, attention=None):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model, dtype=torch.float32, attn_implementation=attention)
    model.config.use_cache = False
    return model.eval()


@pytest.fixture(scope="module")
def model(tiny_model):
    """The tiny model as train-grpo builds it: packed rows attend through
    stages/train/attention.py."""
    import transformers

    from stages.train.attention import register

    return load(tiny_model, register(transformers))


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The same weights with transformers' own attention: the plain forward to match."""
    return load(tiny_model)


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


def plain_logprobs(reference, seq: Seq):
    """What the model's own forward gives for one sequence on its own: full logits."""
    logits = reference(input_ids=torch.tensor([seq.ids])).logits[0].float()
    logits = logits / (seq.temperature or 1.0)
    logp = logits.log_softmax(-1)
    return torch.stack([logp[p - 1, seq.ids[p]] for p in seq.loss_positions]), \
        torch.stack([-(logp[p - 1].exp() * logp[p - 1]).sum() for p in seq.loss_positions])


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_packed_chunked_logprobs_equal_each_sequence_on_its_own(model, reference, chunk):
    seqs = sequences()
    packed = packing.pack(torch, seqs, "cpu")
    assert packed.counts == [4, 6, 1, 6] and packed.tokens == sum(len(s.ids) for s in seqs)
    with torch.no_grad():
        logp, entropy = packing.loss_logprobs(torch, model, packed, False, with_entropy=True,
                                              chunk=chunk)
        expected = [plain_logprobs(reference, s) for s in seqs]
    torch.testing.assert_close(logp, torch.cat([e[0] for e in expected]), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, torch.cat([e[1] for e in expected]), atol=1e-5, rtol=0)


def test_gradients_through_the_chunks_equal_the_full_logits_gradients(model, reference):
    seqs = sequences()
    weights = torch.linspace(-1.0, 2.0, sum(len(s.loss_positions) for s in seqs))

    def grads(of, loss_fn):
        of.zero_grad(set_to_none=True)
        loss_fn().backward()
        return {n: p.grad.clone() for n, p in of.named_parameters() if p.grad is not None}

    packed = packing.pack(torch, seqs, "cpu")
    chunked = grads(model, lambda: (packing.loss_logprobs(torch, model, packed, False,
                                                          chunk=4)[0] * weights).sum())
    full = grads(reference, lambda: (torch.cat([plain_logprobs(reference, s)[0] for s in seqs])
                                     * weights).sum())
    assert chunked.keys() == full.keys() and len(full) > 10
    for name in full:
        torch.testing.assert_close(chunked[name], full[name], atol=1e-5, rtol=1e-4)


class LargestLogits:
    """The most positions of any tensor whose last dimension is the vocabulary, made while
    active (forward and backward: every op autograd runs goes through the dispatcher); views of
    the head's weight itself are not logits."""

    def __init__(self, weight):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        seen, vocab = self, weight.shape[0]

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for leaf in tree_leaves(out):
                    if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2 and \
                            leaf.shape[-1] == vocab and leaf.untyped_storage().data_ptr() != \
                            weight.untyped_storage().data_ptr():
                        seen.rows = max(seen.rows, leaf.numel() // vocab)
                return out

        self.rows, self.mode = 0, Mode()


def test_the_output_head_never_sees_more_than_a_chunk_of_positions(model):
    """The bound that keeps [positions, vocabulary] logits small, forward and backward."""
    seqs = sequences()
    largest = LargestLogits(model.get_output_embeddings().weight)
    packed = packing.pack(torch, seqs, "cpu")
    try:
        with largest.mode:
            logp, _ = packing.loss_logprobs(torch, model, packed, False, with_entropy=True,
                                            chunk=5)
            logp.sum().backward()
    finally:
        model.zero_grad(set_to_none=True)
    assert largest.rows == 5
    assert logp.shape[0] == sum(len(s.loss_positions) for s in seqs) > 5


def head_gradients(positions: int = 1500):
    """The weight gradient of a bf16 head (FSDP2 gathers bf16 weights) over `positions`: in
    one chunk, in one-position chunks, and through one autograd head call per position, whose
    gradients autograd adds up in the weight's own dtype."""
    gen = torch.Generator().manual_seed(0)
    vocab, width = 512, 64
    weight = (torch.randn(vocab, width, generator=gen) * 0.5).to(torch.bfloat16)
    hidden = torch.randn(positions, width, generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (positions,), generator=gen)
    temperatures = torch.full((positions,), 0.6)

    def gradient(chunk: int, calls: int = 1):
        head = torch.nn.Linear(width, vocab, bias=False, dtype=torch.bfloat16)
        head.weight.data.copy_(weight)
        step = positions // calls
        logp = torch.cat([packing.head_logprobs(torch, head, hidden[i:i + step],
                                                targets[i:i + step], temperatures[i:i + step],
                                                False, chunk=chunk)[0]
                          for i in range(0, positions, step)])
        logp.sum().backward()
        return head.weight.grad.double()

    return gradient(positions), gradient(1), gradient(1, calls=positions)


def test_the_heads_weight_gradient_is_summed_in_fp32_and_rounded_once():
    """1500 chunks' gradients: summed in fp32 they stay within bf16's rounding of the gradient
    of one chunk; summed in bf16, as autograd does, they drift three times as far."""
    whole, chunked, autograd_sum = head_gradients()

    def error(gradient):
        return float((gradient - whole).norm() / whole.norm())

    assert error(chunked) < 4e-3 < error(autograd_sum)


def test_micro_batches_fill_a_token_budget_and_never_split_a_sequence():
    lengths = [700, 300, 300, 200, 1500, 100, 900]
    batches = packing.micro_batches(lengths, 1000)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [sum(lengths[i] for i in b) for b in batches] == [1500, 1000, 1000, 500]
    assert batches[0] == [4]  # longer than the budget: alone
    assert packing.micro_batches(lengths, 1000) == batches  # deterministic
    assert packing.micro_batches([], 10) == []
