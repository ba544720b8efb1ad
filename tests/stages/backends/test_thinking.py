"""The per-role thinking switch: `Sampling.enable_thinking` reaches the chat template (hf and
vllm render it themselves) or the server (openai: `chat_template_kwargs`); unset, the template
keeps its own default."""

from stages.backends import BackendSpec, Sampling, render_prompt
from stages.backends.openai import OpenAIBackend
from stages.models import CHAT_TEMPLATE

# Qwen3's pattern in miniature: thinking unless the caller passes enable_thinking=false, which
# pre-fills an empty think block.
THINKING_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif -%}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif -%}")
CONVERSATION = [{"role": "user", "content": "Observation: a locked door."}]


def rendered(tokenizer, **switch) -> str:
    return tokenizer.decode(render_prompt(tokenizer, CONVERSATION, None, **switch))


def test_enable_thinking_reaches_the_template_and_unset_keeps_its_default(tiny_backend,
                                                                          monkeypatch):
    tokenizer = tiny_backend.tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", THINKING_TEMPLATE)
    default, on, off = (rendered(tokenizer), rendered(tokenizer, enable_thinking=True),
                        rendered(tokenizer, enable_thinking=False))
    assert default == on and default.endswith("<|im_start|>assistant\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_the_hf_backend_generates_from_the_switched_prompt(tiny_backend, monkeypatch):
    monkeypatch.setattr(tiny_backend.tokenizer, "chat_template", THINKING_TEMPLATE)
    off, on = (tiny_backend.chat([CONVERSATION], Sampling(max_tokens=2, seed=0,
                                                          enable_thinking=flag))[0]
               for flag in (False, None))
    assert off.prompt_ids == tiny_backend.render(CONVERSATION, None, False)
    assert on.prompt_ids == tiny_backend.render(CONVERSATION, None)
    assert len(off.prompt_ids) > len(on.prompt_ids)


def test_the_openai_backend_sends_chat_template_kwargs_only_when_set(monkeypatch):
    backend = OpenAIBackend(BackendSpec(name="openai", model="m", base_url="http://127.0.0.1:9"))
    bodies = []

    def post(path, body, *_timeout):
        bodies.append(body)
        return {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}

    monkeypatch.setattr(backend, "_post", post)
    for flag in (True, False, None):
        backend.chat([CONVERSATION], Sampling(enable_thinking=flag, top_k=20))
    assert [b.get("chat_template_kwargs") for b in bodies] == [
        {"enable_thinking": True}, {"enable_thinking": False}, None]
    assert all(b["top_k"] == 20 for b in bodies)
