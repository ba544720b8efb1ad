"""The starter tier (the quickstart's env pool): every game passes validation, the shipped shard is
what validation makes of the files, and each game pays what the quickstart's learning relies on:
1 for the option the observation names, 0 for another option, -1 for a reply naming none, where
the reply's first letter picks the option. The examples tier: one valid env per skill, each
shown whole by the memory (a designer's worked example is never a program cut mid-class)."""

import pytest

from sandbox.jail import Worker
from stages import memory, seed_library
from stages import validate as stage
from stages.records import Validation, dumps
from stages.shards import Stats, read
from stages.skills import SKILLS

OPTIONS = ("a", "b", "c")


def starter_envs():
    return list(read([str(seed_library.STARTER_SHARD)]))


def test_starter_tier_passes_validation_and_matches_the_shipped_shard(nsjail_ok):
    fresh = list(stage.run(seed_library.designs(seed_library.starter_files()),
                           stage.Config(seed=0), Stats()))
    assert [(r.check, r.error.msg) for r in fresh if isinstance(r, Validation)] == []
    assert [dumps(r) for r in starter_envs()] == [dumps(r) for r in fresh], \
        "stages/seed_library/starter/envs.jsonl is stale: run `just seeds`"
    assert len({r.skill for r in fresh}) == len(fresh) and all(r.max_turns == 1 for r in fresh)


@pytest.mark.parametrize("env", starter_envs(), ids=lambda env: env.class_name)
def test_the_first_letter_picks_an_option_and_only_the_named_one_wins(env, nsjail_ok):
    with Worker() as worker:
        assert worker.call("load", source=env.source).ok
        for seed in range(6):
            worker.call("reset", seed=seed)
            answer = worker.call("solution").result[0]
            right = answer.removeprefix("\\boxed{")[0]
            wrong = next(option for option in OPTIONS if option != right)
            replies = ((answer, 1.0), (f"{right.upper()}, I think", 1.0),
                       (f"\\boxed{{{wrong}}}", 0.0), ("\\boxed{42}", -1.0), ("", -1.0))
            for reply, reward in replies:
                worker.call("reset", seed=seed)
                observation, paid, terminated, _, _ = worker.call("step", action=reply).result
                assert (paid, terminated) == (reward, True), (env.class_name, seed, reply,
                                                              observation)


def test_examples_tier_is_one_valid_env_per_skill_each_whole_in_a_memory_snippet(nsjail_ok):
    fresh = list(stage.run(seed_library.designs(seed_library.example_files()),
                           stage.Config(seed=0), Stats()))
    assert [(r.check, r.error.msg) for r in fresh if isinstance(r, Validation)] == []
    shipped = list(read([str(seed_library.EXAMPLES_SHARD)]))
    assert [dumps(r) for r in shipped] == [dumps(r) for r in fresh], \
        "stages/seed_library/examples/envs.jsonl is stale: run `just seeds`"
    assert sorted((r.domain, r.skill) for r in fresh) == \
        sorted((domain, skill) for domain, skills in SKILLS.items() for skill in skills)
    for entry, env in zip(memory.seed(shipped), shipped):
        assert entry.snippet == env.source, f"{env.class_name} is cut in the memory's snippet"
