"""The `hf` backend: transformers `generate`, batched, on CPU or GPU.

In: a local model directory (or a hub id the user names explicitly), conversations, Sampling.
Out: Completions with prompt ids (the chat template rendered with the tools), sampled ids and
their logprobs (log_softmax of the raw logits / temperature at each sampled position).
Guarantees: left-padded batches; the end-of-turn token is kept in `completion_ids` (training
must learn to stop) and skipped in `text`; `seed` makes sampling reproducible.
"""

from __future__ import annotations

import logging
import os

from stages.backends import (BackendSpec, BackendUnavailable, Completion, Message, Sampling,
                             check_local_model, render_prompt)

log = logging.getLogger(__name__)


def import_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise BackendUnavailable(
            f"the hf backend needs torch and transformers ({exc.name} is missing): "
            "pip install torch==2.13.0 && pip install 'spade-selfplay[hf]'") from None
    # stderr is for spade's own progress and summary lines, not per-shard loading bars.
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return torch, transformers


def pick_device(requested: str | None) -> str:
    torch, _ = import_torch_transformers()
    if requested and requested.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailable(f"device {requested} requested but no CUDA device is available")
    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


class HFBackend:
    name = "hf"

    def __init__(self, spec: BackendSpec):
        torch, transformers = import_torch_transformers()
        check_local_model(spec.model)
        self.torch = torch
        self.device = pick_device(spec.device)
        dtype = getattr(torch, spec.dtype) if spec.dtype else (
            torch.bfloat16 if self.device.startswith("cuda") else torch.float32)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(spec.model)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = transformers.AutoModelForCausalLM.from_pretrained(spec.model, dtype=dtype)
        self.model.to(self.device).eval()
        # the path as given: records stay identical wherever a run directory is placed
        self.policy = spec.options.get("policy") or os.path.normpath(spec.model)
        self.max_batch = int(spec.options.get("max_batch", 16))
        self.eos_ids = self._eos_ids()

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        config_eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
        return {i for i in ids if i is not None}

    def render(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        return render_prompt(self.tokenizer, messages, tools)

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        """Generate in length-sorted micro-batches: padding a short prompt to the longest one
        of a big batch costs more than the extra generate calls."""
        tools = tools or [None] * len(conversations)
        prompts = [self.render(m, t) for m, t in zip(conversations, tools)]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Completion | None] = [None] * len(prompts)
        for number, first in enumerate(range(0, len(order), self.max_batch)):
            chosen = order[first:first + self.max_batch]
            seed = None if sampling.seed is None else sampling.seed + number
            chunk = self.generate_ids([prompts[i] for i in chosen],
                                      Sampling(**{**sampling.__dict__, "seed": seed}))
            for index, completion in zip(chosen, chunk):
                results[index] = completion
        return results

    def generate_ids(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        torch = self.torch
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                 device=self.device)
        greedy = sampling.temperature <= 0
        kwargs = dict(do_sample=not greedy, max_new_tokens=sampling.max_tokens,
                      output_logits=True, return_dict_in_generate=True, pad_token_id=pad,
                      eos_token_id=sorted(self.eos_ids))
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k or None)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with torch.no_grad():
            out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        sampled = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()
        scale = 1.0 if greedy else sampling.temperature
        logprobs = torch.log_softmax(logits / scale, dim=-1).gather(
            -1, sampled.unsqueeze(-1)).squeeze(-1)
        return [self._completion(prompt, sampled[row].tolist(), logprobs[row].tolist(), sampling)
                for row, prompt in enumerate(prompts)]

    def _completion(self, prompt: list[int], ids: list[int], logprobs: list[float],
                    sampling: Sampling) -> Completion:
        end, finish = len(ids), "length"
        for index, token in enumerate(ids):
            if token in self.eos_ids:
                end, finish = index + 1, "stop"
                break
        if finish == "length":  # rows that hit a stop string early are padded after it
            pad = self.tokenizer.pad_token_id
            while end and ids[end - 1] == pad:
                end -= 1
        ids, logprobs = ids[:end], logprobs[:end]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if finish == "length" and any(text.endswith(s) for s in sampling.stop):
            finish = "stop"
        return Completion(text, prompt, ids, logprobs, finish)
