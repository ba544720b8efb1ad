"""Micro-batches for train-grpo: sequences packed by tokens, logprobs only where loss is.

In: training sequences (token ids, the positions whose tokens carry loss, a sampling
temperature each) and a token budget per micro-batch.
Out: packed rows (several sequences side by side in one row, each with its own position ids
from 0 and its boundaries, so that stages/train/attention.py keeps them apart without a mask: no
padding), and per-token log p (and entropy) of the loss tokens only.
Guarantees:
- a micro-batch holds at most `budget` tokens, except a single sequence longer than that, which
  gets one of its own (a sequence is never split);
- the output head runs on the hidden states of loss positions only, a chunk of them at a time
  (LOGIT_ELEMENTS // vocabulary positions), recomputed in the backward pass: no [positions,
  vocabulary] tensor larger than one chunk exists in either; the head's weight gradient is
  summed over the chunks in fp32 whatever the weight's dtype;
- the numbers equal a plain forward of each sequence on its own (tested to 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from stages.train import attention

# logits per head call: 2**25 fp32 elements (128 MiB), i.e. 220 positions of Qwen3's 151,936
# vocabulary; a step's logits peak at about four such tensors, forward or backward
LOGIT_ELEMENTS = 2 ** 25


class Packable(Protocol):
    ids: list[int]
    loss_positions: list[int]
    temperature: float


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped into micro-batches of at most `budget` tokens, first-fit by decreasing
    length (few, full micro-batches; deterministic for the same lengths)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        slot = next((b for b, free in enumerate(room) if free >= length), None)
        if slot is None:
            bins.append([])
            room.append(budget)
            slot = len(bins) - 1
        bins[slot].append(index)
        room[slot] -= length
    return bins


@dataclass
class Packed:
    """One row of packed sequences and where its loss tokens are."""

    ids: object  # [1, T] token ids
    positions: object  # [1, T] position ids, restarting at 0 for every sequence
    predictors: object  # [N] row positions whose next token carries loss
    targets: object  # [N] those tokens
    temperatures: object  # [N] the sampling temperature of each loss token's sequence
    counts: list[int]  # loss tokens per sequence, in order
    # where each sequence starts and ends: the keyword arguments of stages/train/attention.py, which
    # attends within each sequence with no [T, T] mask
    boundaries: dict

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[1])


def pack(torch, sequences: Sequence[Packable], device) -> Packed:
    ids, positions, predictors, targets, temperatures, counts = [], [], [], [], [], []
    offset = 0
    for seq in sequences:
        ids += seq.ids
        positions += range(len(seq.ids))
        # logits at position p predict the token at p + 1
        predictors += [offset + p - 1 for p in seq.loss_positions]
        targets += [seq.ids[p] for p in seq.loss_positions]
        # greedy samples were scored at temperature 1 by the backends
        temperatures += [seq.temperature if seq.temperature > 0 else 1.0] * \
            len(seq.loss_positions)
        counts.append(len(seq.loss_positions))
        offset += len(seq.ids)

    def tensor(values, dtype=torch.long):
        return torch.tensor(values, dtype=dtype, device=device)

    return Packed(tensor([ids]), tensor([positions]), tensor(predictors), tensor(targets),
                  tensor(temperatures, torch.float32), counts,
                  attention.boundaries(torch, [len(seq.ids) for seq in sequences], device))


def loss_logprobs(torch, model, packed: Packed, autocast: bool, with_entropy: bool = False,
                  chunk: int | None = None):
    """log p of every loss token of `packed` under `model` ([N], in the packed order), and its
    entropy (no graph: a logged statistic) when asked. Differentiable when grad is enabled."""
    decoder = model.get_decoder()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        hidden = decoder(input_ids=packed.ids, position_ids=packed.positions, use_cache=False,
                         **packed.boundaries).last_hidden_state[0]
    return head_logprobs(torch, model.get_output_embeddings(),
                         hidden.index_select(0, packed.predictors), packed.targets,
                         packed.temperatures, autocast, with_entropy, chunk)


def head_logprobs(torch, head, hidden, targets, temperatures, autocast: bool,
                  with_entropy: bool = False, chunk: int | None = None):
    """log p of `targets` (and entropy) from the hidden states that predict them, through the
    output head (a linear layer without bias) a chunk of positions at a time."""
    chunk = chunk or max(1, LOGIT_ELEMENTS // head.weight.shape[0])
    logp, entropy = _head_function(torch).apply(hidden, head.weight, targets, temperatures,
                                                head, autocast, with_entropy, chunk)
    return logp, (entropy if with_entropy else None)


def _chunk_logits(torch, head, hidden, temperatures, autocast: bool):
    """fp32 logits of a chunk of positions, divided by their temperatures."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = head(hidden)
    # in place: every [positions, vocabulary] copy counts here
    return logits.float().div_(temperatures[:, None])


