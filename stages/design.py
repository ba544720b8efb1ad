"""design: the Environment Designer writes new env programs.

In: a backend (the shared policy in its designer role), a corpus (or none: the no-corpus
ablation), an optional memory store, and for retries the `validation` rejects of an earlier
attempt (for repairs, with the designs they reject).
Out: one `design` record per slot: the prompt, the completion with its token ids and sampling
logprobs (the designer is trained on them), skill, difficulty, round, slot, attempt, the corpus
document and memory entries it saw (lineage). `spade validate` extracts and checks the code.
A retry is a fresh attempt for the slot. A repair (`repair_slots`) goes on with the rejected
design's own conversation: one more user turn names the failed check, says what it asks, quotes
the validator's message and the line it points at (prompts/designer_repair.md); the answer is
a design record with `turn` one more than its parent's, `repairs` its parent's id and
`first_turn` the conversation's turn-1 design.
Guarantees: skills rotate by env set (`active_skills` of the domain's six, or of the skills the
config names, for the set that starts at `round`, the set index being round // k, so consecutive
sets cover every skill; slot i takes active skill i mod their count); one corpus document
per attempt, without replacement, and without a corpus a prompt that never mentions one;
everything is seeded from (seed, round, attempt), so a rerun with the same model reproduces the
prompts exactly; each slot's sampling seed is its own, so a rerun that asks only for the slots a
stopped run had not answered (`made`) samples them as the whole batch would have.
"""

from __future__ import annotations

import random
import re
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Sequence

import orjson

from sandbox.contract import ContractError, extract
from stages import memory as memory_store
from stages import prompts
from stages.backends import Backend, Completion, Sampling, streams
from stages.corpus import Document, Sampler
from stages.records import Design, Memory, Validation, derive_seed
from stages.skills import SKILLS

DIFFICULTY_STEPS = {"easy": 2, "medium": 3, "hard": 6}
# k, the rounds an env set lives: 4 for games, 8 for tool use (paper; reference launchers)
SET_LIFE = {"game": 4, "tool_use": 8}
# words a corpus document keeps (reference launchers: 6000 for games, 4000 for tool use)
CORPUS_WORDS = {"game": 6000, "tool_use": 4000}
# one drawn per tool-use prompt, uniformly: the ten application areas the reference draws from
APP_DOMAINS = ("online retail orders", "flight and hotel booking",
               "mobile phone plans and telecom billing", "banking and transfers",
               "calendar and meeting booking", "file storage", "shopping cart and checkout",
               "customer support tickets", "smart home devices", "project and task tracking")
TASK_VARIANTS = {  # weights 3:2:1:1
    "execute": (3, "every request can be carried out directly with the tools"),
    "read_then_write": (2, "each request needs information read with one tool before another "
                           "tool changes the state"),
    "missing_value": (1, "one request lacks a value that must be found with a lookup tool "
                         "first"),
    "with_irrelevant": (1, "one request asks for something no tool can do; the env offers a "
                           "`decline_request` tool and its criterion checks it was used"),
}


@dataclass(frozen=True)
class Config:
    domain: str = "game"
    batch: int = 24
    round: int = 0
    active_skills: int = 3
    every: int | None = None  # k; None = SET_LIFE of the domain
    difficulty: str = "medium"
    seed: int = 0
    max_attempts: int = 5
    prompts_dir: str | None = None
    sampling: Sampling = Sampling(temperature=0.6, max_tokens=4096)
    skills: tuple[str, ...] = ()  # the skills the rotation walks; empty: all of the domain's


@dataclass(frozen=True)
class Slot:
    slot: int
    attempt: int
    skill: str
    repairs: Design | None = None  # a repair: the rejected design whose conversation goes on
    reject: Validation | None = None  # ... and why it was rejected


def active_skills(domain: str, env_set: int, count: int, pool: Sequence[str] = ()) -> list[str]:
    """Round-robin over the domain's skills (or `pool`, a subset of them): `count` of them are
    active in each env set, the window advancing by `count` from one set to the next (keyed on
    the set, not the round: with rounds 0, k, 2k... and k a multiple of 6 / count, a round key
    would never move)."""
    names = list(pool or SKILLS[domain])
    return [names[(env_set * count + i) % len(names)] for i in range(count)]


def env_set_index(cfg: Config) -> int:
    return cfg.round // (cfg.every or SET_LIFE[cfg.domain])


