"""AdamW with its state in host memory: train-grpo's `offload = "optimizer"`.

In: a model's trainable parameters (whole tensors, or this rank's FSDP2 shards) with their
gradients, on a GPU (or anywhere).
Out: `HostAdamW`, an optimizer whose two moments live in host memory and whose update runs on
the CPU one tensor at a time: the gradient is copied down, the new weights copied back up. The
GPU keeps the fp32 weights and their gradients and saves the 8 bytes a parameter of AdamW's
moments, as the reference's `--optimizer-cpu-offload` does; the step moves 12 bytes a
parameter over PCIe, once an optimizer step.
Guarantees: the update is torch.optim.AdamW's own single-tensor arithmetic, and the state is
AdamW's (the keys `step`, `exp_avg`, `exp_avg_sq`, sharded like the weights), so a checkpoint
written under one offload setting resumes under any other (tests/stages/train/test_offload.py).
This module imports torch: import it where a trainer is being built.
"""

from __future__ import annotations

import torch
from torch.optim.adamw import adamw

from stages.train import parallel

HOST = "cpu"


class HostAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float):
        # AdamW's own parameter group (its flags too): torch.distributed.checkpoint asks a
        # checkpoint for every key of the loading optimizer's groups, so both must have the same
        adamw_group = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=lr,
                                        betas=betas, weight_decay=weight_decay).defaults
        super().__init__(params, adamw_group)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(step=torch.tensor(0.0), exp_avg=_zeros_on_host(param),
                                 exp_avg_sq=_zeros_on_host(param))
                weights = parallel.local_tensor(param)
                host = weights.to(HOST)  # the same tensor when it is there already
                adamw([host], [parallel.local_tensor(param.grad).to(HOST)],
                      [parallel.local_tensor(state["exp_avg"])],
                      [parallel.local_tensor(state["exp_avg_sq"])], [], [state["step"]],
                      foreach=False, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                      weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
                if host is not weights:
                    weights.copy_(host)

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, but the moments stay in (or move to) host memory: torch's own would put
        them beside the weights."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"optimizer state of {len(saved_groups)} parameter groups, this "
                             f"optimizer has {len(self.param_groups)}")
        self.state.clear()
        for group, saved in zip(self.param_groups, saved_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("optimizer state of another model: the parameter counts "
                                 "differ")
            group.update({key: saved[key] for key in self.defaults if key in saved})
            for param, key in zip(group["params"], saved["params"]):
                if key in state_dict["state"]:
                    self.state[param] = {
                        name: value if name == "step" else value.to(HOST)
                        for name, value in state_dict["state"][key].items()}


def _zeros_on_host(param):
    """Zeros shaped like `param` (like its shard, for a sharded one) in host memory."""
    zeros = torch.zeros_like(parallel.local_tensor(param), device=HOST)
    if not hasattr(param, "device_mesh"):
        return zeros
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(zeros, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())