_FUNCTIONS: dict = {}


def _head_function(torch):
    """The head as one autograd node (built once per torch): its forward keeps no logits, and
    its backward recomputes them a chunk at a time and sums the head's weight gradient over the
    chunks in fp32, handing autograd one sum. Autograd would add each chunk's gradient into
    the weight's own dtype: bf16 under FSDP2, where 150 chunks of a 32k sequence drift 1.5%
    from the fp32 sum (measured on an H200); here the only rounding is the sum's, once."""
    if torch in _FUNCTIONS:
        return _FUNCTIONS[torch]

    class HeadLogprobs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, targets, temperatures, head, autocast, with_entropy,
                    chunk):
            logps, entropies = [], []
            for first in range(0, hidden.shape[0], chunk):
                part = slice(first, first + chunk)
                logits = _chunk_logits(torch, head, hidden[part], temperatures[part], autocast)
                normaliser = logits.logsumexp(-1)
                logps.append(logits.gather(-1, targets[part, None]).squeeze(-1) - normaliser)
                if with_entropy:
                    probs = (logits - normaliser[:, None]).exp_()
                    entropies.append(normaliser - probs.mul_(logits).sum(-1))
            ctx.save_for_backward(hidden, weight, targets, temperatures)
            ctx.autocast, ctx.chunk = autocast, chunk
            logp = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)
            entropy = torch.cat(entropies) if entropies else logp.new_zeros(0)
            ctx.mark_non_differentiable(entropy)
            return logp, entropy

        @staticmethod
        def backward(ctx, grad_logp, _grad_entropy):
            hidden, weight, targets, temperatures = ctx.saved_tensors
            # the dtype the forward's matmul ran in (autocast's on a GPU)
            dtype = torch.bfloat16 if ctx.autocast else weight.dtype
            matrix = weight.detach().to(dtype)
            want_hidden, want_weight = ctx.needs_input_grad[:2]
            grad_hidden = torch.empty_like(hidden) if want_hidden else None
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32,
                                      device=weight.device) if want_weight else None
            for first in range(0, hidden.shape[0], ctx.chunk):
                part = slice(first, first + ctx.chunk)
                rows = hidden[part].detach().to(dtype)
                logits = torch.nn.functional.linear(rows, matrix).float()
                logits.div_(temperatures[part, None])
                # d log p(target) / d logits = (onehot(target) - softmax) / temperature
                grad = logits.sub_(logits.logsumexp(-1, keepdim=True)).exp_().neg_()
                grad[torch.arange(grad.shape[0], device=grad.device), targets[part]] += 1
                grad = grad.mul_((grad_logp[part] / temperatures[part])[:, None]).to(dtype)
                if want_hidden:
                    grad_hidden[part] = grad @ matrix
                if want_weight:
                    grad_weight += (grad.T @ rows).float()
            if grad_weight is not None:
                grad_weight = grad_weight.to(weight.dtype)
            return grad_hidden, grad_weight, None, None, None, None, None, None

    _FUNCTIONS[torch] = HeadLogprobs
    return HeadLogprobs
