"""train-grpo's checkpoints: how a step's ranks build the policy, fill it, and write it back.

In: a model directory (the initial model, or a checkpoint an earlier step wrote); the policy
(whole, or sharded by stages/train/parallel.py) and its optimizer.
Out: `step-NNNNNN/`, holding
- the export, what engines and every backend load: HF config, tokenizer and safetensors
  weights in the dtype the policy computes in (bf16 on a GPU, fp32 elsewhere), written by the
  main rank from weights gathered one tensor at a time;
- `trainer/`: the fp32 master weights and the optimizer state as a
  `torch.distributed.checkpoint`, each rank writing and reading its own shards (a different
  number of ranks reshards on load);
- `trainer_state.json` (the caller's).
A LoRA step holds no model of its own: its export is the PEFT adapter folder
(`adapter_config.json`, `adapter_model.safetensors` in fp32), tokenizer and `trainer_state.json`
naming the base (`base_model`: the model the run's first LoRA step started from, never merged
into); `trainer/` holds the adapter weights and their AdamW state only. Every backend loads the
base and puts the adapter on it (`adapter_base`).
Guarantees: a step directory exists only complete: everything lands in `step-N.tmp/` and is
renamed once every rank has written, so a kill mid-save leaves a .tmp that the rerun discards
(it trains again and writes what an uninterrupted run writes). A step resumes from the fp32
master weights, never from the export (a bf16 export would swallow a 1e-6 update). A model is
built with its parameters on the meta device and filled once, so no rank holds a full copy it
then throws away: trainer state is read shard by shard; a model without it (the initial model)
is read by the main rank and broadcast into the shards. The anchor and the LoRA base are read
from the export. A resident trainer (stages/train/ranks.py) fills the next round's policy (and
KL anchor) from the host copy it kept of the checkpoint it wrote (and of the anchor), not from
disk, and lets each part of that copy go once it is in the model. Checkpoints from before `trainer/` (an optimizer.pt beside fp32 weights) still
resume with their optimizer state. Under a write root (`spade run`) a checkpoint is never
written through a symlink out of it (stages/trust.py).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

from stages import trust
from stages.train import attention, parallel

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
    """The model of `model_dir` with meta parameters and real buffers, and those buffers. It
    attends over packed rows through stages/train/attention.py (no [T, T] mask)."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    with parameters_on_meta(torch):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attention.register(transformers))
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


ADAPTER_CONFIG = "adapter_config.json"
BASE_KEY = "base_model"  # in a LoRA step's trainer_state.json: the model its adapter is on


def adapter_base(model_dir: str) -> str | None:
    """The base model of a LoRA checkpoint (an adapter folder), None for a whole model: the base
    its trainer state records, else the one peft recorded in the adapter's config."""
    folder = Path(model_dir)
    if not (folder / ADAPTER_CONFIG).is_file():
        return None
    state = folder / STATE_FILE
    recorded = json.loads(state.read_text()).get(BASE_KEY) if state.is_file() else None
    return recorded or json.loads((folder / ADAPTER_CONFIG).read_text()).get(
        "base_model_name_or_path")


def adapter_rank(model_dir: str) -> int:
    return int(json.loads((Path(model_dir) / ADAPTER_CONFIG).read_text())["r"])


def refuse_lora_in_server_mode(serving: bool, options: dict, where: str) -> None:
    """A recipe with a `[serve]` table must not train LoRA: the run's server loads each new
    checkpoint as whole weights (stages/serve.py), and a LoRA step has only an adapter. Raises
    RecordError (exit 65). `options`: the train-grpo stage's table."""
    from stages.records import RecordError

    rank = options.get("lora-rank", options.get("lora_rank", 0))
    if serving and isinstance(rank, int) and rank > 0:
        raise RecordError("lora-rank: LoRA checkpoints are adapters, and server mode ([serve]) "
                          "reloads whole weights: drop [serve] (in-process engines serve base "
                          "plus adapter) or set lora-rank = 0", where)


