"""What the trainer's tests share: multi-turn plays as the rollout stage records them (whose
prompts extend each other, or whose template rewrote history, or that the env broke) and log p
under a policy. Import it after `pytest.importorskip("torch")`."""

import random

import torch

from stages.records import Failure, Rollout, Turn
from stages.train.samples import Sample


def loss_logprobs(policy, samples, model=None):
    with torch.no_grad():
        values, _ = policy.logprobs(model or policy.model, policy.pack(samples))
    return values


EOS = 3


def multi_turn_play(seed=0, turns=3, rewrite_history=False, reward=1.0):
    """A play whose prompts grow by the last completion and an observation, as a chat template
    renders them; `rewrite_history` changes an earlier turn in later prompts, as templates
    that drop earlier reasoning do."""
    rng = random.Random(seed)
    prompt = [1, 50, 51, 52, 2]
    played = []
    for turn in range(turns):
        completion = [rng.randrange(10, 1500) for _ in range(rng.randrange(2, 7))] + [EOS]
        played.append(Turn(action="a", prompt_ids=list(prompt), completion_ids=completion,
                           logprobs=[rng.uniform(-3, -0.5) for _ in completion]))
        observation = [1, rng.randrange(10, 1500), rng.randrange(10, 1500), 2]
        prompt = prompt + completion + observation
        if rewrite_history and turn == 0:
            prompt[len(played[0].prompt_ids)] = 7  # the first completion, rewritten
    return Rollout(env_id="env_m", seed=seed, reward=reward, turns=played,
                   meta={"temperature": 0.8})


def per_turn(play, advantage):
    return [Sample.of_turn("agent", t.prompt_ids, t.completion_ids, t.logprobs,
                           advantage, 0.8, play.id) for t in play.turns]


def crashed(play, outcome="program_error"):
    """`play` as the rollout stage records one the env broke: its last turn (the step that
    failed) keeps the agent's completion and has no observation; reward 0, ok false."""
    last = play.turns[-1].model_copy(update={"observation": "", "reward": 0.0}) \
        if play.turns else None
    return play.model_copy(update={
        "id": "", "ok": False, "outcome": outcome, "reward": 0.0, "terminated": False,
        "error": Failure(type=f"env.{outcome}", msg="boom"),
        "turns": play.turns[:-1] + [last] if last else []})


def env_fault_group(outcome="program_error"):
    plays = [multi_turn_play(seed=s, reward=r) for s, r in enumerate([1.0, 0.0, 1.0])]
    broken = crashed(multi_turn_play(seed=3, reward=1.0), outcome)
    return plays, Rollout.model_validate(broken.model_dump())  # a fresh id, as read
