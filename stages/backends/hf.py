"""The `hf` backend: transformers `generate`, batched, on CPU or GPU.

In: a local model directory (or a hub id the user names explicitly; or a LoRA checkpoint,
served as its base with the adapter's layers on it), conversations, Sampling.
Out: Completions with prompt ids (the chat template rendered with the tools), sampled ids and
their logprobs (log_softmax of the raw logits / temperature at each sampled position).
Guarantees: left-padded micro-batches whose estimated memory stays under a budget, so one long
prompt never pads a whole batch to its length; only the sampled tokens' logprobs are kept (one
vocabulary-sized row per live step, never the logits of every step); the end-of-turn token is
kept in `completion_ids` (training must learn to stop) and skipped in `text`; each
conversation draws its tokens from a generator of its own, seeded with its seed (`RowSampler`),
so its sample does not depend on which conversations share its micro-batch (which follows from
memory and concurrency); the sampling distribution is exactly what `Sampling` says (the model's
own generation defaults, such as a repetition penalty or top-k, are dropped at load).

Options (BackendSpec.options): `max_batch` (conversations per micro-batch, default 16),
`batch_memory_mb` (memory budget of one micro-batch: 512 on CPU, half the free device memory
on GPU), `context_length` (default: the model's max_position_embeddings, or the tokenizer's
model_max_length when smaller).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import replace

from stages.backends import (LOOP_SPAN, BackendSpec, BackendUnavailable, Completion, Message,
                             Sampling, check_local_model, check_model_files, ends_in_loop,
                             render_prompt, unfit_completion)
from stages.train import adapter_base

log = logging.getLogger(__name__)

CPU_BATCH_MEMORY_MB = 512
DEFAULT_CONTEXT_LENGTH = 32768  # the paper's agent context, for a model that states none
# sdpa with a padding mask materialises it per micro-batch as [rows, 1, L, L] (a bool mask and
# its float copy): about 5 bytes per cell, measured on CPU. Unpadded batches get no mask at all.
MASK_BYTES_PER_CELL = 5


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


def release_device_memory(torch, device: str) -> None:
    """Once a model's references are dropped: on a CUDA device, give its memory back to the
    device (for the next stage's engine, or a server waking up). Nothing on a CPU."""
    if device.startswith("cuda"):
        gc.collect()  # models, autograd and optimizers leave reference cycles
        torch.cuda.empty_cache()


class HFBackend:
    name = "hf"

    def __init__(self, spec: BackendSpec):
        torch, transformers = import_torch_transformers()
        check_local_model(spec.model)
        check_model_files(spec.model)
        self.torch, self.transformers = torch, transformers
        self.device = pick_device(spec.device)
        dtype = getattr(torch, spec.dtype) if spec.dtype else (
            torch.bfloat16 if self.device.startswith("cuda") else torch.float32)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(spec.model)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        base = adapter_base(spec.model)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(base or spec.model,
                                                                       dtype=dtype)
        if base:  # a LoRA checkpoint: its adapter on its base, unmerged (peft's layers)
            try:
                import peft  # noqa: F401  (what load_adapter runs on)
            except ImportError:
                raise BackendUnavailable(f"{spec.model} is a LoRA adapter, and serving it "
                                         f"needs peft: pip install peft") from None
            self.model.load_adapter(spec.model)
        self.model.to(self.device).eval()
        self.eos_ids = self._eos_ids()
        self.model.generation_config = transformers.GenerationConfig(
            eos_token_id=sorted(self.eos_ids), pad_token_id=self.tokenizer.pad_token_id)
        # the path as given: records stay identical wherever a run directory is placed
        self.policy = spec.options.get("policy") or os.path.normpath(spec.model)
        self.max_batch = int(spec.options.get("max_batch", 16))
        memory_mb = spec.options.get("batch_memory_mb") or self._default_memory_mb()
        self.batch_memory = int(memory_mb) * 2**20
        self.context_length = int(spec.options.get("context_length") or self._context_length())
        self.token_bytes = self._token_bytes(torch.tensor([], dtype=dtype).element_size())

    def close(self) -> None:
        """Drop the model; on CUDA its memory goes back to the device."""
        self.model = None
        release_device_memory(self.torch, self.device)

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        config_eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
        return {i for i in ids if i is not None}

    def _default_memory_mb(self) -> int:
        if self.device.startswith("cuda"):
            free, _ = self.torch.cuda.mem_get_info(self.torch.device(self.device))
            return free // 2**21
        return CPU_BATCH_MEMORY_MB

    def _context_length(self) -> int:
        config = self.model.config.get_text_config()
        # tokenizers without a limit report a huge sentinel (int(1e30))
        limits = [n for n in (getattr(config, "max_position_embeddings", None),
                              getattr(self.tokenizer, "model_max_length", None))
                  if n and n < 10**7]
        return min(limits) if limits else DEFAULT_CONTEXT_LENGTH

    def _token_bytes(self, element_size: int) -> int:
        """Estimated bytes one token of one row costs: its key/value cache over every layer, plus
        one layer's activations while it is computed (hidden and MLP states, float32)."""
        config = self.model.config.get_text_config()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        cache = 2 * config.num_hidden_layers * kv_heads * head_dim * element_size
        intermediate = getattr(config, "intermediate_size", None) or 4 * config.hidden_size
        return cache + 4 * (2 * config.hidden_size + 2 * intermediate)

    def render(self, messages: list[Message], tools: list[dict] | None,
               enable_thinking: bool | None = None) -> list[int]:
        return render_prompt(self.tokenizer, messages, tools, enable_thinking)

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        """Generate in length-sorted micro-batches bounded by `batch_memory`: padding a short
        prompt to the longest one of a big batch costs more than the extra generate calls."""
        tools = tools or [None] * len(conversations)
        prompts = [self.render(m, t, sampling.enable_thinking)
                   for m, t in zip(conversations, tools)]
        now = time.monotonic()
        results: list[Completion | None] = [
            unfit_completion(prompt, sampling, self.context_length, sampling.deadline(i), now)
            for i, prompt in enumerate(prompts)]
        todo = sorted((i for i, done in enumerate(results) if done is None),
                      key=lambda i: len(prompts[i]))
        for chosen in self.micro_batches(todo, prompts, sampling.max_tokens):
            part = replace(sampling, seed=None, seeds=tuple(sampling.seed_for(i) for i in chosen),
                           deadlines=tuple(sampling.deadline(i) for i in chosen))
            for index, completion in zip(chosen, self.generate_ids([prompts[i] for i in chosen],
                                                                   part)):
                results[index] = completion
        return results

    def micro_batches(self, order: list[int], prompts: list[list[int]], max_tokens: int):
        """Consecutive runs of `order` (sorted by prompt length) whose estimated memory fits the
        budget; a prompt too big for the budget on its own still runs, alone."""
        batch: list[int] = []
        for index in order:
            grown = batch + [index]
            if batch and (len(grown) > self.max_batch
                          or self.batch_bytes([len(prompts[i]) for i in grown], max_tokens)
                          > self.batch_memory):
                yield batch
                grown = [index]
            batch = grown
        if batch:
            yield batch

    def batch_bytes(self, lengths: list[int], max_tokens: int) -> int:
        width = max(lengths)
        mask = MASK_BYTES_PER_CELL * len(lengths) * width * width if min(lengths) < width else 0
        return len(lengths) * (width + max_tokens) * self.token_bytes + mask

    def generate_ids(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                 device=self.device)
        greedy = sampling.temperature <= 0
        recorder = SampledLogprobs(torch, 1.0 if greedy else sampling.temperature)
        deadline = Deadline(torch, width, sampling.deadlines or (None,) * len(prompts))
        loops = Loops(torch, width, len(prompts), {pad, *self.eos_ids})
        processors = [recorder] if greedy else [recorder, self.row_sampler(sampling, len(prompts))]
        # generate runs greedy: a RowSampler has already drawn each row's token
        kwargs = dict(do_sample=False, max_new_tokens=sampling.max_tokens,
                      logits_processor=self.transformers.LogitsProcessorList(processors),
                      stopping_criteria=self.transformers.StoppingCriteriaList(
                          [deadline, loops] if sampling.stop_loops else [deadline]))
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with torch.no_grad():
            sequences = self.model.generate(input_ids=input_ids, attention_mask=attention,
                                            **kwargs)
        sampled = sequences[:, width:]
        logprobs = recorder.logprobs(sampled)
        return [self._completion(prompt, sampled[row].tolist(), logprobs[row].tolist(), sampling,
                                 deadline.cut_at[row], loops.cut_at[row])
                for row, prompt in enumerate(prompts)]

    def row_sampler(self, sampling: Sampling, rows: int) -> "RowSampler":
        """Temperature, then top-k, then top-p, as transformers' sampling warps; each row seeded
        with its conversation's seed (none without per-request seeds: torch's own generator)."""
        transformers = self.transformers
        warpers = [transformers.TemperatureLogitsWarper(sampling.temperature)]
        if sampling.top_k > 0:  # 0 (and slime's -1): off
            warpers.append(transformers.TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            warpers.append(transformers.TopPLogitsWarper(sampling.top_p))
        seeds = [sampling.one(row).engine_seed for row in range(rows)]
        return RowSampler(self.torch, warpers, seeds, self.device)

    def _completion(self, prompt: list[int], ids: list[int], logprobs: list[float],
                    sampling: Sampling, late_at: int | None, loop_at: int | None) -> Completion:
        end, finish = len(ids), "length"
        # a criterion that stopped this row did so after its token number late_at / loop_at
        cuts = [(at, why) for at, why in ((late_at, "timeout"), (loop_at, "repetition"))
                if at is not None]
        if cuts:
            end, finish = min(cuts)
        for index, token in enumerate(ids[:end]):
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


class SampledLogprobs:
    """A logits processor that keeps log_softmax(logits / temperature) at each sampled token.

    Processors run before sampling, so each call holds its step's distribution until the next
    call (or `logprobs`) sees which token was sampled from it: one vocabulary-sized row per
    batch row is alive at a time. It sits before generate's temperature/top-k/top-p warpers
    (transformers appends those after custom processors), so it sees the raw logits: these are
    the contract's logprobs, before truncation, and what a forward pass recomputes."""

    def __init__(self, torch, temperature: float):
        self.torch, self.temperature = torch, temperature
        self.pending = None
        self.steps: list = []

    def __call__(self, input_ids, scores):
        if self.pending is not None:
            self._take(input_ids[:, -1])
        self.pending = self.torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _take(self, tokens) -> None:
        self.steps.append(self.pending.gather(-1, tokens[:, None])[:, 0])
        self.pending = None

    def logprobs(self, sampled):
        """[rows, steps] logprobs of the `sampled` ids ([rows, steps], prompt excluded)."""
        if len(self.steps) < sampled.shape[1]:
            self._take(sampled[:, len(self.steps)])
        return self.torch.stack(self.steps[:sampled.shape[1]], dim=1).cpu()


class RowSampler:
    """The last logits processor: warps the logits, draws each row's next token from that row's
    own generator, and leaves the drawn token the only one a greedy step can take. One generator
    for the whole micro-batch (generate's own sampling) would make a row's tokens depend on the
    rows beside it. The draw is torch's own (`multinomial`), row by row, as generate's is."""

    def __init__(self, torch, warpers: list, seeds: list[int | None], device: str):
        self.torch, self.warpers = torch, warpers
        self.generators = [None if seed is None else torch.Generator(device).manual_seed(seed)
                           for seed in seeds]

    def __call__(self, input_ids, scores):
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        probs = self.torch.softmax(scores.float(), dim=-1)
        drawn = self.torch.stack([self.torch.multinomial(row, 1, generator=generator)
                                  for row, generator in zip(probs, self.generators)])
        return self.torch.full_like(scores, -float("inf")).scatter_(1, drawn, 0.0)


class Loops:
    """A stopping criterion: a row stops once its sampled tokens end in a loop
    (`ends_in_loop`). `cut_at[row]` is how many tokens the row had generated then. A row that
    ended (its last token a pad or an end of turn) is padded, not looping."""

    def __init__(self, torch, width: int, rows: int, ended: set[int]):
        self.torch, self.width, self.ended = torch, width, ended
        self.cut_at: list[int | None] = [None] * rows

    def __call__(self, input_ids, scores, **kwargs):
        generated = input_ids.shape[1] - self.width
        # a loop is judged on the last LOOP_SPAN tokens only: each step reads at most those
        start = max(self.width, input_ids.shape[1] - LOOP_SPAN)
        for row, cut in enumerate(self.cut_at):
            if cut is not None:
                continue
            tail = input_ids[row, start:].tolist()
            if tail[-1] not in self.ended and ends_in_loop(tail):
                self.cut_at[row] = generated
        return self.torch.tensor([cut is not None for cut in self.cut_at],
                                 device=input_ids.device)


class Deadline:
    """A stopping criterion: a row stops once the clock passes its deadline (None: never).
    `cut_at[row]` is how many tokens the row had generated when it was stopped."""

    def __init__(self, torch, width: int, deadlines: tuple[float | None, ...]):
        self.torch, self.width = torch, width
        self.deadlines = list(deadlines)
        self.cut_at: list[int | None] = [None] * len(deadlines)

    def __call__(self, input_ids, scores, **kwargs):
        now, generated = time.monotonic(), input_ids.shape[1] - self.width
        for row, deadline in enumerate(self.deadlines):
            if deadline is not None and now >= deadline and self.cut_at[row] is None:
                self.cut_at[row] = generated
        return self.torch.tensor([cut is not None for cut in self.cut_at],
                                 device=input_ids.device)
