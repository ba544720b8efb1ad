"""The parallel layout of train-grpo: ranks, FSDP2 over the model, each step's work per rank.

In: the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous), or none of
it (one process); a causal LM; a step's micro-batches with their token counts.
Out: a `Layout` (this process's rank and device), `shard(model)` (fully_shard on every
transformer block, then on the root), each rank's share of a step's micro-batches, sums over
ranks, and full (unsharded) state for the checkpoint writer.
Guarantees: the GRPO math does not change with the layout. Every rank weighs its tokens by the
whole step's normalisation and gradients are summed over ranks, not averaged, so N ranks make
the update one rank makes (up to the order of float sums); every rank runs the same number of
forward/backward passes (one with less work replays a micro-batch at weight 0), so no
collective waits for a rank that has nothing to do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

LOSS_METHOD = "loss_logprobs"  # the model method train-grpo calls instead of forward


@dataclass(frozen=True)
class Layout:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.world > 1


def from_environment() -> Layout:
    """The layout torchrun (or `spade train-grpo --nproc`) gave this process."""
    return Layout(rank=int(os.environ.get("RANK", 0)), world=int(os.environ.get("WORLD_SIZE", 1)),
                  local_rank=int(os.environ.get("LOCAL_RANK", 0)))


def start(torch, layout: Layout, device: str, fsdp: bool = False) -> str:
    """Join the process group (nccl on CUDA, gloo on CPU); the device this rank trains on.
    `fsdp`: one process wants FSDP2 too (to offload to the CPU), in a group of its own."""
    if not (layout.sharded or fsdp):
        return device
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    if cuda:
        device = f"cuda:{layout.local_rank}"
        torch.cuda.set_device(device)
    # offloaded shards live on the CPU: their collectives (norms, gathers) need gloo there
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if not dist.is_initialized():
        if layout.sharded:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def grouped() -> bool:
    """Whether this process is in a process group (collectives and sharded state apply)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier(layout: Layout) -> None:
    if layout.sharded:
        import torch.distributed as dist

        dist.barrier()


def stop() -> None:
    import torch.distributed as dist

    if grouped():
        dist.destroy_process_group()


def transformer_blocks(model) -> list:
    decoder = model.get_decoder()
    blocks = getattr(decoder, "layers", None)
    if blocks is None:
        raise NotImplementedError(f"{type(decoder).__name__} has no `layers`: train-grpo cannot "
                                  f"find the transformer blocks to shard")
    return list(blocks)


def shard(torch, model, bf16: bool, offload: bool = False) -> None:
    """FSDP2: each transformer block its own unit, then the root (embeddings, final norm, the
    output head, tied or not). Parameters are gathered in bf16 on a GPU (master weights and
    optimizer state stay fp32 and sharded) and gradients reduced in fp32. `offload`: the
    shards, their gradients and the optimizer step live in host memory (the GPU holds a
    gathered block at a time), for models whose sharded state does not fit the GPUs."""
    from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard,
                                        register_fsdp_forward_method)

    # cast_forward_inputs off: FSDP2 would cast every float it finds in the forward's
    # arguments, dataclasses included, and so score tokens at a bf16 temperature (0.6 becomes
    # 0.6015625); the embeddings make the activations bf16 anyway
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  cast_forward_inputs=False) \
        if bf16 else MixedPrecisionPolicy(cast_forward_inputs=False)
    # pinned host memory speeds the copies, and exists only where there is an accelerator
    offloaded = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else None
    units = transformer_blocks(model) + [model]
    for unit in units:
        fully_shard(unit, mp_policy=policy, offload_policy=offloaded)
    # train-grpo never calls forward(): the root gathers its parameters around this method
    register_fsdp_forward_method(model, LOSS_METHOD)
    for unit in units:
        # each rank's loss already carries the whole step's weights: sum, do not average
        # (and with plain sums, which every backend has: gloo has no pre-multiplied sum)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


def assign(token_counts: list[int], world: int) -> list[list[int]]:
    """Micro-batch indices per rank: the largest first, each to the rank with the fewest
    tokens so far (ties: the lower rank)."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for index in sorted(range(len(token_counts)), key=lambda i: (-token_counts[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        shares[rank].append(index)
        load[rank] += token_counts[index]
    return shares


def sum_over_ranks(torch, values: dict[str, float], layout: Layout,
                   device: str = "cpu") -> dict[str, float]:
    """`device`: where the collective runs (nccl reduces CUDA tensors only)."""
    if not layout.sharded or not values:
        return values
    import torch.distributed as dist

    keys = sorted(values)
    total = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return dict(zip(keys, total.tolist()))


def gather_dicts(part: dict, layout: Layout) -> dict:
    """Every rank's dict merged, on every rank."""
    if not layout.sharded:
        return part
    import torch.distributed as dist

    parts: list = [None] * layout.world
    dist.all_gather_object(parts, part)
    return {k: v for p in parts for k, v in p.items()}


def max_over_ranks(torch, value: int, layout: Layout, device: str = "cpu") -> int:
    if not layout.sharded:
        return value
    import torch.distributed as dist

    total = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return int(total.item())


def gather_to_main(torch, value, layout: Layout, device: str):
    """A weight whole on the main rank, None on the others; every rank calls it. A sharded
    weight (FSDP2 splits dim 0 as torch.chunk does) travels once, each rank's rows to the main
    rank through `device` (a GPU's NCCL where there is one, offloaded shards too), rather than
    to every rank as `full_tensor` would send it."""
    if not hasattr(value, "to_local"):
        return value if layout.main else None
    import torch.distributed as dist
    from torch.distributed.tensor import Shard

    if value.device_mesh.ndim != 1 or tuple(value.placements) != (Shard(0),):
        whole = value.full_tensor()  # a layout FSDP2 does not make: the plain way
        return whole if layout.main else None
    world = value.device_mesh.size()
    rows = [len(part) for part in torch.empty(value.shape[0], device="meta").chunk(world)]
    rows += [0] * (world - len(rows))
    local = value.to_local().to(device)
    if local.shape[0] < max(rows):  # gather takes equal sizes: pad to the largest share
        local = torch.cat([local, local.new_zeros((max(rows) - local.shape[0],
                                                   *local.shape[1:]))])
    group = value.device_mesh.get_group()
    parts = [torch.empty_like(local) for _ in range(world)] if layout.main else None
    dist.gather(local.contiguous(), parts, group=group, group_dst=0)
    return torch.cat([part[:n] for part, n in zip(parts, rows)]) if layout.main else None


def full_tensor(value):
    """A norm or weight as a plain tensor: sharded ones (DTensor) are gathered."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def local_tensor(value):
    return value.to_local() if hasattr(value, "to_local") else value


def is_sharded(model) -> bool:
    """Whether `model` went through `shard` (its state is DTensors, read and set by rank)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
