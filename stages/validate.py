"""validate: design records in, accepted `env` records and rejected `validation` records out.

In: design/v1 records (a model's answer holding a ```python block), or hand-written `.py` env
files turned into design records by `designs_from_files`.
Out: for each design, in input order, exactly one record: an `env` (source, class name, domain,
skill, max turns, tools, source hash; parent = the design) or a `validation` reject naming the
first failing check (sandbox/contract.py CHECKS, or `copy`: the module mostly repeats a memory
example its prompt showed, stages/memory.py `copied_example`) and why. A design made from a
file names it in `meta.source_file`, and so do its env or validation record. An env without
`solution()` (the reference code's multi-turn game template has none) passed every check but the
oracle, which could not run: its record says so in `meta.oracle = "none"`, and the stage counts
these envs in `Stats.extra["envs_without_oracle"]`. A repair's verdict says which designer turn
wrote it and the conversation's turn-1 design (`meta.design = {"turn", "first_turn"}`), and
`Stats.extra["by_turn"]` counts designs and envs per turn.
Guarantees: generated code only ever runs inside jailed workers (two at a time per design, for
the contract's checks and then for stages/trivial.py: one computes the solutions, the other
plays); a hang, crash, memory or output blow-up is a reject with its sandbox outcome, never a
stage failure; a jail that cannot start at all raises SandboxUnavailable (exit 69). Any other
error while validating one design (a case spade does not handle yet) is that design's reject
with check `internal` and outcome `internal_error` (stages/isolation.py); the stage goes on with
the rest.

Validation seeds are fresh for every design: derived from a base seed and the design's id, where
the base is `Config.seed` when given (a reproducible validation) and otherwise drawn from the OS
for each design, so no env can know them in advance. Five are played; when all five give the
same episode, up to SPARE_SEEDS more, derived the same way, are drawn one at a time until one
differs (sandbox/contract.py `Seeds`). Every record lists the seeds played in
`meta.validation = {"seed": base, "seeds": [...]}`: rerunning with `--seed <base>` replays the
same design's validation exactly.

After the contract's checks, `trivial` goes on in stages/trivial.py (two more jails: one solves,
one plays): what a model emits when it does not know (prose, refusals, "I don't know", empty and
malformed boxes, echoed observations, one generic action or one string literal of the source
repeated) and near misses of the solution's final answer. Its tally, on the same seeds, is the
record's `meta.trivial` (accepted or rejected by it): `{"policies", "plays", "steps", "capped",
"chance", "wins": {policy: "won/played"}}`, listing the policies that won any episode; `chance`
is an accepted env's blind win rate (another seed's solution replayed; None for a reject or an
env without solution()); `capped` names the cap ("time", "plays", "steps") that stopped a
reject's play, and is None on every accepted env: an env that does not let `trivial` finish is
rejected (`resources` at the time cap, `trivial` at the others), never accepted on part of it.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Iterable, Iterator

from sandbox.contract import (SPARE_SEEDS, VALIDATION_SEEDS, ContractError, Seeds, check_size,
                              drop_restated_base, extract, name_env_after_base,
                              repair_boxed_escapes, runtime_checks, static_checks)
from sandbox.jail import Sandbox
from stages import trivial
from stages.executor import Executor, LocalExecutor
from stages.isolation import INTERNAL, isolated
from stages.memory import copied_example
from stages.records import (Design, Env, Failure, Record, RecordError, Validation, derive_seed,
                            designer_turn, program_hash as source_hash)
from stages.shards import Stats

HEADER_RE = re.compile(r"^#\s*spade:\s*(.*)$", re.M)


@dataclass(frozen=True)
class Config:
    workers: int = 2
    sandbox: Sandbox = field(default_factory=Sandbox)
    seed: int | None = None  # None: fresh validation seeds for every design


def validation_seeds(base: int, design: Design, count: int = VALIDATION_SEEDS) -> list[int]:
    """The first `count` seeds one design is validated with: distinct, and drawn like rollout
    seeds (a longer list starts with the shorter one)."""
    seeds: list[int] = []
    index = 0
    while len(seeds) < count:
        seed = derive_seed("validate", base, design.id, index)
        index += 1
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def truncated(design: Design, exc: ContractError) -> ContractError | None:
    """A design cut at --max-tokens, or stopped in a loop (--stop-loops), whose code does not
    extract or parse: its own check, `truncated`, not the syntax error the cut made (a cut
    design that parses goes on)."""
    why = design.meta.get("finish_reason")
    if exc.check not in ("extract", "parse") or why not in ("length", "repetition"):
        return None
    tokens = f" ({len(design.completion_ids)} tokens)" if design.completion_ids else ""
    if why == "repetition":
        return ContractError("truncated", f"the designer's answer was stopped{tokens} repeating "
                             f"the same text over and over before its code ended ({exc.check}: "
                             f"{exc.msg}): compute long lists instead of writing them out")
    return ContractError("truncated", f"the designer's answer was cut at --max-tokens{tokens} "
                         f"before its code ended ({exc.check}: {exc.msg}): raise --max-tokens "
                         "or ask for shorter envs")


def validate_one(design: Design, cfg: Config) -> Env | Validation:
    base = cfg.seed if cfg.seed is not None else secrets.randbits(31)
    drawn = validation_seeds(base, design, VALIDATION_SEEDS + SPARE_SEEDS)
    seeds = Seeds(drawn[:VALIDATION_SEEDS], drawn[VALIDATION_SEEDS:])
    meta = {"validation": {"seed": base, "seeds": seeds.used}}  # grows by any spare drawn
    meta.update(design_meta(design))
    source = None

    def reject(exc: ContractError) -> Validation:
        if exc.raised:
            meta["validation"]["raised"] = exc.raised
        return Validation(check=exc.check, outcome=exc.outcome, domain=design.domain,
                          skill=design.skill, parents=[design.id], policy=design.policy,
                          round=design.round, slot=design.slot, attempt=design.attempt,
                          error=Failure(type=exc.check, msg=exc.msg), meta=meta,
                          source_hash=source_hash(source) if source else None)

    try:
        # the slips nobody means are mended before the checks, and each mend recorded
        source = check_size(design.completion) if "source_file" in meta \
            else extract(design.completion)
        source, mended = repair_boxed_escapes(source)
        if mended:
            meta["validation"]["mended_boxed_escapes"] = mended
        if design.domain == "tool_use":
            source, renamed = name_env_after_base(source)
            if renamed:
                meta["validation"]["renamed_base_class"] = renamed
        source = static_checks(source, is_source=True)
        if design.domain == "tool_use" or "(ToolUseBaseEnv)" in source:
            source, dropped = drop_restated_base(source)
            if dropped:
                meta["validation"]["dropped_base_class"] = True
        not_its_own(source, design)
    except ContractError as exc:
        return reject(truncated(design, exc) or exc)
    try:
        facts = runtime_checks(cfg.sandbox, source, seeds)
    except ContractError as exc:
        return reject(exc)
    if facts.domain != design.domain:
        return Validation(check="structure", domain=design.domain, skill=design.skill,
                          parents=[design.id], policy=design.policy, round=design.round,
                          slot=design.slot, attempt=design.attempt, meta=meta,
                          source_hash=source_hash(source),
                          error=Failure(type="structure", msg=f"asked for a {design.domain} env, "
                                        f"got a {facts.domain} env ({facts.class_name})"))
    try:
        meta["trivial"] = trivial.check(cfg.sandbox, source, seeds.used, facts)
    except trivial.TrivialError as exc:
        meta["trivial"] = exc.tally
        return reject(exc)
    except ContractError as exc:
        return reject(exc)
    if not facts.oracle:
        meta["oracle"] = "none"
    return Env(domain=facts.domain, skill=design.skill, class_name=facts.class_name,
               source=source, source_hash=source_hash(source), max_turns=facts.max_turns,
               tools=facts.tools, parents=[design.id], policy=design.policy, meta=meta)


def not_its_own(source: str, design: Design) -> None:
    """ContractError `copy` when the module mostly repeats a memory example its prompt showed:
    such an env is not the designer's, and paying it would pay copying (a small designer given
    worked examples copies them: the 1.5B coder did in 12 of 12 game designs)."""
    prompt = design.prompt or ""
    if isinstance(prompt, list):  # a repair's conversation: the examples are in a user turn
        prompt = "\n".join(str(turn.get("content", "")) for turn in prompt
                           if turn.get("role") == "user")
    copied = copied_example(source, prompt)
    if copied:
        number, shared, lines = copied
        what = "game" if design.domain == "game" else "task"
        raise ContractError("copy", f"{shared} of the module's {lines} lines are lines of "
                                    f"Example {number} of the prompt: the examples show how an "
                                    f"env is built, design a new {what} of your own")


def design_meta(design: Design) -> dict:
    """What a verdict says of its design: the file a hand-written env came from, and for a
    repair its turn and the conversation's turn-1 design (what score-regret pays)."""
    meta: dict = {k: v for k, v in design.meta.items() if k == "source_file"}
    if design.turn > 1:
        meta["design"] = {"turn": design.turn, "first_turn": design.conversation_id}
    return meta


