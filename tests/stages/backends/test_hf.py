"""The hf backend on the tiny model: token bookkeeping, seeds, stops, tool rendering."""

import math

from stages.backends import Sampling

CONVERSATIONS = [[{"role": "user", "content": "Observation: a locked door. \\boxed{}"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]]


def test_decoded_completion_ids_equal_the_text(tiny_backend):
    for done in tiny_backend.chat(CONVERSATIONS, Sampling(max_tokens=24, seed=1)):
        assert tiny_backend.tokenizer.decode(done.completion_ids, skip_special_tokens=True) \
            == done.text
        assert len(done.logprobs) == len(done.completion_ids) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in done.logprobs)
        assert done.finish_reason in ("stop", "length")


def test_prompt_ids_are_the_rendered_chat_template(tiny_backend):
    done = tiny_backend.chat(CONVERSATIONS[:1], Sampling(max_tokens=4, seed=0))[0]
    assert done.prompt_ids == tiny_backend.render(CONVERSATIONS[0], None)
    text = tiny_backend.tokenizer.decode(done.prompt_ids)
    assert text.startswith("<|im_start|>user\nObservation: a locked door.")
    assert text.endswith("<|im_start|>assistant\n")


def test_same_seed_same_samples_other_seed_differs(tiny_backend):
    first = tiny_backend.chat(CONVERSATIONS, Sampling(max_tokens=16, seed=7))
    again = tiny_backend.chat(CONVERSATIONS, Sampling(max_tokens=16, seed=7))
    other = tiny_backend.chat(CONVERSATIONS, Sampling(max_tokens=16, seed=8))
    assert [c.completion_ids for c in first] == [c.completion_ids for c in again]
    assert [c.completion_ids for c in first] != [c.completion_ids for c in other]


def test_logprobs_match_a_fresh_forward_pass(tiny_backend):
    import torch

    done = tiny_backend.chat(CONVERSATIONS[:1], Sampling(temperature=0.7, max_tokens=8, seed=3))[0]
    ids = torch.tensor([done.prompt_ids + done.completion_ids])
    with torch.no_grad():
        logits = tiny_backend.model(ids).logits[0, len(done.prompt_ids) - 1:-1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(
        -1, torch.tensor(done.completion_ids)[:, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(done.logprobs), atol=1e-4)


def test_max_tokens_gives_length_finish(tiny_backend):
    done = tiny_backend.chat(CONVERSATIONS[:1], Sampling(max_tokens=3, seed=0))[0]
    if done.finish_reason == "length":
        assert len(done.completion_ids) == 3


def test_tools_render_into_the_prompt(tiny_backend):
    tool = {"type": "function", "function": {"name": "lookup_order", "description": "Find it.",
                                             "parameters": {"type": "object", "properties": {}}}}
    done = tiny_backend.chat(CONVERSATIONS[:1], Sampling(max_tokens=2, seed=0), tools=[[tool]])[0]
    assert "lookup_order" in tiny_backend.tokenizer.decode(done.prompt_ids)


def test_greedy_is_deterministic_without_seed(tiny_backend):
    a = tiny_backend.chat(CONVERSATIONS, Sampling(temperature=0, max_tokens=8))
    b = tiny_backend.chat(CONVERSATIONS, Sampling(temperature=0, max_tokens=8))
    assert [x.completion_ids for x in a] == [x.completion_ids for x in b]
