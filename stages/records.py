"""Typed records: one pydantic model per shard line kind.

In: JSON objects (dicts) read from shards. Out: validated models, and dicts ready to write.
Guarantees: every record carries `kind` and `v` first; ids derive from content
(`<prefix>_<sha256[:16]>`), so reruns reproduce them; a line written by a newer spade is refused;
NaN and infinities never reach a shard (orjson would silently write them as null) and never come
out of one: orjson refuses NaN/Infinity tokens and numbers beyond a double, and every float field
takes JSON numbers only (a lax float would turn the strings "NaN" and "Infinity" into them).

Every kind shares: `id`, `parents` (input ids: lineage), `policy` (the checkpoint that produced it,
when a model did), `ok` and `error` (failures are data), `meta` (free-form, not hashed).
Unknown extra fields are kept, so `jq` annotations survive a pass through a stage.

An env or design read is checked against its content (`parse`): a record without an id gets
the one its content gives; one whose id is not that is a RecordError (`id does not match its
content`). An env's id derives from its program (`program_hash` of `source`; the `source_hash`
field, which validation writes as the same hash, is not trusted), so an id names one program: a
record cannot carry another env's id with a different program. A design's id covers its declared
fields, not `jq` annotations (extra fields), so annotating a design keeps it readable.
"""

from __future__ import annotations

import hashlib
import math
from typing import Annotated, Any, Callable, ClassVar, Iterable, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

VERSION = 1
T = TypeVar("T")
Domain = Literal["game", "tool_use"]
# Every float field: a JSON number (an int is fine), never a string or a bool.
Number = Annotated[float, Strict()]


class RecordError(ValueError):
    """A record that cannot be read or written; `where` is `path:line` when known."""

    def __init__(self, msg: str, where: str = ""):
        super().__init__(f"{where}: {msg}" if where else msg)
        self.msg, self.where = msg, where


class Failure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    msg: str


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str
    v: int = VERSION
    id: str = ""
    parents: list[str] = Field(default_factory=list)
    policy: str | None = None
    ok: bool = True
    error: Failure | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    prefix: ClassVar[str] = "rec"
    # Fields left out of the content hash: the id itself and what varies between identical reruns.
    unhashed: ClassVar[frozenset[str]] = frozenset({"id", "meta"})

    # Kinds whose id is checked against their content when read (see `parse`).
    checked: ClassVar[bool] = False

    def model_post_init(self, _context: Any) -> None:
        if not self.id:
            object.__setattr__(self, "id", self.content_id())

    def identity(self) -> dict[str, Any]:
        """The content the id is derived from."""
        return self.model_dump(mode="json", exclude=set(self.unhashed))

    def content_id(self) -> str:
        """The id this record's content gives."""
        return f"{self.prefix}_{content_hash(self.identity())[:16]}"

    def check_content(self) -> None:
        """Raise RecordError when the id is not the one the content gives."""
        expected = self.content_id()
        if self.id != expected:
            raise RecordError(f"id does not match its content (expected {expected}, "
                              f"got {self.id})")

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        ordered = {"kind": data.pop("kind"), "v": data.pop("v"), "id": data.pop("id")}
        ordered.update(data)
        return ordered