def fresh_slots(cfg: Config) -> list[Slot]:
    """One slot per env of the batch; the set's active skills are dealt out in turn (slot i
    gets skill i mod count), so when the batch is not a multiple of the count the first skills
    get one slot more (16 slots over 6 skills: 3, 3, 3, 3, 2, 2), as the reference assigns them."""
    skills = active_skills(cfg.domain, env_set_index(cfg), cfg.active_skills, cfg.skills)
    return [Slot(i, 0, skills[i % len(skills)]) for i in range(cfg.batch)]


def retry_slots(rejects: Iterable[Validation], cfg: Config) -> list[Slot]:
    """The next attempt for each rejected slot that still has attempts left."""
    latest: dict[int, Validation] = {}
    for reject in rejects:
        if reject.slot not in latest or reject.attempt > latest[reject.slot].attempt:
            latest[reject.slot] = reject
    return [Slot(r.slot, r.attempt + 1, r.skill) for _, r in sorted(latest.items())
            if r.attempt + 1 < cfg.max_attempts]


def repair_slots(rejects: Iterable[Validation], designs: Iterable[Design],
                 cfg: Config) -> list[Slot]:
    """A repair for each rejected slot that still has attempts left: the next attempt goes on
    with the rejected design's own conversation. Raises KeyError naming a reject whose design
    is not among `designs`."""
    by_id = {design.id: design for design in designs}
    repairs = []
    for slot in retry_slots(rejects, cfg):
        reject = _latest_reject(rejects, slot.slot)
        design = by_id.get(reject.parents[0] if reject.parents else "")
        if design is None:
            raise KeyError(reject.parents[0] if reject.parents else reject.id)
        repairs.append(replace(slot, repairs=design, reject=reject))
    return repairs


def _latest_reject(rejects: Iterable[Validation], slot: int) -> Validation:
    return max((r for r in rejects if r.slot == slot), key=lambda r: r.attempt)


# What each check asks of the module, said to the designer in a repair turn.
CHECK_MEANINGS = {
    "extract": "the answer holds the whole module in one ```python code block",
    "parse": "the module is valid Python",
    "truncated": "the answer ends, without repeating itself, before the token limit: write a "
                 "shorter module",
    "copy": "the module is your own design, not an example of the prompt with other names or "
            "numbers",
    "structure": "one class whose name ends in Env, allowed imports only, every method in the "
                 "class body, nothing changed on a class afterwards",
    "load": "the module runs, the class builds with no arguments, max_turns is an int of at "
            "most 25",
    "reset": "reset(seed) returns (observation: str, info: dict), and the seed changes the game",
    "determinism": "the same seed and the same actions give the same observations and rewards",
    "garbage": "step() answers any text, even nonsense, with a helpful observation, never an "
               "exception",
    "step_types": "step() returns (observation: str, reward: float, terminated: bool, "
                  "truncated: bool, info: dict)",
    "oracle": "solution() is a method that returns the list of actions that wins the current "
              "episode from its start, computed from the hidden state",
    "trivial": "no blind policy wins (repeating one action, cycling generic moves, replaying "
               "another seed's answer), and every seed needs its own answer",
    "resources": "each call finishes quickly and uses little memory",
    "reset_gate": "no request is already fulfilled, and no criterion raises, right after setup()",
    "policy": "the env uses no files, processes, network or clocks",
    "audit": "a reviewer found the task unfair or unsolvable as written",
    "internal": "spade could not check the module (not your error): answer with it again",
}
# `line 12` in a reject's message: a static check names the line without quoting it (a
# runtime error quotes it already, as `env.py:12: text`: sandbox/worker.py `where`)
LINE_RE = re.compile(r"\bline (\d+)\b")


def repair_message(design: Design, reject: Validation, cfg: Config) -> str:
    """The user turn that asks for a repair: the check, its meaning, the message, and the line
    of the module it points at when the message does not quote it already."""
    message = reject.error.msg if reject.error else reject.check
    return prompts.render("designer_repair", cfg.prompts_dir, check=reject.check,
                          check_meaning=check_meaning(reject),
                          message=message, line=_quoted_line(design, message))


def check_meaning(reject: Validation) -> str:
    """What a failed check asks, in a sentence. An exception the env raised
    (`meta.validation.raised`) is named as the failure whichever check's call met it: a step
    that raised NameError under `determinism` is a crash to fix, and the determinism rule would
    send a small designer after its seeds."""
    raised = (reject.meta.get("validation") or {}).get("raised")
    if raised:
        return (f"{raised['op']}() raised {raised['type']} while this check ran it: fix that "
                "error first")
    return CHECK_MEANINGS.get(reject.check, "see the rules")


def _quoted_line(design: Design, message: str) -> str:
    found = LINE_RE.search(message)
    if found is None:
        return ""
    try:
        lines = extract(design.completion).splitlines()
    except ContractError:
        return ""
    number = int(found.group(1))
    if not 0 < number <= len(lines):
        return ""
    return f"The line it points at (line {number}): `{lines[number - 1].strip()}`\n"


