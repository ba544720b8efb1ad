"""design: skill rotation, prompts grounded in corpus and memory, retries, lineage."""


from stages import design as stage
from stages import memory as memory_store
from stages import seed_library
from stages import validate
from stages.backends.scripted import ScriptedBackend
from stages.corpus import Document
from stages.records import Validation
from stages.shards import Stats, read

DOCS = [Document(f"doc_{i}", f"title {i}", f"text about topic {i}") for i in range(30)]
SEED_SOURCE = seed_library.files("game")[0].read_text()


def answer_with_seed_env(messages, tools):
    return f"Here you go.\n```python\n{SEED_SOURCE}```"


def test_skills_rotate_three_of_six_per_env_set():
    rounds = [stage.active_skills("game", r, 3) for r in range(2)]
    assert rounds[0] == ["deduction", "spatial", "arithmetic"]
    assert rounds[1] == ["induction", "planning", "memory"]


def test_consecutive_env_sets_cover_every_skill_whatever_k():
    """Design rounds are 0, k, 2k...: keyed on the round, k = 4 or 8 never rotated."""
    for domain, k in (("game", 4), ("game", 2), ("tool_use", 8)):
        seen = set()
        for design_round in (0, k):
            cfg = stage.Config(domain=domain, round=design_round, every=k)
            seen |= {s.skill for s in stage.fresh_slots(cfg)}
        assert len(seen) == 6, (domain, k, seen)
    assert stage.env_set_index(stage.Config(domain="tool_use", round=16)) == 2  # k = 8
    slots = stage.fresh_slots(stage.Config(batch=24))
    assert [s.skill for s in slots].count("spatial") == 8


# Slot skills of the first env set (round 0, games) for (batch, active skills). The values come
# from running the reference's rule, slot i -> skills[i % len(skills)] (spade-rl/spade
# spade/core/orchestrator.py, the per-game skill in its batch of generations), over the same
# active skills; the per-skill counts follow from them.
DE, SP, AR, IN, PL, ME = "deduction", "spatial", "arithmetic", "induction", "planning", "memory"
REFERENCE_SLOT_SKILLS = {
    # counts 3, 3, 3, 3, 2, 2 (spade's old rule gave 3, 3, 2, 3, 3, 2)
    (16, 6): [DE, SP, AR, IN, PL, ME, DE, SP, AR, IN, PL, ME, DE, SP, AR, IN],
    (24, 3): [DE, SP, AR] * 8,  # 8 each
    (2, 4): [DE, SP],  # arithmetic and induction get no slot
    (6, 4): [DE, SP, AR, IN, DE, SP],  # counts 2, 2, 1, 1
    (5, 2): [DE, SP, DE, SP, DE],  # counts 3, 2
}


def test_slots_take_the_set_skills_in_turn_as_the_reference_does():
    for (batch, count), expected in REFERENCE_SLOT_SKILLS.items():
        slots = stage.fresh_slots(stage.Config(batch=batch, active_skills=count))
        assert [s.skill for s in slots] == expected, (batch, count)
        assert [s.slot for s in slots] == list(range(batch))
    counts = [s.skill for s in stage.fresh_slots(stage.Config(batch=16, active_skills=6))]
    assert [counts.count(skill) for skill in (DE, SP, AR, IN, PL, ME)] == [3, 3, 3, 3, 2, 2]


def test_tool_use_domains_are_the_reference_ten():
    """The reference's ten application areas (retail, travel, telecom, banking, calendar, files,
    shopping cart, support tickets, smart home, project tracker), in our words."""
    assert len(set(stage.APP_DOMAINS)) == 10
    for word in ("retail", "flight", "telecom", "bank", "calendar", "file", "cart", "support",
                 "smart home", "project"):
        assert sum(word in domain for domain in stage.APP_DOMAINS) == 1, word


def test_records_carry_prompt_tokens_logprobs_and_lineage():
    memories = memory_store.seed(list(read([str(seed_library.ENV_SHARD)])))
    cfg = stage.Config(batch=3, seed=5)
    backend = ScriptedBackend(answer_with_seed_env)
    records = list(stage.run(backend, DOCS, memories, cfg, stage.fresh_slots(cfg)))
    assert [r.slot for r in records] == [0, 1, 2]
    assert len({r.corpus_doc for r in records}) == 3  # one document per attempt
    for record in records:
        assert record.completion_ids and len(record.logprobs) == len(record.completion_ids)
        assert record.prompt_ids
        assert f"Target skill: {record.skill}" in record.prompt
        doc = next(d for d in DOCS if d.id == record.corpus_doc)
        assert doc.text in record.prompt
        assert record.policy == "scripted"
    spatial = next(r for r in records if r.skill == "spatial")
    assert spatial.memory_ids and "Environments from earlier rounds" in spatial.prompt


def test_same_seed_reproduces_prompts_and_ids():
    cfg = stage.Config(batch=4, seed=1)
    run = lambda: [r.id for r in stage.run(ScriptedBackend(answer_with_seed_env), DOCS, [], cfg,
                                             stage.fresh_slots(cfg))]
    assert run() == run()