def fill(torch, transformers, model, optimizer, model_dir: str, layout: parallel.Layout,
         trainer_state: bool = True, kept: dict | None = None) -> None:
    """Weights (and optimizer state, given an optimizer) from `kept` (what `host_state` took
    of the policy that wrote `model_dir`, in the same layout) if given, else from `model_dir`:
    its trainer state where it has one and `trainer_state` allows, else its export. For a peft
    `model` (the adapter of the LoRA checkpoint `model_dir` on its base), the adapter's: without
    trainer state (pruned) peft has read its fp32 weights already, and AdamW starts anew."""
    if kept is not None:
        from torch.distributed.checkpoint.state_dict import (set_model_state_dict,
                                                             set_optimizer_state_dict)

        # popped: each host copy is let go as soon as it is in the model
        set_model_state_dict(model, kept.pop("model"))
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, kept.pop("optimizer"))
        return
    if trainer_state and has_trainer_state(model_dir):
        return _read_trainer_state(model, optimizer, Path(model_dir) / TRAINER_DIR, layout)
    if is_adapter(model):
        return
    _read_export(torch, transformers, model, model_dir, layout)
    legacy = Path(model_dir) / LEGACY_OPTIMIZER_FILE
    if optimizer is not None and trainer_state and legacy.exists():
        moments = torch.load(legacy, map_location="cpu", weights_only=True)
        _set_full_optimizer_state(model, optimizer, _named(moments, model), layout)


def host_state(model, optimizer=None) -> dict:
    """This rank's shards of the weights (and optimizer state, given an optimizer), in host
    memory: what a resident trainer keeps between rounds, so the GPUs are free for the engine.
    Shards offloaded to the host already are kept as they are, not copied."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(cpu_offload=True)
    state = {"model": get_model_state_dict(model, options=options)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=options)
    return state


def _read_trainer_state(model, optimizer, path: Path, layout: parallel.Layout) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = _state_options(model)
    state = {"model": get_model_state_dict(model, options=options)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=options)
    with _one_process_quietly():  # it raises on any key asked for that the checkpoint lacks
        dcp.load(state, checkpoint_id=str(path), no_dist=not parallel.grouped())
    set_model_state_dict(model, state["model"], options=options)
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)


def is_adapter(model) -> bool:
    """A peft model: its trainer state is the adapter alone, its export the adapter folder."""
    return hasattr(model, "peft_config")


def _state_options(model):
    """The trainer state of a model: every weight, or for LoRA the adapter alone (the frozen
    base comes from its own folder); loading it then leaves the base as it is."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    adapter = is_adapter(model)
    return StateDictOptions(ignore_frozen_params=adapter, strict=not adapter)


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
         layout: parallel.Layout, device: str = "cpu") -> None:
    """`out` written whole or not at all (see the module docstring); every rank calls it.
    A peft `model` (LoRA) is written as its adapter, on the base `state[BASE_KEY]` names.
    `device`: where the export's weights travel to the main rank (export_weights)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict)

    tmp = out.with_name(out.name + ".tmp")
    if layout.main:
        trust.check_write(out)  # the checkpoint folder and its temp never through a link out
        trust.check_write(tmp)  # of the run directory (stages/trust.py)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    parallel.barrier(layout)
    options = _state_options(model)
    with _one_process_quietly():
        dcp.save({"model": get_model_state_dict(model, options=options),
                  "optimizer": get_optimizer_state_dict(model, optimizer, options=options)},
                 checkpoint_id=str(tmp / TRAINER_DIR), no_dist=not parallel.grouped())
    adapter = is_adapter(model)
    weights = {} if adapter else export_weights(torch, model, export_dtype, layout, device)
    if layout.main:
        if adapter:  # LoRA trains on one rank: peft writes the adapter folder (fp32 weights)
            for config in model.peft_config.values():
                config.base_model_name_or_path = state[BASE_KEY]
            model.save_pretrained(tmp)
        else:
            model.save_pretrained(tmp, state_dict=weights)
            _set_config_dtype(tmp, export_dtype)
        tokenizer.save_pretrained(tmp)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    parallel.barrier(layout)


def export_weights(torch, model, dtype, layout: parallel.Layout, device: str = "cpu") -> dict:
    """The model's weights whole, floating ones in `dtype`, on the main rank's CPU ({} on the
    others): each tensor cast where it lies, then gathered to the main rank alone, one at a
    time through `device` (parallel.gather_to_main), so no rank but the main one receives the
    model and none holds more than the export itself. A tied weight (an output head that is
    the embedding) is written once, under its first name, as save_pretrained writes a whole
    model."""
    weights, seen = {}, set()
    for name, tensor in model.state_dict(keep_vars=True).items():  # keep_vars: tied are one
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        value = tensor.detach()
        whole = parallel.gather_to_main(torch, value.to(dtype) if value.is_floating_point()
                                        else value, layout, device)
        if layout.main:
            weights[name] = whole.cpu()
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