def same_code(answer: str, parent: str) -> bool:
    """Whether a repair answers with its parent's code again (blank lines and trailing spaces
    aside), or, when neither holds a code block, with the same text."""
    try:
        mine, theirs = extract(answer), extract(parent)
    except ContractError:
        mine, theirs = answer, parent
    return _plain(mine) == _plain(theirs)


def _plain(code: str) -> list[str]:
    return [line.rstrip() for line in code.strip().splitlines() if line.strip()]


def prompt_for(slot: Slot, doc: Document | None, memory: list[Memory], cfg: Config,
               rng: random.Random) -> tuple[str, list[str], dict]:
    """The designer's prompt for one slot; returns (text, memory ids used, extra meta).

    The document and the memory examples are optional paragraphs of the prompt: without them
    it reads as a complete request that never mentions a document or earlier rounds."""
    positives, negatives = memory_store.examples(memory, slot.skill, rng)
    good, bad = memory_store.describe(positives, negatives)
    memory_text = prompts.render("memory_examples", cfg.prompts_dir, positives=good,
                                 negatives=bad) if good or bad else ""
    document = prompts.render(f"designer_{cfg.domain}_document", cfg.prompts_dir,
                              doc_title=doc.title, doc_text=doc.text) if doc else ""
    values = dict(skill=slot.skill, skill_description=SKILLS[cfg.domain][slot.skill],
                  difficulty=cfg.difficulty, document=_paragraph(document),
                  memory=_paragraph(memory_text))
    meta: dict = {"doc_title": doc.title} if doc else {}
    if cfg.domain == "game":
        values["min_steps"] = DIFFICULTY_STEPS.get(cfg.difficulty, 3)
    else:
        names = list(TASK_VARIANTS)
        variant = rng.choices(names, weights=[TASK_VARIANTS[n][0] for n in names])[0]
        values["variant"] = f"{variant}: {TASK_VARIANTS[variant][1]}"
        values["app_domain"] = rng.choice(APP_DOMAINS)
        meta.update(variant=variant, app_domain=values["app_domain"])
    text = prompts.render(f"designer_{cfg.domain}", cfg.prompts_dir, **values)
    return text, [m.id for m in positives + negatives], meta


def _paragraph(text: str) -> str:
    """`text` set apart by blank lines where the prompt places it; nothing when empty."""
    return f"\n{text.strip()}\n" if text.strip() else ""


def run(backend: Backend, documents: list[Document] | None, memory: list[Memory], cfg: Config,
        slots: list[Slot], made: Iterable[Design] = (),
        keep: Callable[[Design], None] = lambda _design: None) -> Iterator[Design]:
    """Prompt the designer once per slot and yield the design records in slot order.

    Every prompt goes out at once (a streaming backend answers each as soon as it is done).
    A repair slot goes on with its rejected design's conversation; a repair that answers with
    its parent's code again is asked once more at once, at another seed and a higher
    temperature (`meta.copy_retried`; `meta.copies_parent` when it copied again).
    `made`: designs a stopped run made for these slots, same prompt and attempt: they are yielded
    as they are, not asked for again. `keep` gets each new design the moment it is answered,
    before earlier slots are done, so a stop loses only what is still being generated.
    `documents` None: no corpus (the reference's no-corpus ablation), prompts without one."""
    if not slots:
        return
    attempt_key = min(s.attempt for s in slots)
    sampler = None if documents is None else Sampler(
        documents, seed=derive_seed(cfg.seed, cfg.round, attempt_key))
    rng = random.Random(derive_seed(cfg.seed, cfg.round, attempt_key, 1))
    requests = []
    for slot in slots:
        if slot.repairs is not None:
            requests.append(Request.repair(slot, cfg))
            continue
        doc = sampler.next() if sampler is not None else None
        requests.append(Request(slot, doc, *prompt_for(slot, doc, memory, cfg, rng)))
    sampling = Sampling(**{**cfg.sampling.__dict__,
                           "seed": derive_seed(cfg.seed, cfg.round, attempt_key, 2)})
    again = Sampling(**{**cfg.sampling.__dict__,
                        "temperature": max(cfg.sampling.temperature, COPY_TEMPERATURE),
                        "seed": derive_seed(cfg.seed, cfg.round, attempt_key, 3)})
    earlier = {(d.slot, d.attempt, _prompt_key(d.prompt)): d for d in made}
    ready = {i: earlier[r.key] for i, r in enumerate(requests) if r.key in earlier}
    todo = [i for i in range(len(requests)) if i not in ready]
    pending = {future: (i, sampling) for future, i in zip(
        _ask(backend, [requests[i].conversation for i in todo], [sampling.one(i) for i in todo]),
        todo)}
    copied: dict[int, Completion] = {}  # repairs that copied their parent, asked once more

    def collect(done: Iterable[Future[Completion]]) -> None:
        for future in done:
            answered, used = pending.pop(future)
            request, answer = requests[answered], future.result()
            if request.copies(answer) and answered not in copied:
                copied[answered] = answer
                pending[_ask(backend, [request.conversation], [again.one(answered)])[0]] = \
                    (answered, again)
                continue
            ready[answered] = request.design(answer, backend, cfg, used,
                                             copy_retried=answered in copied)
            keep(ready[answered])

    try:
        for index in range(len(requests)):
            while index not in ready:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                try:
                    collect(done)
                except Exception:
                    # one request failed: keep every other answer still coming, then fail
                    for future in list(pending):
                        if future.exception() is None:
                            collect([future])
                    raise
            yield ready.pop(index)
    finally:
        for future in pending:  # after a stop, don't send what has not started
            future.cancel()


