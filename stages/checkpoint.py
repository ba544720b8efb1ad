"""train-grpo's checkpoints: how a step's ranks build the policy, fill it, and write it back.

In: a model directory (the initial model, or a checkpoint an earlier step wrote); the policy
(whole, or sharded by stages/parallel.py) and its optimizer.
Out: `step-NNNNNN/`, holding
- the export, what engines and every backend load: HF config, tokenizer and safetensors
  weights in the dtype the policy computes in (bf16 on a GPU, fp32 elsewhere), written by the
  main rank from weights gathered one tensor at a time;
- `trainer/`: the fp32 master weights and the optimizer state as a
  `torch.distributed.checkpoint`, each rank writing and reading its own shards (a different
  number of ranks reshards on load);
- `trainer_state.json` (the caller's).
Guarantees: a step directory exists only complete: everything lands in `step-N.tmp/` and is
renamed once every rank has written, so a kill mid-save leaves a .tmp that the rerun discards
(it trains again and writes what an uninterrupted run writes). A step resumes from the fp32
master weights, never from the export (a bf16 export would swallow a 1e-6 update). A model is
built with its parameters on the meta device and filled once, so no rank holds a full copy it
then throws away: trainer state is read shard by shard; a model without it (the initial model)
is read by the main rank and broadcast into the shards. The anchor and the LoRA base are read
from the export. Checkpoints from before `trainer/` (an optimizer.pt beside fp32 weights) still
resume with their optimizer state.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

from stages import parallel

TRAINER_DIR = "trainer"
STATE_FILE = "trainer_state.json"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"  # before trainer/: the whole optimizer state, by name


@contextmanager
def parameters_on_meta(torch):
    """Parameters registered inside take no memory (meta device); buffers stay real, since
    some (rotary frequencies) are computed at construction and are in no checkpoint."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def skeleton(torch, transformers, model_dir: str, dtype):
    """The model of `model_dir` with meta parameters and real buffers, and those buffers."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    with parameters_on_meta(torch):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model, {name: buffer.clone() for name, buffer in model.named_buffers()}


def materialize(model, buffers: dict, parameter_device: str, buffer_device: str) -> None:
    """Room for the (possibly sharded) parameters, tied ones still one, and the buffers back
    in place."""
    first: dict[int, str] = {}
    ties = [(name, first.setdefault(id(param), name))
            for name, param in model.named_parameters(remove_duplicate=False)]
    model.to_empty(device=parameter_device)  # on a whole model, this unties tied weights
    for name, tied_to in ties:
        if name != tied_to:
            module, leaf = _owner(model, name)
            module._parameters[leaf] = model.get_parameter(tied_to)
    for name, value in buffers.items():
        module, leaf = _owner(model, name)
        module._buffers[leaf] = value.to(buffer_device)


def _owner(model, name: str):
    owner, _, leaf = name.rpartition(".")
    return (model.get_submodule(owner) if owner else model), leaf


def has_trainer_state(model_dir: str) -> bool:
    return (Path(model_dir) / TRAINER_DIR / ".metadata").exists()


def fill(torch, transformers, model, optimizer, model_dir: str, layout: parallel.Layout,
         trainer_state: bool = True) -> None:
    """Weights (and optimizer state, given an optimizer) from `model_dir`: its trainer state
    where it has one and `trainer_state` allows, else its export."""
    if trainer_state and has_trainer_state(model_dir):
        return _read_trainer_state(model, optimizer, Path(model_dir) / TRAINER_DIR, layout)
    _read_export(torch, transformers, model, model_dir, layout)
    legacy = Path(model_dir) / LEGACY_OPTIMIZER_FILE
    if optimizer is not None and trainer_state and legacy.exists():
        moments = torch.load(legacy, map_location="cpu", weights_only=True)
        _set_full_optimizer_state(model, optimizer, _named(moments, model), layout)


def _read_trainer_state(model, optimizer, path: Path, layout: parallel.Layout) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    with _one_process_quietly():
        dcp.load(state, checkpoint_id=str(path), no_dist=not parallel.grouped())
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


def _read_export(torch, transformers, model, model_dir: str, layout: parallel.Layout) -> None:
    """The export's weights, read once (by the main rank) and broadcast into the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    weights = {}
    if layout.main:
        weights = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype="auto").state_dict()
    if not parallel.is_sharded(model):
        model.load_state_dict(weights)
        return
    set_model_state_dict(model, weights, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))


def _named(moments: dict, model) -> dict:
    """Legacy optimizer state keyed by parameter name; the oldest files keyed it by position
    among the trainable parameters."""
    if not any(isinstance(key, int) for key in moments.get("state", {})):
        return moments
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    return {"state": {names[i]: v for i, v in moments["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                             for g in moments["param_groups"]]}


def _set_full_optimizer_state(model, optimizer, state: dict, layout: parallel.Layout) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True) if parallel.is_sharded(model) else None
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=options)


@contextmanager
def _one_process_quietly():
    """torch.distributed.checkpoint warns that it assumes one process, even when told so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def save(torch, model, optimizer, tokenizer, out: Path, state: dict, export_dtype,
         layout: parallel.Layout) -> None:
    """`out` written whole or not at all (see the module docstring); every rank calls it.
    `optimizer` None: a model whose trainable part is not kept (a LoRA run, merged)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict)

    tmp = out.with_name(out.name + ".tmp")
    if layout.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    parallel.barrier(layout)
    if optimizer is not None:
        with _one_process_quietly():
            dcp.save({"model": get_model_state_dict(model),
                      "optimizer": get_optimizer_state_dict(model, optimizer)},
                     checkpoint_id=str(tmp / TRAINER_DIR), no_dist=not parallel.grouped())
    weights = export_weights(torch, model, export_dtype, layout)
    if layout.main:
        model.save_pretrained(tmp, state_dict=weights)
        _set_config_dtype(tmp, export_dtype)
        tokenizer.save_pretrained(tmp)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    parallel.barrier(layout)


def export_weights(torch, model, dtype, layout: parallel.Layout) -> dict:
    """The model's weights whole, floating ones in `dtype`, on the main rank's CPU ({} on the
    others): gathered one tensor at a time, so no rank holds more than the export itself. A
    tied weight (an output head that is the embedding) is written once, under its first name,
    as save_pretrained writes a whole model."""
    weights, seen = {}, set()
    for name, tensor in model.state_dict(keep_vars=True).items():  # keep_vars: tied are one
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        whole = parallel.full_tensor(tensor.detach())
        if layout.main:
            weights[name] = (whole.to(dtype) if whole.is_floating_point() else whole).cpu()
    return weights


def _set_config_dtype(folder: Path, dtype) -> None:
    """save_pretrained records the dtype of the weights it was handed a model of (fp32
    masters); engines load the export in the dtype its config names."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    path.write_text(json.dumps(config, indent=2) + "\n")


def prune_trainer_state(step_dir: Path) -> None:
    """What only the newest checkpoint keeps: the state a next step resumes from."""
    shutil.rmtree(step_dir / TRAINER_DIR, ignore_errors=True)
    (step_dir / LEGACY_OPTIMIZER_FILE).unlink(missing_ok=True)