def test_tool_use_prompts_pick_variant_and_domain():
    cfg = stage.Config(domain="tool_use", batch=6, seed=2)
    records = list(stage.run(ScriptedBackend(answer_with_seed_env), DOCS, [], cfg,
                             stage.fresh_slots(cfg)))
    assert all(r.meta["variant"] in stage.TASK_VARIANTS for r in records)
    assert all(r.meta["app_domain"] in r.prompt for r in records)
    assert all("ToolUseBaseEnv" in r.prompt for r in records)


def test_design_output_validates(nsjail_ok):
    cfg = stage.Config(batch=2)
    designs = list(stage.run(ScriptedBackend(answer_with_seed_env), DOCS, [], cfg,
                             stage.fresh_slots(cfg)))
    envs = list(validate.run(designs, validate.Config(), Stats()))
    assert [e.kind for e in envs] == ["env", "env"]
    assert envs[0].parents == [designs[0].id]


def test_retry_designs_only_rejected_slots_with_attempts_left():
    cfg = stage.Config(max_attempts=3)
    rejects = [Validation(check="parse", slot=0, attempt=0, skill="spatial"),
               Validation(check="parse", slot=0, attempt=1, skill="spatial"),
               Validation(check="oracle", slot=4, attempt=2, skill="memory"),
               Validation(check="trivial", slot=5, attempt=0, skill="memory")]
    slots = stage.retry_slots(rejects, cfg)
    assert [(s.slot, s.attempt, s.skill) for s in slots] == [(0, 2, "spatial"), (5, 1, "memory")]


def test_without_a_corpus_the_prompt_never_mentions_a_document():
    """The no-corpus ablation (reference: cmd/ablations/train_no_corpus_30b.sh)."""
    for domain in ("game", "tool_use"):
        cfg = stage.Config(domain=domain, batch=2, seed=3)
        records = list(stage.run(ScriptedBackend(answer_with_seed_env), None, [], cfg,
                                 stage.fresh_slots(cfg)))
        for record in records:
            assert record.corpus_doc is None and "doc_title" not in record.meta
            assert "document" not in record.prompt.lower()
            assert "documentation" not in record.prompt.lower()
            assert "\n\n\n" not in record.prompt
            assert record.prompt.endswith("Answer with the module in a single ```python code "
                                          "block.")
        grounded = list(stage.run(ScriptedBackend(answer_with_seed_env), DOCS, [], cfg,
                                  stage.fresh_slots(cfg)))
        assert all("<document title=" in r.prompt for r in grounded)


def test_rotation_can_be_restricted_to_named_skills():
    """The two-skill ablation rotates over two skills only, both active in every set."""
    pool = ("arithmetic", "induction")
    for design_round in (0, 4, 8):
        cfg = stage.Config(round=design_round, active_skills=2, skills=pool, batch=4)
        assert [s.skill for s in stage.fresh_slots(cfg)] == ["arithmetic", "induction",
                                                              "arithmetic", "induction"]


def answer_naming_the_slot(messages, tools):
    """A reply that differs per prompt, so a design taken from the wrong slot would show."""
    return f"{answer_with_seed_env(messages, tools)}\n# {hash(messages[0]['content'])}"


def test_designs_a_stopped_run_made_are_kept_and_not_asked_for_again():
    cfg = stage.Config(batch=4, seed=6)
    slots = stage.fresh_slots(cfg)
    whole = list(stage.run(ScriptedBackend(answer_naming_the_slot), DOCS, [], cfg, slots))
    backend = ScriptedBackend(answer_naming_the_slot)
    resumed = list(stage.run(backend, DOCS, [], cfg, slots, made=[whole[1], whole[3]]))
    assert backend.calls == 2
    assert [r.id for r in resumed] == [r.id for r in whole]
    stale = whole[0].model_copy(update={"prompt": "a prompt this config no longer writes"})
    again = ScriptedBackend(answer_naming_the_slot)
    assert [r.id for r in stage.run(again, DOCS, [], cfg, slots, made=[stale])] == \
        [r.id for r in whole]
    assert again.calls == 4  # a design whose prompt is not this slot's is asked for again


def test_each_design_is_kept_as_soon_as_it_is_answered_not_in_slot_order():
    """Slot 0 answers last: the other three are kept before it, so a stop while slot 0 is still
    generating loses only slot 0."""
    cfg = stage.Config(batch=4, seed=6)
    slow_first = ScriptedBackend(answer_with_seed_env,
                                 latency=lambda sampling: 0.3 if sampling.seed == first else 0.0)
    first = stage.Sampling(seed=stage.derive_seed(cfg.seed, cfg.round, 0, 2)).seed_for(0)
    kept, yielded = [], []
    for record in stage.run(slow_first, DOCS, [], cfg, stage.fresh_slots(cfg), keep=kept.append):
        yielded.append((record.slot, [k.slot for k in kept]))
    assert [slot for slot, _ in yielded] == [0, 1, 2, 3]
    slot, kept_by_then = yielded[0]
    assert slot == 0 and sorted(kept_by_then[:3]) == [1, 2, 3] and kept_by_then[3] == 0