# A repair that copied its parent is asked again at least this hot (the designer's 0.6 gave
# copies in 12 of 17 hand-made repairs of the 1.5B coder)
COPY_TEMPERATURE = 1.0


def _prompt_key(prompt: str | list[dict]) -> str:
    return prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()


@dataclass(frozen=True)
class Request:
    """One slot's prompt, and what its design record says of where the prompt came from."""

    slot: Slot
    doc: Document | None
    text: str
    memory_ids: list[str]
    meta: dict
    asked: tuple[dict, ...] = ()  # a repair: the conversation so far, the repair turn last

    @classmethod
    def repair(cls, slot: Slot, cfg: Config) -> "Request":
        parent, reject = slot.repairs, slot.reject
        assert parent is not None and reject is not None
        text = repair_message(parent, reject, cfg)
        kept = {k: v for k, v in parent.meta.items() if k in ("doc_title", "variant",
                                                               "app_domain")}
        meta = {**kept, "repair": {"check": reject.check, "reject": reject.id}}
        return cls(slot, None, text, list(parent.memory_ids), meta,
                   (*parent.conversation, {"role": "user", "content": text}))

    @property
    def prompt(self) -> str | list[dict]:
        return list(self.asked) if self.asked else self.text

    @property
    def key(self) -> tuple[int, int, str]:
        return self.slot.slot, self.slot.attempt, _prompt_key(self.prompt)

    @property
    def conversation(self) -> list[dict]:
        return list(self.asked) or [{"role": "user", "content": self.text}]

    def copies(self, answer: Completion) -> bool:
        parent = self.slot.repairs
        return parent is not None and same_code(answer.text, parent.completion)

    def design(self, done: Completion, backend: Backend, cfg: Config, sampling: Sampling,
               copy_retried: bool = False) -> Design:
        slot, parent = self.slot, self.slot.repairs
        meta = {**self.meta, "finish_reason": done.finish_reason,
                "temperature": sampling.temperature}
        if copy_retried:
            meta.update(copy_retried=True, copies_parent=self.copies(done))
        repair = {} if parent is None else {
            "turn": parent.turn + 1, "repairs": parent.id,
            "first_turn": parent.conversation_id}
        return Design(domain=cfg.domain, skill=slot.skill, difficulty=cfg.difficulty,
                      round=cfg.round, slot=slot.slot, attempt=slot.attempt, prompt=self.prompt,
                      completion=done.text, prompt_ids=done.prompt_ids,
                      completion_ids=done.completion_ids, logprobs=done.logprobs,
                      corpus_doc=parent.corpus_doc if parent else
                      (self.doc.id if self.doc else None),
                      memory_ids=self.memory_ids, policy=backend.policy,
                      parents=[parent.id] if parent else self.memory_ids, meta=meta, **repair)


def _ask(backend: Backend, conversations: list[list[dict]],
         samplings: list[Sampling]) -> list[Future[Completion]]:
    """One future per conversation: a streaming backend's own, or one batched `chat` call's
    answers (each conversation keeps its own seed either way)."""
    if streams(backend):
        return [backend.submit(c, s) for c, s in zip(conversations, samplings)]
    if not conversations:
        return []
    batch = replace(samplings[0], seed=None, seeds=tuple(s.seed for s in samplings))
    answers = []
    for completion in backend.chat(conversations, batch):
        answer: Future[Completion] = Future()
        answer.set_result(completion)
        answers.append(answer)
    return answers
