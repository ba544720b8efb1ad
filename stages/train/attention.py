"""Attention over packed rows without a [T, T] mask: what train-grpo's models attend with.

In: the query, key and value of one packed row (several sequences side by side, as
stages/train/packing.py lays them out) and the row's sequence boundaries (`cu_seq_lens_q`, the
cumulative lengths: [0, len_1, len_1 + len_2, ..., T]), handed to the model's forward as
keyword arguments that transformers passes through to every attention layer.
Out: each sequence's causal attention over itself alone, in the layout transformers' attention
functions return ([1, T, heads, head_dim]).
Guarantees: no [T, T] mask exists and no score across two sequences is computed:
- on CUDA in bf16/fp16 (fp32 inputs under autocast are cast first, as SDPA casts them), one
  `torch.nn.attention.varlen.varlen_attn` call (flash attention over variable-length
  sequences; grouped KV heads natively where torch has `enable_gqa`, 2.13 on, else repeated for
  the call);
- elsewhere (CPU, fp32, a torch without varlen), one causal `scaled_dot_product_attention` per
  sequence, with grouped KV heads native;
the numbers equal a forward of each sequence on its own (tests/stages/train/test_attention.py).
`register(transformers)` adds the function to transformers' AttentionInterface under NAME; a
model built with `attn_implementation=NAME` then builds no mask at all
(transformers' masking_utils returns None for an attention it has no mask function for).
"""

from __future__ import annotations

import inspect

NAME = "spade_packed"


def register(transformers) -> str:
    """NAME, registered with transformers (idempotent): pass it as `attn_implementation`."""
    transformers.AttentionInterface.register(NAME, packed_attention)
    return NAME


def boundaries(torch, lengths: list[int], device) -> dict:
    """The keyword arguments a packed row's forward takes: cumulative lengths (int32, as the
    flash kernels want them) and the longest sequence."""
    cumulative = [0]
    for length in lengths:
        cumulative.append(cumulative[-1] + length)
    cu = torch.tensor(cumulative, dtype=torch.int32, device=device)
    longest = max(lengths, default=0)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
            "max_length_k": longest}


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                     scaling: float | None = None, cu_seq_lens_q=None, max_length_q=None,
                     sliding_window=None, **kwargs):
    """transformers' attention signature: query [1, heads, T, d], key and value
    [1, kv_heads, T, d]; returns ([1, T, heads, d], None)."""
    import torch

    if attention_mask is not None:
        raise ValueError(f"{NAME} attention takes sequence boundaries, not a mask: build the "
                         f"model's inputs with stages.train.attention.boundaries")
    if sliding_window is not None:
        raise NotImplementedError(f"{NAME} attention has no sliding window; this model uses one")
    if dropout:
        raise NotImplementedError(f"{NAME} attention has no dropout (train-grpo runs without)")
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} attention takes one packed row, got a batch of "
                         f"{query.shape[0]}")
    if query.is_cuda and torch.is_autocast_enabled("cuda"):
        # what SDPA does under autocast: one fp32 model (fp32 norms make q and k fp32) then
        # attends in bf16 through the same kernel an FSDP2 one does
        dtype = torch.get_autocast_dtype("cuda")
        query, key, value = (t.to(dtype) for t in (query, key, value))
    length = query.shape[2]
    cu = cu_seq_lens_q if cu_seq_lens_q is not None else \
        torch.tensor([0, length], dtype=torch.int32, device=query.device)
    longest = max_length_q if max_length_q is not None else length
    if _varlen_fits(torch, query):
        out = _varlen(torch, query[0], key[0], value[0], cu, longest, scaling)
    else:
        out = _per_sequence(torch, query, key, value, cu, scaling)
    return out.unsqueeze(0), None


def _varlen_fits(torch, query) -> bool:
    return query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and \
        _varlen_function() is not None


def _varlen_function():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch before 2.10
        return None
    return varlen_attn


def _varlen(torch, query, key, value, cu, longest: int, scaling):
    """query [heads, T, d], key and value [kv_heads, T, d] -> [T, heads, d]."""
    varlen_attn = _varlen_function()
    extra = {}
    groups = query.shape[0] // key.shape[0]
    if groups > 1:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            extra["enable_gqa"] = True
        else:  # torch 2.11-2.12: one KV head per query head
            key, value = (t.repeat_interleave(groups, dim=0) for t in (key, value))
    # window (-1, 0): every earlier position of the sequence, no later one (causal)
    return varlen_attn(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
                       cu, cu, longest, longest, scale=scaling, window_size=(-1, 0), **extra)


def _per_sequence(torch, query, key, value, cu, scaling):
    """One causal attention per sequence; query [1, heads, T, d] -> [T, heads, d]."""
    from torch.nn.functional import scaled_dot_product_attention

    edges = cu.tolist()
    gqa = query.shape[1] != key.shape[1]
    parts = [scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b],
                                          is_causal=True, scale=scaling, enable_gqa=gqa)
             for a, b in zip(edges, edges[1:]) if b > a]
    return torch.cat(parts, dim=2)[0].transpose(0, 1)