# -- repair turns --------------------------------------------------------------------------

BROKEN_SOURCE = "import socket\n" + SEED_SOURCE  # a `structure` reject, naming line 1


def broken_until_told(messages, tools):
    """A stand-in designer: its first answer imports socket; told why, it answers fixed."""
    told = len(messages) > 1 and "Failed check" in messages[-1]["content"]
    return f"```python\n{SEED_SOURCE if told else BROKEN_SOURCE}```"


def test_a_repair_continues_the_conversation_with_the_reason_and_is_accepted(nsjail_ok):
    cfg = stage.Config(batch=2, max_attempts=3)
    asked = []
    backend = ScriptedBackend(lambda messages, tools: (asked.append(messages),
                                                       broken_until_told(messages, tools))[1])
    first = list(stage.run(backend, DOCS, [], cfg, stage.fresh_slots(cfg)))
    checked = list(validate.run(first, validate.Config(), Stats()))
    assert [r.kind for r in checked] == ["validation", "validation"]  # 0 accepted before
    repairs = list(stage.run(backend, DOCS, [], cfg, stage.repair_slots(checked, first, cfg)))
    for repair, parent, reject, request in zip(repairs, first, checked, asked[2:]):
        assert (repair.turn, repair.repairs, repair.first_turn) == (2, parent.id, parent.id)
        assert (repair.slot, repair.attempt) == (parent.slot, 1)
        assert request[:2] == [{"role": "user", "content": parent.prompt},
                               {"role": "assistant", "content": parent.completion}]
        said = request[-1]["content"]  # the reason, in the designer's own conversation
        assert "structure" in said and reject.error.msg in said
        assert "`import socket`" in said  # the line the message points at, quoted
        assert repair.prompt == request and repair.parents == [parent.id]
    after = list(validate.run(repairs, validate.Config(), Stats()))
    assert [r.kind for r in after] == ["env", "env"]  # all accepted after one repair
    assert [r.meta["design"] for r in after] == [
        {"turn": 2, "first_turn": parent.id} for parent in first]


def test_a_repair_that_copies_its_parent_is_asked_again_hotter():
    cfg = stage.Config(batch=1, max_attempts=2)
    parent = next(stage.run(ScriptedBackend(broken_until_told), DOCS, [], cfg,
                            stage.fresh_slots(cfg)))
    reject = Validation(check="structure", slot=0, attempt=0, skill=parent.skill,
                        parents=[parent.id], error={"type": "structure", "msg": "line 1: no"})
    answers = iter([parent.completion, f"```python\n{SEED_SOURCE}```"])
    backend = ScriptedBackend(lambda messages, tools: next(answers))
    repair = next(stage.run(backend, DOCS, [], cfg, stage.repair_slots([reject], [parent], cfg)))
    assert backend.calls == 2 and repair.completion.endswith(f"{SEED_SOURCE}```")
    assert repair.meta["copy_retried"] and not repair.meta["copies_parent"]
    assert repair.meta["temperature"] == stage.COPY_TEMPERATURE


def test_a_repair_names_an_exception_the_env_raised_as_the_failure_not_the_checks_rule():
    cfg = stage.Config(batch=1)
    design = next(stage.run(ScriptedBackend(broken_until_told), DOCS, [], cfg,
                            stage.fresh_slots(cfg)))

    def told(message: str, raised: dict | None = None) -> str:
        reject = Validation(check="determinism", slot=0, attempt=0, skill=design.skill,
                            parents=[design.id], error={"type": "determinism", "msg": message},
                            meta={"validation": {"raised": raised} if raised else {}})
        return stage.repair_message(design, reject, cfg)

    crashed = "step raised NameError: name 'nx' is not defined (env.py:9: return nx.path(g))"
    said = told(crashed, {"op": "step", "type": "NameError"})
    assert "step() raised NameError" in said and crashed in said
    assert stage.CHECK_MEANINGS["determinism"] not in said  # not sent after its seeds
    assert stage.CHECK_MEANINGS["determinism"] in told("seed 3 gave two observations")


def test_a_repair_needs_the_design_it_repairs():
    cfg = stage.Config(max_attempts=2)
    reject = Validation(check="parse", slot=0, attempt=0, skill="spatial", parents=["des_x"])
    try:
        stage.repair_slots([reject], [], cfg)
    except KeyError as missing:
        assert missing.args == ("des_x",)
    else:
        raise AssertionError("a repair without its design was planned")


def test_turn_one_designs_keep_the_ids_they_had_before_repairs():
    design = stage.Design(domain="game", skill="spatial", prompt="p", completion="c")
    assert "turn" not in design.identity() and design.conversation_id == design.id
    repaired = design.model_copy(update={"turn": 2, "repairs": design.id,
                                         "first_turn": design.id, "id": ""})
    assert repaired.identity()["turn"] == 2
