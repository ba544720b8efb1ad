"""hint: cleaned text lands in the env record; the env keeps its id."""

from stages import hint as stage
from stages import seed_library
from stages.backends.scripted import ScriptedBackend
from stages.shards import read


def test_hint_is_written_without_changing_the_env_id():
    envs = list(read([str(seed_library.ENV_SHARD)]))[:3]
    seen = []

    def respond(messages, tools):
        seen.append(messages[0]["content"])
        return "**Hint:** push crates only from the side facing the target.\n```python\nx=1\n```"

    hinted = list(stage.run(envs, ScriptedBackend(respond), stage.Config()))
    assert [e.id for e in hinted] == [e.id for e in envs]
    assert all(e.hint == "push crates only from the side facing the target." for e in hinted)
    assert envs[0].source in seen[0]
    assert hinted[0].meta["hint"]["completion_ids"]


def test_tool_use_envs_get_the_value_free_prompt():
    envs = [e for e in read([str(seed_library.ENV_SHARD)]) if e.domain == "tool_use"][:1]
    prompts_seen = []
    list(stage.run(envs, ScriptedBackend(lambda m, t: prompts_seen.append(m) or "plan"),
                   stage.Config()))
    assert "placeholders such as <order_id>" in prompts_seen[0][0]["content"]


def test_empty_hint_stays_none():
    assert stage.clean("```python\nprint(1)\n```", 100) is None
    assert stage.clean("Hint: " + "x" * 50, 10) == "x" * 10
