"""Packed attention: each sequence attends within itself, with no [T, T] mask, on every device."""

import json
import random

import pytest

torch = pytest.importorskip("torch")

from stages.train import attention  # noqa: E402
from stages.records import Rollout, Turn  # noqa: E402

LENGTHS = [7, 1, 12, 5]  # one sequence of a single token: a boundary case of causal masks


def qkv(dtype=torch.float32, device="cpu", heads=4, kv_heads=2, dim=16):
    gen = torch.Generator().manual_seed(0)
    tokens = sum(LENGTHS)
    return [torch.randn(1, n, tokens, dim, generator=gen).to(device, dtype).requires_grad_()
            for n in (heads, kv_heads, kv_heads)]


class Grouped(torch.nn.Module):
    num_key_value_groups = 2


def each_on_its_own(query, key, value):
    """Plain causal attention of every sequence alone, KV heads repeated: [1, T, heads, d]."""
    outputs, start = [], 0
    for length in LENGTHS:
        part = slice(start, start + length)
        k, v = (t[:, :, part].repeat_interleave(query.shape[1] // key.shape[1], dim=1)
                for t in (key, value))
        scores = (query[:, :, part] @ k.transpose(-1, -2)).float() / query.shape[-1] ** 0.5
        causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1).to(v.dtype)
        outputs.append(weights @ v)
        start += length
    return torch.cat(outputs, dim=2).transpose(1, 2)


def compare(dtype, device, tolerance):
    inputs = qkv(dtype, device)
    bounds = attention.boundaries(torch, LENGTHS, device)
    packed, none = attention.packed_attention(Grouped(), *inputs, None, **bounds)
    assert none is None and packed.shape == (1, sum(LENGTHS), 4, 16)
    direction = torch.randn(packed.shape, generator=torch.Generator().manual_seed(1)).to(
        device, dtype)
    (packed * direction).sum().backward()
    ours = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    plain = each_on_its_own(*inputs)
    (plain * direction).sum().backward()
    torch.testing.assert_close(packed, plain, atol=tolerance, rtol=tolerance)
    for got, expected in zip(ours, (t.grad for t in inputs)):
        torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)


def test_sequences_attend_only_within_themselves_forward_and_backward():
    compare(torch.float32, "cpu", 1e-5)


@pytest.mark.gpu
def test_the_varlen_kernel_on_cuda_matches_each_sequence_on_its_own():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert attention._varlen_function() is not None, "this torch has no varlen_attn"
    compare(torch.bfloat16, "cuda", 2e-2)
    # one fp32 model under autocast (train-grpo on one GPU) takes the same kernel
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, _ = attention.packed_attention(Grouped(), *qkv(torch.float32, "cuda"), None,
                                            **attention.boundaries(torch, LENGTHS, "cuda"))
    assert out.dtype == torch.bfloat16


def test_a_mask_or_a_sliding_window_is_refused_not_ignored():
    inputs = qkv()
    mask = torch.ones(1, 1, sum(LENGTHS), sum(LENGTHS), dtype=torch.bool)
    with pytest.raises(ValueError, match="boundaries, not a mask"):
        attention.packed_attention(Grouped(), *inputs, mask)
    with pytest.raises(NotImplementedError, match="sliding window"):
        attention.packed_attention(Grouped(), *inputs, None, sliding_window=4)


def test_the_trainers_model_attends_packed_and_its_export_names_no_such_attention(tiny_model,
                                                                                   tmp_path):
    """The export is what engines load: it must not ask for an attention only spade has."""
    import transformers

    from stages.train import checkpoint

    model, buffers = checkpoint.skeleton(torch, transformers, tiny_model, torch.float32)
    assert model.config._attn_implementation == attention.NAME
    checkpoint.materialize(model, buffers, "cpu", "cpu")
    model.save_pretrained(tmp_path)
    assert "attn" not in (tmp_path / "config.json").read_text()


@pytest.mark.slow
def test_a_16k_token_packed_micro_batch_peaks_near_one_play_per_pass(tiny_model, tmp_path):
    """16 plays of 1024 tokens in one 16,384-token row, under gradient checkpointing (as every
    recipe trains): what is added is what grows with the tokens (one layer's recomputed
    activations and their gradients, about 0.2 GB here). With transformers' [T, T] mask the
    same step peaked at 2.06 GB against 0.48 GB one play a pass (+1.58 GB), and took 57 s
    instead of 7; a boolean [T, T] mask alone is 256 MiB. The bound is on what the row adds,
    not on the ratio of whole-process peaks: the process's own base moves with the
    transformers version (the ratio is 1.41-1.46 under 5.25, 1.43-1.60 under 5.20)."""
    import subprocess
    import sys

    rng = random.Random(0)
    plays = tmp_path / "plays.jsonl"
    with plays.open("w") as out:
        for seed in range(16):
            prompt = [rng.randrange(10, 2000) for _ in range(896)]
            completion = [rng.randrange(10, 2000) for _ in range(128)]
            turn = Turn(action="a", prompt_ids=prompt, completion_ids=completion,
                        logprobs=[-1.0] * len(completion))
            out.write(json.dumps(Rollout(env_id=f"env_{seed % 2}", seed=seed,
                                         reward=float(seed % 3 == 0),
                                         turns=[turn]).to_dict()) + "\n")
    peaks = {}
    for tokens in (1024, 16384):
        done = subprocess.run(
            [sys.executable, "-m", "spade_cli", "train-grpo", str(plays), "-m", tiny_model,
             "--ckpt-dir", str(tmp_path / str(tokens)), "--micro-batch-tokens", str(tokens),
             "--gradient-checkpointing"],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        (record,) = [json.loads(line) for line in done.stdout.splitlines()]
        assert record["stats"]["forward_tokens"] == 16 * 1024
        peaks[tokens] = record["meta"]["peak_memory_bytes"]
    assert peaks[16384] - peaks[1024] < 384 * 2 ** 20, peaks
