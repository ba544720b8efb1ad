"""Micro-batches for train-grpo: sequences packed by tokens, logprobs only where loss is.

In: training sequences (token ids, the positions whose tokens carry loss, a sampling
temperature each) and a token budget per micro-batch.
Out: packed rows (several sequences side by side in one row, each with its own position ids
from 0, so the model's mask keeps them apart: no padding), and per-token log p (and entropy)
of the loss tokens only.
Guarantees:
- a micro-batch holds at most `budget` tokens, except a single sequence longer than that, which
  gets one of its own (a sequence is never split);
- the output head runs on the hidden states of loss positions only, a chunk of them at a time
  (LOGIT_ELEMENTS // vocabulary positions), under activation checkpointing: no [positions,
  vocabulary] tensor larger than one chunk exists, in the forward pass or the backward pass;
- the numbers equal a plain forward of each sequence on its own (tested to 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

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
                  tensor(temperatures, torch.float32), counts)


def loss_logprobs(torch, model, packed: Packed, autocast: bool, with_entropy: bool = False,
                  chunk: int | None = None):
    """log p of every loss token of `packed` under `model` ([N], in the packed order), and its
    entropy (no graph: a logged statistic) when asked. Differentiable when grad is enabled."""
    decoder = model.get_decoder()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        hidden = decoder(input_ids=packed.ids, position_ids=packed.positions,
                         use_cache=False).last_hidden_state[0]
    return head_logprobs(torch, model.get_output_embeddings(),
                         hidden.index_select(0, packed.predictors), packed.targets,
                         packed.temperatures, autocast, with_entropy, chunk)


def head_logprobs(torch, head, hidden, targets, temperatures, autocast: bool,
                  with_entropy: bool = False, chunk: int | None = None):
    """log p of `targets` (and entropy) from the hidden states that predict them, through the
    output head a chunk of positions at a time."""
    from torch.utils.checkpoint import checkpoint

    chunk = chunk or max(1, LOGIT_ELEMENTS // head.weight.shape[0])
    logps, entropies = [], []
    for first in range(0, hidden.shape[0], chunk):
        part = slice(first, first + chunk)
        args = (hidden[part], targets[part], temperatures[part])
        if torch.is_grad_enabled():
            # backward recomputes this chunk's logits instead of keeping them
            logp, entropy = checkpoint(_head_logprobs, torch, head, autocast, with_entropy,
                                       *args, use_reentrant=False)
        else:
            logp, entropy = _head_logprobs(torch, head, autocast, with_entropy, *args)
        logps.append(logp)
        entropies.append(entropy)
    empty = hidden.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(logps) if logps else empty
    entropy = (torch.cat(entropies) if logps else empty) if with_entropy else None
    return logp, entropy


def _head_logprobs(torch, head, autocast, with_entropy, hidden, targets, temperatures):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = head(hidden)
    # in place where autograd allows it: every [positions, vocabulary] copy counts here
    logits = logits.float().div_(temperatures[:, None])
    normaliser = logits.logsumexp(-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = (logits - normaliser[:, None]).exp_()
            entropy = normaliser - probs.mul_(logits).sum(-1)
    return logp, entropy