class Design(Record):
    """One designer completion: the prompt it saw and the code it wrote."""

    kind: Literal["design"] = "design"
    prefix: ClassVar[str] = "des"
    checked: ClassVar[bool] = True
    domain: Domain = "game"
    skill: str = ""
    difficulty: str | None = None
    round: int = 0
    slot: int = 0
    attempt: int = 0
    prompt: str | list[dict[str, Any]] = ""
    completion: str = ""
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[Number] | None = None
    corpus_doc: str | None = None
    memory_ids: list[str] = Field(default_factory=list)
    source_path: str | None = None
    # A repair continues a rejected design's conversation: `prompt` is then the whole
    # conversation so far, `repairs` the design it answers, `first_turn` the conversation's
    # turn-1 design, and `turn` counts the designer's answers in it (1: no repair yet).
    turn: int = 1
    repairs: str | None = None
    first_turn: str | None = None

    def identity(self) -> dict[str, Any]:
        # Declared fields only: a jq annotation (an extra field) is not the design's content.
        # A turn-1 design leaves the repair fields out, so designs written before repairs
        # existed keep their ids.
        fields = set(type(self).model_fields) - self.unhashed
        if self.turn == 1 and self.repairs is None and self.first_turn is None:
            fields -= set(REPAIR_FIELDS)
        return self.model_dump(mode="json", include=fields)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The messages this design answered, its own answer last: what a repair continues."""
        asked = self.prompt if isinstance(self.prompt, list) else \
            [{"role": "user", "content": self.prompt}]
        return [*asked, {"role": "assistant", "content": self.completion}]

    @property
    def conversation_id(self) -> str:
        """The turn-1 design of the conversation this design belongs to."""
        return self.first_turn or self.id


REPAIR_FIELDS = ("turn", "repairs", "first_turn")


def designer_turn(verdict: Record) -> int:
    """The designer turn that wrote the design an env or reject came from (validate's
    `meta.design`; 1 when the design was no repair)."""
    return int(verdict.meta.get("design", {}).get("turn", 1))


def conversation_of(verdict: Record) -> str | None:
    """The turn-1 design of the conversation an env or reject came from."""
    first = verdict.meta.get("design", {}).get("first_turn")
    return first or (verdict.parents[0] if verdict.parents else None)


class Env(Record):
    """A validated environment program, ready to be played."""

    kind: Literal["env"] = "env"
    prefix: ClassVar[str] = "env"
    checked: ClassVar[bool] = True
    unhashed: ClassVar[frozenset[str]] = frozenset({"id", "meta", "hint", "parents", "policy"})
    domain: Domain
    skill: str = ""
    class_name: str
    source: str
    source_hash: str
    max_turns: int
    tools: list[dict[str, Any]] = Field(default_factory=list)
    hint: str | None = None

    def identity(self) -> dict[str, Any]:
        # The same program is the same env, whoever designed it and whatever hint it later gets.
        # Hashed from the source itself, not from the record's word for it (`source_hash`).
        return {"source_hash": program_hash(self.source)}


class Validation(Record):
    """A rejected design: which check failed and why."""

    kind: Literal["validation"] = "validation"
    prefix: ClassVar[str] = "val"
    ok: bool = False
    check: str
    outcome: str = "ok"
    round: int = 0
    slot: int = 0
    attempt: int = 0
    domain: Domain | None = None
    skill: str = ""
    source_hash: str | None = None


class Turn(BaseModel):
    """One agent turn: what the model wrote, what the env received, what came back."""

    model_config = ConfigDict(extra="allow")
    action: str
    completion: str = ""
    finish_reason: str = "stop"
    observation: str = ""
    reward: Number = 0.0
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[Number] | None = None


class Rollout(Record):
    """One episode of the agent in one env."""

    kind: Literal["rollout"] = "rollout"
    prefix: ClassVar[str] = "ro"
    env_id: str
    hint: bool = False
    seed: int = 0
    round: int = 0
    turns: list[Turn] = Field(default_factory=list)
    reward: Number = 0.0
    terminated: bool = False
    truncated: bool = False
    outcome: str = "ok"


class Judgement(Record):
    """What replaying a rollout's winning plays of one env on other seeds showed
    (stages/judge.py): `shortcut` (no-hint actions that win whatever the seed), `leak` (hinted
    actions that do: the hint carries the answer) or `fair`."""

    kind: Literal["judgement"] = "judgement"
    prefix: ClassVar[str] = "jg"
    env_id: str = ""
    hint: bool = False
    round: int = 0
    plays: list[str] = Field(default_factory=list)  # the winning plays replayed
    replays: int = 0
    wins: int = 0  # replays that won on another seed
    chance: Number = 0.0  # the env's blind win rate at validation (0 where unknown)
    verdict: Literal["fair", "shortcut", "leak"] = "fair"


class Regret(Record):
    """Per-env regret and the designer reward derived from it (or a rejected design's penalty)."""

    kind: Literal["regret"] = "regret"
    prefix: ClassVar[str] = "rg"
    env_id: str = ""  # empty for a design that never became an env
    design_id: str | None = None
    skill: str = ""
    round: int = 0
    variant: str = "blend"
    hint_reward: Number | None = None
    no_hint_reward: Number | None = None
    n_hint: int = 0
    n_no_hint: int = 0
    regret: Number = 0.0
    regret_n: Number = 0.0
    win: Number = 0.0  # mean no-hint reward over the window (what plateau scores)
    solve_rate: Number = 0.0  # share of the window's no-hint plays with reward > 0
    plateau: Number = 0.0
    designer_reward: Number = 0.0
    designer_advantage: Number = 0.0
    broken: bool = False
    hint_leaks: bool = False  # the hint gives the answer away: no designer reward
    chance: Number | None = None  # the env's blind win rate (validation), None if unknown
    at_chance: bool = False  # the no-hint win is within noise of chance: luck, not skill
    rejected_by: str | None = None
    shortcut: bool = False  # a no-hint winner's actions win other seeds: no designer reward
    # which designer sample the reward trains (score-regret): "first_turn", the reference's
    # rule (a repaired env pays its turn-1 design 0), or "conversation" (--train-repairs:
    # every assistant turn of the repair conversation, paid the env's reward)
    designer_sample: Literal["first_turn", "conversation"] = "first_turn"


class Memory(Record):
    """One environment remembered for the designer's few-shot examples."""

    kind: Literal["memory"] = "memory"
    prefix: ClassVar[str] = "mem"
    env_id: str
    skill: str = ""
    snippet: str = ""
    win_rate: Number = 0.0
    regret: Number = 0.0
    round: int = 0


class Train(Record):
    """Statistics of one optimiser step."""

    kind: Literal["train"] = "train"
    prefix: ClassVar[str] = "tr"
    step: int
    role: str = "agent"
    stats: dict[str, Number] = Field(default_factory=dict)


class Eval(Record):
    """A score on one evaluation item (`task` set) or a roll-up (`task` empty)."""

    kind: Literal["eval"] = "eval"
    prefix: ClassVar[str] = "ev"
    suite: str
    task: str = ""
    category: str = ""
    round: int | None = None
    score: Number = 0.0
    samples: int = 1
    ci_low: Number | None = None
    ci_high: Number | None = None
    details: dict[str, Any] = Field(default_factory=dict)


MODELS: dict[str, type[Record]] = {
    m.model_fields["kind"].default: m
    for m in (Design, Env, Validation, Rollout, Judgement, Regret, Memory, Train, Eval)
}


def content_hash(content: Any) -> str:
    return hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()


# The ASCII whitespace a program's normal form may change besides " " and "\n": line boundaries
# other than \n (str.splitlines splits on them) and the rest (str.rstrip drops them).
_RARE_SPACE = "\t\r\x0b\x0c\x1c\x1d\x1e\x1f"


def program_hash(source: str) -> str:
    """Hash of a program with trailing whitespace ignored, so cosmetic reruns match."""
    normal = source.strip("\n")
    # The usual program (ASCII, no line ending in whitespace) is its own normal form: hashing
    # it as it is saves the line-by-line pass, a third of the cost of reading an env.
    if not normal.isascii() or normal[-1:].isspace() or " \n" in normal \
            or any(char in normal for char in _RARE_SPACE):
        normal = "\n".join(line.rstrip() for line in normal.splitlines())
    return hashlib.sha256(normal.encode()).hexdigest()


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (unlike hash(), the same in every process)."""
    key = ":".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


def seeded_sample(items: Iterable[T], size: int, seed: int,
                  id_of: Callable[[T], str] = lambda item: item.id) -> list[T]:
    """The `size` items (all, if fewer) with the smallest sha256 of `seed:id`, in that order:
    the same ids and seed give the same sample in any input order, and a larger `size` keeps
    every item a smaller one chose."""
    def rank(item: T) -> str:
        return hashlib.sha256(f"{seed}:{id_of(item)}".encode()).hexdigest()

    return sorted(items, key=rank)[:size]


def parse(data: Any, kinds: set[str] | None = None) -> Record:
    """Validate one object decoded by orjson; raise RecordError naming the field on failure.

    orjson refuses NaN and Infinity tokens; the float fields refuse strings: so no record read
    holds a non-finite number. An env or design that carries an id must carry its content's."""
    if not isinstance(data, dict):
        raise RecordError(f"expected a JSON object, got {type(data).__name__}")
    kind, version = data.get("kind"), data.get("v", VERSION)
    if kind not in MODELS:
        raise RecordError(f"field 'kind': unknown kind {kind!r} (one of {', '.join(MODELS)})")
    if kinds is not None and kind not in kinds:
        raise RecordError(f"field 'kind': expected {' or '.join(sorted(kinds))}, got {kind!r}")
    if isinstance(version, int) and version > VERSION:
        raise RecordError(f"field 'v': version {version} was written by a newer spade "
                          f"(this one reads up to {VERSION})")
    try:
        record = MODELS[kind].model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "record"
        msg = first["msg"]
        if first["type"] == "float_type":
            msg = f"expected a finite JSON number, got {first['input']!r}"[:200]
        raise RecordError(f"field '{field}': {msg}") from None
    if record.checked:
        record.check_content()
    return record


def dumps(record: Record | dict[str, Any]) -> bytes:
    """One shard line (with the trailing newline); refuses NaN and infinities."""
    data = record.to_dict() if isinstance(record, Record) else record
    bad = _non_finite_path(data)
    if bad is not None:
        raise RecordError(f"field '{bad}': refusing to write a non-finite number")
    return orjson.dumps(data) + b"\n"


def _non_finite_path(value: Any, path: str = "") -> str | None:
    if isinstance(value, float):
        return None if math.isfinite(value) else (path or "value")
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None
