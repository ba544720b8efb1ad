"""train-grpo: one GRPO update of the shared policy from both roles' samples.

In: `rollout` records (agent samples: the no-hint plays; not those of an env a `judgement`
found a shortcut, stages/judge.py), `regret` records (designer advantages) with the `design`
records they score (designer samples, usually from k rounds earlier), and the current model
directory.
Out: an HF checkpoint `step-NNNNNN/` (model, tokenizer, optimizer state, trainer_state.json) and
one `train` record per optimizer step. What each part guarantees is in its module's docstring.

The modules, from records to checkpoint:
  config      Config: the settings of a run, as the CLI or a resident trainer's job gives them
  samples     which records train as which samples (one sequence per play), with what advantage
  grpo        the objective: PPO-clip with asymmetric bounds, TIS, the k3 KL, loss weights
  loop        run: the optimizer steps of a round, the checkpoint it writes, resume, pruning
  policy      Policy: the model on this rank, its optimizer, LoRA, offload, log p, its save
  packing     micro-batches packed by tokens; log p only at loss positions, a chunk at a time
  attention   attention over packed rows without a [T, T] mask
  parallel    the rank layout: ranks, FSDP2 over the model, each step's work per rank
  checkpoint  how a step's ranks build the policy, fill it and write it back (whole, LoRA)
  offload     HostAdamW: AdamW with its state in host memory (imports torch)
  plan        the memory plan of a recipe: each stage's GPUs and what it holds on each
  ranks       the torchrun ranks of `--nproc N` and of a resident trainer (`spade trainer`)

Outside this package, import from `stages.train` what `__all__` names, never a module of it
by its own path (tests/test_house.py checks it). Importing the package loads none of its
modules: each name is imported from its module on first use (`__getattr__`). The engines
(stages/backends) take the LoRA checkpoint helpers from here in processes that have vLLM but not
spade's own dependencies (tests/stages/backends/test_vllm_cpu.py), so asking for those loads
checkpoint and what it imports (stdlib only), as before the trainer was a package; torchrun runs
`python -m stages.train.ranks` without a copy of it imported first. No module here imports
torch at import time but offload, which policy imports only when AdamW goes to host memory;
spade_cli imports this package inside the functions that need it, so `spade --help` loads none
of it.
"""

from importlib import import_module

# what spade_cli and the rest of stages take from the trainer -> the module that defines it
_FROM = {
    # train-grpo (spade_cli/train_grpo.py): the run, its settings and their choices
    "Config": "config", "run": "loop", "check_start": "policy", "BATCH_UNITS": "loop",
    "LOSS_NORMS": "grpo", "OFFLOADS": "plan",
    # the error of an update that went non-finite (exit 65, spade_cli/errors.py)
    "Diverged": "policy",
    # checkpoints: which to keep (spade eval, --keep-last), what a LoRA one sits on (backends)
    "STATE_FILE": "checkpoint", "KEEP_FILE": "loop", "prune_checkpoints": "loop",
    "start_model": "loop", "adapter_base": "checkpoint", "adapter_rank": "checkpoint",
    "refuse_lora_in_server_mode": "checkpoint",
}
# whole modules: the rank layout, the memory plan (`spade run --plan`), the trainer's ranks
_MODULES = ("parallel", "plan", "ranks")

__all__ = ["Config", "run", "check_start", "BATCH_UNITS", "LOSS_NORMS", "OFFLOADS", "Diverged",
           "STATE_FILE", "KEEP_FILE", "prune_checkpoints", "start_model", "adapter_base",
           "adapter_rank", "refuse_lora_in_server_mode", "parallel", "plan", "ranks"]


def __getattr__(name: str):
    """A name of `__all__`, imported from its module the first time it is asked for."""
    if name in _MODULES:
        return import_module(f"{__name__}.{name}")
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_FROM[name]}"), name)
    globals()[name] = value
    return value
