"""The `vllm` backend's engine thread when vLLM itself misbehaves (no vLLM needed).

A stand-in `vllm` module gives the backend an engine that samples one token per step and can be
told to fail; the real engine is exercised in test_vllm_cpu.py. What a user relies on: an engine
that dies fails every pending and later request with BackendUnavailable (exit 69) instead of
leaving a rollout waiting forever, and a request vLLM refuses fails alone.
"""

from __future__ import annotations

import sys
import types
from dataclasses import replace
from types import SimpleNamespace

import pytest

from stages.backends import BackendSpec, BackendUnavailable, Sampling

MESSAGES = [{"role": "user", "content": "Observation: the door is locked."}]
TOKEN = 7  # any id the tiny tokenizer decodes


class FakeEngine:
    """One token per running request per step; `failure` makes the next step raise it."""

    def __init__(self):
        self.model_config = SimpleNamespace(max_model_len=1024)
        self.live: dict[str, list] = {}
        self.failure: Exception | None = None
        self.engine_core = SimpleNamespace(shut_down=False)
        self.engine_core.shutdown = lambda: setattr(self.engine_core, "shut_down", True)
        self.adapters: list = []  # each request's lora_request
        self.params: list = []  # each request's SamplingParams

    def add_request(self, request_id, prompt, params, lora_request=None):
        if params.max_tokens > 500:
            raise ValueError("refused by the engine")
        self.adapters.append(lora_request)
        self.params.append(params)
        self.live[request_id] = [params, 0]

    def step(self):
        if self.failure is not None:
            raise self.failure
        outputs = []
        for request_id, state in list(self.live.items()):
            state[1] += 1
            finished = state[1] >= state[0].max_tokens
            if finished:
                del self.live[request_id]
            sample = SimpleNamespace(token_ids=[TOKEN],
                                     logprobs=[{TOKEN: SimpleNamespace(logprob=-1.0)}],
                                     finish_reason="length" if finished else None)
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished,
                                           outputs=[sample]))
        return outputs

    def abort_request(self, request_ids):
        for request_id in request_ids:
            self.live.pop(request_id, None)

    def has_unfinished_requests(self):
        return bool(self.live)


@pytest.fixture
def fake_vllm(monkeypatch):
    """The stand-in `vllm` module; `started` collects the arguments each LLM got."""
    fake = types.ModuleType("vllm")
    fake.started = []
    fake.LLM = lambda **kwargs: fake.started.append(kwargs) or SimpleNamespace(
        llm_engine=FakeEngine())
    fake.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    fake.sampling_params = types.ModuleType("vllm.sampling_params")
    fake.sampling_params.RequestOutputKind = SimpleNamespace(DELTA="delta")
    lora = types.ModuleType("vllm.lora.request")
    lora.LoRARequest = lambda *args: SimpleNamespace(args=args)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", fake.sampling_params)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", lora)
    return fake


@pytest.fixture
def backend(fake_vllm, tiny_model):
    from stages.backends.vllm import VLLMBackend

    chosen = VLLMBackend(BackendSpec(name="vllm", model=tiny_model))
    yield chosen
    chosen.close()


@pytest.mark.parametrize("per_request_seed,seeds", [(True, [5, 6, 7]), (False, [None] * 3)])
def test_each_request_hands_vllm_its_seed_unless_per_request_seeds_are_off(
        backend, per_request_seed, seeds):
    """vLLM gives a seeded request its own generator; without per-request seeds
    (`--sampling-seed none`) SamplingParams.seed is None and vLLM samples from its own state."""
    sampling = Sampling(max_tokens=2, seed=5, per_request_seed=per_request_seed)
    backend.chat([MESSAGES, MESSAGES], sampling)
    backend.submit(MESSAGES, replace(sampling, seed=7)).result(timeout=30)
    assert [params.seed for params in backend.llm.llm_engine.params] == seeds


def test_a_lora_checkpoint_runs_its_base_with_the_adapter_on_every_request(
        fake_vllm, tiny_model, tmp_path):
    import json
    import os
    import shutil

    from stages.backends.vllm import VLLMBackend

    adapter = tmp_path / "step-000001"  # what a LoRA train-grpo step holds, weights aside
    shutil.copytree(tiny_model, adapter, ignore=shutil.ignore_patterns("*.safetensors",
                                                                       "config.json"))
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 12}))
    (adapter / "trainer_state.json").write_text(json.dumps({"base_model": tiny_model}))
    chosen = VLLMBackend(BackendSpec(name="vllm", model=str(adapter)))
    engine = chosen.llm.llm_engine
    try:
        for seed in range(2):
            chosen.submit(MESSAGES, Sampling(max_tokens=2, seed=seed)).result(timeout=30)
    finally:
        chosen.close()
    started = fake_vllm.started[-1]
    assert started["model"] == tiny_model and started["enable_lora"] is True
    assert started["max_lora_rank"] == 16 and started["max_loras"] == 1  # vLLM takes 16, not 12
    assert [request.args for request in engine.adapters] == \
        [("spade-adapter", 1, os.path.abspath(adapter))] * 2


def test_an_engine_failure_fails_pending_and_later_requests(backend):
    done = backend.submit(MESSAGES, Sampling(max_tokens=3, seed=0)).result(timeout=30)
    assert done.completion_ids == [TOKEN] * 3 and done.logprobs == [-1.0] * 3
    backend.llm.llm_engine.failure = RuntimeError("device lost")
    pending = backend.submit(MESSAGES, Sampling(max_tokens=400, seed=1))
    with pytest.raises(BackendUnavailable, match="device lost"):
        pending.result(timeout=30)
    later = backend.submit(MESSAGES, Sampling(max_tokens=3, seed=2))
    assert later.done()
    with pytest.raises(BackendUnavailable, match="device lost"):
        later.result()


def test_a_request_the_engine_refuses_fails_alone(backend):
    refused, fine = (backend.submit(MESSAGES, Sampling(max_tokens=n, seed=0)) for n in (600, 2))
    with pytest.raises(ValueError, match="refused by the engine"):
        refused.result(timeout=30)
    assert fine.result(timeout=30).completion_ids == [TOKEN] * 2


def test_close_shuts_the_engine_down_and_lets_it_go(backend):
    engine = backend.llm.llm_engine
    backend.close()
    assert engine.engine_core.shut_down and backend.llm is None
    backend.close()  # twice is harmless: a stage's end and an error path may both close


@pytest.mark.gpu
def test_the_real_engine_on_cuda_samples_what_it_is_asked(tmp_path):
    """Where vLLM and a GPU are: the backend's engine thread over vLLM itself, one seed's
    tokens the same alone or in a batch, one logprob per sampled token."""
    pytest.importorskip("vllm", reason="vLLM is not installed in this interpreter")
    from stages.backends.vllm import VLLMBackend
    from stages.models import tiny

    model = tiny(tmp_path / "tiny", seed=0, hidden=128)  # head_dim 32: vLLM's kernels need it
    engine = VLLMBackend(BackendSpec(name="vllm", model=str(model),
                                     options={"gpu_memory_utilization": 0.3}))
    try:
        sampling = Sampling(max_tokens=8, seed=3, temperature=1.0)
        alone = engine.submit(MESSAGES, sampling).result(timeout=300)
        batch = engine.chat([MESSAGES, [{"role": "user", "content": "Another door."}]], sampling)
    finally:
        engine.close()
    assert 0 < len(alone.completion_ids) <= 8
    assert len(alone.logprobs) == len(alone.completion_ids)
    assert batch[0].completion_ids == alone.completion_ids