def validate_isolated(design: Design, cfg: Config) -> Env | Validation:
    """validate_one, where an unexpected error becomes this design's `internal` reject."""
    def internal(failure: Failure) -> Validation:
        meta = design_meta(design)
        return Validation(check="internal", outcome=INTERNAL, domain=design.domain,
                          skill=design.skill, parents=[design.id], policy=design.policy,
                          round=design.round, slot=design.slot, attempt=design.attempt,
                          error=failure, meta=meta)

    return isolated(f"validate: design {design.id}", lambda: validate_one(design, cfg), internal)


def run(designs: Iterable[Record], cfg: Config, stats: Stats,
        executor: Executor | None = None) -> Iterator[Record]:
    """Validate designs concurrently (cfg.workers at once, two jails at a time each), yielding in
    input order: on this machine, or across a cluster's nodes given a RayExecutor
    (stages/executor.py)."""
    executor = executor or LocalExecutor(cfg.workers)
    for record in executor.map(partial(validate_isolated, cfg=cfg), designs):
        yield _count(record, stats)


def _count(record: Env | Validation, stats: Stats) -> Env | Validation:
    turn = stats.extra.setdefault("by_turn", {}).setdefault(str(designer_turn(record)),
                                                            {"designs": 0, "envs": 0})
    turn["designs"] += 1
    turn["envs"] += isinstance(record, Env)
    if isinstance(record, Validation):
        stats.reasons[record.check] += 1
    elif record.meta.get("oracle") == "none":
        stats.extra["envs_without_oracle"] = stats.extra.get("envs_without_oracle", 0) + 1
    return record


def designs_from_files(paths: Iterable[Path]) -> list[Design]:
    """Design records for hand-written env files, reading `# spade: key=value` header lines."""
    designs = []
    for path in paths:
        try:
            source = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"not UTF-8 text (byte {exc.start}): an env file is Python "
                              "source in UTF-8", str(path)) from None
        header = dict(pair.split("=", 1) for match in HEADER_RE.findall(source)
                      for pair in match.split() if "=" in pair)
        domain = header.get("domain") or ("tool_use" if "ToolUseBaseEnv" in source else "game")
        if domain not in ("game", "tool_use"):
            raise RecordError(f"header: domain must be game or tool_use, got {domain!r}",
                              f"{path}:1")
        designs.append(Design(domain=domain, skill=header.get("skill", ""), completion=source,
                              meta={"source_file": str(path)}))
    return designs
