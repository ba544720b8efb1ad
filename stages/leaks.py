"""leaks: does a hint give the answer away? Played, not judged.

In: an env record with a hint (and the seeds it was validated with, `meta.validation.seeds`), a
Sandbox, an env budget in seconds. Out: the check's verdict for `meta.hint.leak`: `{"leaks",
"won", "seeds", "actions"}`, with `error` and `stalled` when the env failed the check.
The hint-only policy plays what the hint text names, in the order it names it, one per turn:
each `\\boxed{...}`, `<answer>...</answer>` and `<tool_call>...</tool_call>` as written, each
quoted string ('...', "...", `...`) and each number not inside one of those, as an action of the
env's kind (boxed in a game, an answer in a tool-use env), never more than the env's turns and
stopping once the actions run out. A hint leaks when that policy wins more than half the seeds:
it carries the answer (or a list of answers short enough to try), not a way to find it.
Guarantees: no model, deterministic (actions from the text, seeds from the record), in a jail
(one worker for all seeds) under one env budget for the whole check, as a rollout play has
(sandbox/budget.py: load, then every seed's reset and steps share `env_budget` seconds). An env
that runs out the clock here (its budget, or one call's timeout) is `stalled`: the hint could
not be checked, so it counts as leaking (`leaks` true, `stalled` naming the outcome), pays
nothing, and is not written again (a new hint would stall the same env again). Any other
failure of an env that passed validation is recorded (`error`) and counts as no leak: the
rollout's own limits deal with it.
"""

from __future__ import annotations

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
    return list(dict.fromkeys(action for _, action in sorted(found)))[:MAX_ACTIONS]


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
    try:
        with Worker(sandbox) as worker:
            reference = structure(parse(env.source)).reference
            probe = Probe(worker, REFERENCE_REWARD_BOUND if reference else REWARD_BOUND,
                          EnvBudget(env_budget))
            facts = load(probe, env.source)
            probe.check = "leak"
            verdict["won"] = sum(_wins(probe, facts, seed, actions) for seed in seeds)
    except ContractError as exc:
        failed = {**verdict, "won": 0, "error": f"{exc.check}: {exc.msg}"[:300]}
        if exc.outcome in STALLED:  # unchecked, so it may not pay
            return {**failed, "leaks": True, "stalled": exc.outcome}
        return failed
    verdict["leaks"] = 2 * verdict["won"] > len(seeds)
    return verdict


def _wins(probe: Probe, facts: EnvFacts, seed: int, actions: list[str]) -> bool:
    probe.reset(seed)
    for action in actions[:facts.max_turns]:
        _, reward, terminated, truncated, _ = probe.step(action)
        if terminated:
            return reward > 0
        if truncated:
            return False
    return False
