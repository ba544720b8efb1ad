"""AdamW with its state in host memory: AdamW's update and AdamW's state, the moments off the
device that holds the weights."""

import copy

import pytest

torch = pytest.importorskip("torch")

from stages.train.offload import HostAdamW  # noqa: E402

SETTINGS = dict(lr=1e-2, betas=(0.9, 0.98), weight_decay=0.1)


def weights(device="cpu"):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(device))
            for shape in ((7, 3), (5,))]


def steps(optimizer, params, count: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.device)
        optimizer.step()


def test_the_update_is_adamws_own():
    ours, theirs = weights(), weights()
    steps(HostAdamW(ours, **SETTINGS), ours, 5)
    steps(torch.optim.AdamW(theirs, foreach=False, **SETTINGS), theirs, 5)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def test_adamws_state_loads_and_carries_on_as_adamw_would():
    """The same keys and values both ways: a checkpoint written under one offload setting
    resumes under another."""
    start = weights()
    adamw = torch.optim.AdamW(start, foreach=False, **SETTINGS)
    steps(adamw, start, 3)
    ours, theirs = ([torch.nn.Parameter(p.detach().clone()) for p in start] for _ in range(2))
    host = HostAdamW(ours, **SETTINGS)
    host.load_state_dict(copy.deepcopy(adamw.state_dict()))
    again = torch.optim.AdamW(theirs, foreach=False, **SETTINGS)
    again.load_state_dict(copy.deepcopy(host.state_dict()))  # loading shares the tensors
    steps(host, ours, 2, seed=7)
    steps(again, theirs, 2, seed=7)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def test_state_of_another_model_is_refused():
    host = HostAdamW(weights(), **SETTINGS)
    other = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **SETTINGS)
    with pytest.raises(ValueError, match="parameter counts differ"):
        host.load_state_dict(other.state_dict())


@pytest.mark.gpu
def test_on_a_gpu_the_moments_live_in_host_memory_and_the_weights_stay():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    ours, theirs = weights("cuda"), weights("cuda")
    host = HostAdamW(ours, **SETTINGS)
    steps(host, ours, 3)
    steps(torch.optim.AdamW(theirs, **SETTINGS), theirs, 3)
    assert all(p.is_cuda for p in ours)
    assert all(value.device.type == "cpu" for state in host.state.values()
               for key, value in state.items() if key != "step")
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
