"""leaks: does a hint give the answer away? Played, not judged.

In: an env record with a hint (and the seeds it was validated with, `meta.validation.seeds`), a
Sandbox, an env budget in seconds. Out: the check's verdict for `meta.hint.leak`: `{"leaks",
"won", "seeds", "actions"}`, with `error` and `stalled` when the env failed the check.
The hint-only policy plays what the hint text names, in the order it names it, one per turn:
each `\\boxed{...}`, `<answer>...</answer>` and `<tool_call>...</tool_call>` as written, each
quoted string ('...', "...", `...`) and each number not inside one of those, as an action of the
env's kind (boxed in a game, an answer in a tool-use env), never more than the env's turns and
stopping once the actions run out. What the text encodes is played where it stands too:
numbers in words, one arithmetic operation, base64 and hex (`decoded`). A hint leaks when that policy wins more than half the seeds:
it carries the answer (or a list of answers short enough to try), not a way to find it.
Guarantees: no model, deterministic (actions from the text, seeds from the record); each seed
is played as a play is, in a fresh jailed worker with one load and one reset (the agent's pace
is replayed after the hinted rollout, stages/judge.py), under one env budget for the whole
check (sandbox/budget.py: every seed's load, reset and steps share `env_budget` seconds). An env
that runs out the clock here (its budget, or one call's timeout) is `stalled`: the hint could
not be checked, so it counts as leaking (`leaks` true, `stalled` naming the outcome), pays
nothing, and is not written again (a new hint would stall the same env again). Any other
failure of an env that passed validation is recorded (`error`) and counts as no leak: the
rollout's own limits deal with it.
"""

from __future__ import annotations

import base64
import binascii
import re

from sandbox.budget import DEFAULT_ENV_BUDGET, STALLED, EnvBudget
from sandbox.contract import (REFERENCE_REWARD_BOUND, REWARD_BOUND, ContractError, EnvFacts,
                              Probe, load, parse, structure)
from sandbox.jail import Sandbox, Worker
from stages.records import Env

