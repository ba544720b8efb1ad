"""rollout: last_boxed is linear with the old results; a play cut at --max-tokens says so."""

import random
import time
from concurrent.futures import Future

from sandbox.jail import Limits, Sandbox
from stages import rollout as stage
from stages.backends import Completion
from stages.backends.scripted import ScriptedBackend
from tests.stages.test_rollout import env


def quadratic_last_boxed(text):
    """The implementation before it was made linear (6.7 s at 32k characters)."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, index = 0, start + len("\\boxed{") - 1
        for index in range(index, len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                return text[start + len("\\boxed{"):index]
        start = text.rfind("\\boxed{", 0, start)
    return None


def test_last_boxed_gives_the_old_results_on_random_text():
    rng = random.Random(0)
    parts = ["\\boxed{", "{", "}", "a", "\\", "boxed", " ", "}}", "\\boxed{x}"]
    for _ in range(20000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 40)))
        assert stage.last_boxed(text) == quadratic_last_boxed(text), text


def test_last_boxed_is_fast_on_32k_unbalanced_boxes():
    text = ("\\boxed{" * 5000)[:32000]  # the worst case: every start scans to the end
    started = time.perf_counter()
    assert stage.last_boxed(text) is None
    assert time.perf_counter() - started < 0.1
    text = "\\boxed{" * 4000 + "answer" + "}" * 10
    assert stage.last_boxed(text) == "answer"
    assert stage.last_boxed("x" * 1_000_000 + "\\boxed{{a}b}") == "{a}b"


class CutBackend(ScriptedBackend):
    """Every completion ends at max_tokens."""

    def submit(self, messages, sampling, tools=None):
        done = super().submit(messages, sampling, tools).result()
        future = Future()
        future.set_result(Completion(done.text, done.prompt_ids, done.completion_ids,
                                     done.logprobs, finish_reason="length"))
        return future


CFG = stage.Config(plays=2, concurrency=2, sandbox=Sandbox(limits=Limits(call_timeout=2)))


def test_a_play_cut_at_max_tokens_is_recorded_so(nsjail_ok):
    backend = CutBackend(lambda messages, tools: "Let me think. \\boxed{knock}")
    plays = list(stage.run([env()], backend, CFG))
    for play in plays:
        assert play.outcome == "ok" and len(play.turns) == 1 and play.truncated
        assert play.turns[-1].finish_reason == "length"
        assert play.meta["cut_at_max_tokens"] is True


def test_a_play_that_ends_otherwise_is_not_flagged(nsjail_ok):
    backend = ScriptedBackend(lambda messages, tools: "\\boxed{knock}")
    plays = list(stage.run([env()], backend, CFG))
    assert all(play.meta["cut_at_max_tokens"] is False and play.reward == 1.0 for play in plays)