MAX_ACTIONS = 25  # a hint names at most this many (MAX_TURNS_CAP): the rest is never played
ACTION_RE = re.compile(r"\\boxed\{[^{}]*\}|<answer>.*?</answer>|<tool_call>.*?</tool_call>", re.S)
QUOTED_RE = re.compile(r"'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"|`([^`\n]{1,80})`")
NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")


def leaking(env: Env) -> bool:
    """Whether the env's hint was found to give its answer away, or could not be checked
    because the env stalled (`meta.hint.leak`)."""
    return bool(_verdict(env).get("leaks"))


def stalled(env: Env) -> bool:
    """Whether the env ran out the clock in its hint's leak check."""
    return bool(_verdict(env).get("stalled"))


def _verdict(env: Env) -> dict:
    return env.meta.get("hint", {}).get("leak", {})


def hint_actions(hint: str, domain: str) -> list[str]:
    """What the hint names, in order of appearance, as the env's actions (deduplicated)."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for match in ACTION_RE.finditer(hint):
        found.append((match.start(), match.group()))
        taken.append(match.span())
    outside = [(m.start(), next(g for g in m.groups() if g is not None))
               for m in QUOTED_RE.finditer(hint) if not _inside(m.span(), taken)]
    taken += [m.span() for m in QUOTED_RE.finditer(hint)]
    outside += [(m.start(), m.group()) for m in NUMBER_RE.finditer(hint)
                if not _inside(m.span(), taken)]
    found += [(at, _as_action(text.strip(), domain)) for at, text in outside if text.strip()]
    found += [(at, _as_action(text, domain)) for at, text in decoded(hint)]
    return list(dict.fromkeys(action for _, action in sorted(found)))[:MAX_ACTIONS]


# -- what a hint says in other words: each decoded value is played where its text stands ----

UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
TENS = {w: 10 * i for i, w in enumerate(
    "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"}
SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
NUMBER_WORD = "|".join([*UNITS, *TENS, *SCALES])
WORDS_RE = re.compile(rf"\b(?:{NUMBER_WORD})(?:[\s-]+(?:and[\s-]+)?(?:{NUMBER_WORD}))*\b",
                      re.I)
OPERATORS = {"+": lambda a, b: a + b, "plus": lambda a, b: a + b,
             "-": lambda a, b: a - b, "minus": lambda a, b: a - b,
             "x": lambda a, b: a * b, "×": lambda a, b: a * b, "*": lambda a, b: a * b,
             "times": lambda a, b: a * b, "/": lambda a, b: a / b if b else None,
             "divided by": lambda a, b: a / b if b else None}
# a symbol may touch its numbers ("6*700"); a word, "x" included, stands apart ("6 x 700"), so
# 0x1068 is hex and not 0 times 1068
ARITHMETIC_RE = re.compile(r"(-?\d+(?:\.\d+)?)(\s*[+×*/-]\s*|\s+(?:plus|minus|x|times|"
                           r"divided by)\s+)(-?\d+(?:\.\d+)?)", re.I)
BASE64_RE = re.compile(r"(?<![\w+/])[A-Za-z0-9+/]{6,}={0,2}(?![\w+/=])")
HEX_RE = re.compile(r"\b0x([0-9a-fA-F]+)\b|\b((?:[0-9a-fA-F]{2}){3,})\b")


def decoded(hint: str) -> list[tuple[int, str]]:
    """(position, value) for what the hint encodes: numbers in words ("four thousand two
    hundred"), one arithmetic operation ("6 x 700"), base64 and hex that decode to printable
    text or a number. A reading, never complete: the replay of hinted winners (stages/judge.py)
    is the test that does not depend on it."""
    found = [(m.start(), str(value)) for m in WORDS_RE.finditer(hint)
             for part in _and_readings(m.group())
             if (value := words_to_number(part)) is not None]
    found += [(m.start(), _plain_number(value)) for m in ARITHMETIC_RE.finditer(hint)
              if (value := OPERATORS[m.group(2).strip().lower()](float(m.group(1)),
                                                                 float(m.group(3))))
              is not None]
    found += [(m.start(), text) for m in BASE64_RE.finditer(hint)
              if (text := _printable(_base64(m.group())))]
    for m in HEX_RE.finditer(hint):
        text = str(int(m.group(1), 16)) if m.group(1) else _printable(_hex(m.group(2)))
        if text:
            found.append((m.start(), text))
    return found


def _and_readings(text: str) -> list[str]:
    """"one hundred and five" is one number, "forty-two and seven" may be two: both readings."""
    parts = re.split(r"[\s-]+and[\s-]+", text, flags=re.I)
    return [text] + (parts if len(parts) > 1 else [])


def words_to_number(text: str) -> int | None:
    """"four thousand two hundred" -> 4200, "forty-two" -> 42; None for a lone "one" or
    "zero" (prose, not a number worth playing)."""
    words = [w for w in re.split(r"[\s-]+", text.lower()) if w and w != "and"]
    if len(words) == 1 and words[0] in ("one", "zero"):
        return None
    total = current = 0
    for word in words:
        if word in UNITS:
            current += UNITS[word]
        elif word in TENS:
            current += TENS[word]
        elif word == "hundred":
            current = max(current, 1) * 100
        else:
            total += max(current, 1) * SCALES[word]
            current = 0
    return total + current


def _plain_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _base64(token: str) -> bytes:
    try:
        return base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return b""


def _hex(token: str) -> bytes:
    try:
        return bytes.fromhex(token)
    except ValueError:
        return b""


def _printable(raw: bytes) -> str:
    """Decoded bytes as text when they are short printable ASCII (what an answer looks like),
    else nothing: most words that happen to be valid base64 decode to noise."""
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return ""
    return text if 0 < len(text) <= 80 and text.isprintable() else ""


def _inside(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    return any(start <= span[0] and span[1] <= end for start, end in spans)


def _as_action(text: str, domain: str) -> str:
    return f"<answer>{text}</answer>" if domain == "tool_use" else f"\\boxed{{{text}}}"


def check(env: Env, sandbox: Sandbox, env_budget: float = DEFAULT_ENV_BUDGET) -> dict:
    """Play the hint-only policy on the env's validation seeds, all within `env_budget` seconds
    of env time; the `meta.hint.leak` verdict."""
    actions = hint_actions(env.hint or "", env.domain)
    seeds = list(env.meta.get("validation", {}).get("seeds") or [])
    verdict = {"leaks": False, "won": 0, "seeds": len(seeds), "actions": actions[:8]}
    if not actions or not seeds:
        return verdict
    bound = REFERENCE_REWARD_BOUND if structure(parse(env.source)).reference else REWARD_BOUND
    budget = EnvBudget(env_budget)  # one budget for the whole check, each seed spending it
    try:
        verdict["won"] = sum(_wins_fresh(sandbox, env.source, bound, budget, seed, actions)
                             for seed in seeds)
    except ContractError as exc:
        failed = {**verdict, "won": 0, "error": f"{exc.check}: {exc.msg}"[:300]}
        if exc.outcome in STALLED:  # unchecked, so it may not pay
            return {**failed, "leaks": True, "stalled": exc.outcome}
        return failed
    verdict["leaks"] = 2 * verdict["won"] > len(seeds)
    return verdict


def _wins_fresh(sandbox: Sandbox, source: str, bound: float, budget: EnvBudget, seed: int,
                actions: list[str]) -> bool:
    """One seed as a play sees it: a fresh worker, one load, one reset (an env that pays only
    in a worker's first episode, or never in its first, looks the same here as in a play)."""
    with Worker(sandbox) as worker:
        probe = Probe(worker, bound, budget)
        facts = load(probe, source)
        probe.check = "leak"
        return _wins(probe, facts, seed, actions)


def _wins(probe: Probe, facts: EnvFacts, seed: int, actions: list[str]) -> bool:
    probe.reset(seed)
    for action in actions[:facts.max_turns]:
        _, reward, terminated, truncated, _ = probe.step(action)
        if terminated:
            return reward > 0
        if truncated:
            return False
    return False
