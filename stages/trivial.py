"""trivial, continued: what a model emits when it does not know must not win.

In: an env that passed every runtime check (sandbox/contract.py `runtime_checks`, whose `trivial`
plays doing nothing, cycled generic actions and other seeds' solutions), its source, facts and
the seeds those checks played. Out: the per-policy tally and the env's chance level for the
validation record (`meta.trivial`), or `ContractError("trivial", ...)` naming the policy that wins, e.g.
`"I don't know" every turn wins 5 of 5 seeds`. Runs in the validate stage, after the contract's
checks, so a play that times out here is still a `resources` reject and a bad step a `step_types`
one.
Guarantees: deterministic (policies and their order derive from the source and the solutions
only; the seeds are the validation's own); `solution()` runs in a worker of its own, never in the
one that plays (as in the contract); at most MAX_PLAYS_PER_SEED episodes and MAX_STEPS_PER_SEED
steps per seed played, chance level included, in at most 1/TIME_SHARE of a jail's lifetime. An
env that reaches one of these caps is rejected, never accepted on the policies played so far
(the ones left could be the ones that win: an env slow enough to run out the clock before its
own literals are played would hide a backdoor there): the time cap is a `resources` reject
(outcome timeout), the play and step caps a `trivial` one, each naming its cap and how far play
got, with `meta.trivial.capped` naming the cap ("time", "plays" or "steps"; None for an env
that let every play finish). The shipped envs stay far below: at most 200 plays and 3700 steps
on five seeds, and 2.3 s of the 20 s the default 60 s budget gives (on a busy 2-core machine).

Blind policies, each played from turn 1 over the env's whole turn budget on every seed: plain
prose, a refusal, "I don't know", `\\boxed{}`, malformed boxes (`\\boxed{`, `\\boxed{}}`), the
latest observation echoed, the first observation echoed, each generic action of the env's kind
(contract.GENERIC_ACTIONS: the boxed ones in a game, the others in a tool-use env) repeated every
turn, and each string literal of the env's own source (ast str constants, stripped, of at most
LITERAL_MAX_CHARS characters and LITERAL_MAX_WORDS words, with a letter or digit, deduplicated,
shortest first, at most MAX_LITERALS) as a fixed action, boxed (`<answer>...</answer>` in a
tool-use env) unless it already is an action. One fails the env when it wins more than half of
the seeds *and* the seeds it won do not all give the same episode (solution, or first
observation for an env without one): a fixed action that wins seeds with different answers is a
shortcut, while one that wins only seeds sharing an answer is a lucky guess (a coin game's
"heads" wins the seeds that hid heads). Play of a policy stops once half its seeds are lost.
Order: the blind policies but literals, near misses, literals (so a long list of decoy literals
cannot crowd the near misses out of the caps).

Near misses, on every seed with a solution: the solution replayed with only its *final* action
changed (a near miss earlier in a long plan may still win legitimately, as when many moves
work). In the final action's payload (the last `\\boxed{...}`, `<answer>...</answer>` or
`<tool_call>` JSON), each of the first NEAR_MISS_NUMBERS numbers one at a time off by -1 and +1,
and by -2% and +2% where 2% is at least one unit of the number's last digit (so a grader that
rounds to the precision the solution shows is not blamed); and, in a box or answer, the first
letter of the last word moved one letter on (same case, z to a: never a case or spacing change,
which a fair grader may ignore). A control is played first (the payload replaced by `zzz`, a
tool call by a call of an unknown tool): on a seed where it also wins, the final action is not
graded (a tool-use env scored on its state) and near misses do not count there. Near misses
fail the env when they win more than half of the seeds while the control loses: for a number,
both of one pair (-1 and +1, or -2% and +2%), since a two-sided neighbourhood of the truth is a
tolerance, while one side alone is a threshold game's (at least N); for the changed letter, on
its own. An env whose answer is any number in a range and whose solution answers inside it is
rejected by this rule: its solution should answer at an end of the range.

Chance level, for an env that passes: the win rate of a blind player that knows every answer
the env gives but not which one this seed hides, i.e. replays the solution of another seed
chosen at random. Worked out exactly rather than sampled: on each seed, the share of the other
seeds' solutions that win it, averaged over the seeds (`meta.trivial.chance`; None for an env
without solution()). A coin flip's chance is about 0.5, a maze's about 0. score-regret carries it
and `--chance-adjusted` pays the plateau on the win above it (stages/rewards.py).
"""

from __future__ import annotations

import ast
import re
import time
from statistics import fmean
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, localcontext
from typing import Callable

from sandbox.contract import (ACTION_MARKS, GENERIC_ACTIONS, REFERENCE_REWARD_BOUND, REWARD_BOUND,
                              ContractError, EnvFacts, Probe, Seeds, Solved, load, parse, solve,
                              structure)
from sandbox.jail import Sandbox, Worker

MAX_LITERALS = 32  # string literals of the source played as fixed actions
LITERAL_MAX_CHARS = 40  # longer ones, and ones of more words, are prompt text (the echo policies
LITERAL_MAX_WORDS = 3  # play that), not an action
NEAR_MISS_NUMBERS = 3  # numbers of the final action perturbed, first ones first
# What this check may play, per validation seed (a spare seed drawn adds its share: the plays
# grow with the seeds): 400 episodes and 6000 steps on the usual five seeds, where the seed
# library takes at most 199 and 3708.
MAX_PLAYS_PER_SEED = 80
MAX_STEPS_PER_SEED = 1200
TIME_SHARE = 3  # and at most 1/TIME_SHARE of a jail's lifetime (--budget): the rest is left to
# load, solve and the chance level's replays
PROSE = ("Let me think about this step by step. I will look at what I am given, work out "
         "what is being asked, and reason carefully before I commit to anything.")
REFUSAL = "I'm sorry, but I can't help with that."
UNKNOWN = "I don't know."
PERCENT = Decimal("0.02")
CONTROL = "zzz"
CONTROL_CALL = '{"name": "zzz", "arguments": {}}'
NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
PAYLOAD_RES = (re.compile(r"\\boxed\{([^{}]*)\}"), re.compile(r"<answer>(.*?)</answer>", re.S),
               re.compile(r"<tool_call>(.*?)</tool_call>", re.S))
WORD_RE = re.compile(r"[A-Za-z]+")
ALNUM_RE = re.compile(r"[^\W_]")

Policy = Callable[[int, str, str], str]  # (turn, latest observation, first observation) -> action
CAP_ADVICE = {"time": "make every step take milliseconds",
              "plays": "use fewer short string literals (each is played as a policy)",
              "steps": "use fewer turns or fewer short string literals (each is played as a "
                       "policy)"}


def fixed(action: str) -> Policy:
    return lambda turn, obs, first: action


def blind_policies(domain: str) -> list[tuple[str, Policy]]:
    """(name, policy) for what a model may emit without knowing the answer, in order."""
    policies = [("plain prose", fixed(PROSE)), ("a refusal", fixed(REFUSAL)),
                ('"I don\'t know"', fixed(UNKNOWN)), ("\\boxed{}", fixed("\\boxed{}")),
                ("\\boxed{", fixed("\\boxed{")), ("\\boxed{}}", fixed("\\boxed{}}")),
                ("echoing the observation", lambda turn, obs, first: obs),
                ("echoing the first observation", lambda turn, obs, first: first)]
    if domain == "tool_use":
        policies.append(("<answer>I don't know</answer>", fixed(f"<answer>{UNKNOWN}</answer>")))
    generic = [a for a in GENERIC_ACTIONS if a.startswith("\\boxed{") == (domain == "game")]
    return policies + [(action, fixed(action)) for action in generic if action != "\\boxed{}"]


def literal_policies(domain: str, source: str, played: set[str]) -> list[tuple[str, Policy]]:
    """Each string literal of the source as a fixed action, unless `played` already has it."""
    actions = dict.fromkeys(as_action(domain, text) for text in literals(source))
    return [(action, fixed(action)) for action in actions if action not in played]


def literals(source: str) -> list[str]:
    """The source's string constants that could be an action (stripped, of at most
    LITERAL_MAX_CHARS characters and LITERAL_MAX_WORDS words, with a letter or digit),
    deduplicated, shortest first (then in source order), at most MAX_LITERALS."""
    found: dict[str, tuple[int, int, int]] = {}
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if len(text) <= LITERAL_MAX_CHARS and "\n" not in text and text not in found \
                    and len(text.split()) <= LITERAL_MAX_WORDS and ALNUM_RE.search(text):
                found[text] = (len(text), node.lineno, node.col_offset)
    return sorted(found, key=found.__getitem__)[:MAX_LITERALS]


def as_action(domain: str, text: str) -> str:
    if any(mark in text for mark in ACTION_MARKS):
        return text
    return f"<answer>{text}</answer>" if domain == "tool_use" else f"\\boxed{{{text}}}"


# -- near misses -------------------------------------------------------------------------------

def payload(action: str) -> tuple[int, int, bool] | None:
    """(start, end, has words) of the final action's answer text, or None."""
    for index, pattern in enumerate(PAYLOAD_RES):
        matches = list(pattern.finditer(action))
        if matches:
            return matches[-1].start(1), matches[-1].end(1), index < 2
    return None


def near_misses(action: str) -> dict[str, str]:
    """Variant name -> the action with one near miss in its payload (none equal to `action`)."""
    span = payload(action)
    if span is None:
        return {}
    start, end, words = span
    text = action[start:end]
    out: dict[str, str] = {}

    def put(name: str, new_text: str) -> None:
        variant = action[:start] + new_text + action[end:]
        if variant != action:
            out[name] = variant

    for index, match in enumerate(list(NUMBER_RE.finditer(text))[:NEAR_MISS_NUMBERS]):
        with localcontext() as exact:  # exact, however many digits
            exact.prec = len(match.group()) + 8
            number_misses(index, Decimal(match.group()), match, text, put)
    if words:
        found = list(WORD_RE.finditer(text))
        if found:
            at = found[-1].start()
            letter = text[at]
            base = ord("a") if letter.islower() else ord("A")
            moved = chr(base + (ord(letter) - base + 1) % 26)
            put("one letter changed", text[:at] + moved + text[at + 1:])
    return out


def number_misses(index: int, value: Decimal, match: re.Match, text: str,
                  put: Callable[[str, str], None]) -> None:
    """The +-1 and +-2% misses of one number of `text` (2% only where it is at least one unit
    of the number's last digit)."""
    unit = Decimal(1).scaleb(value.as_tuple().exponent)

    def swap(new: Decimal) -> str:
        return text[:match.start()] + str(new) + text[match.end():]

    for sign in (-1, 1):
        put(f"number {index + 1} {'-+'[sign > 0]}1", swap(value + sign))
        if abs(value) * PERCENT >= unit:
            put(f"number {index + 1} {'-+'[sign > 0]}2%",
                swap((value * (1 + sign * PERCENT)).quantize(unit / 100)))


def control(action: str) -> str | None:
    """The final action with its answer replaced by one no grader takes; None without one."""
    span = payload(action)
    if span is None:
        return None
    if not span[2]:
        return action[:span[0]] + CONTROL_CALL + action[span[1]:]
    return action[:span[0]] + CONTROL + action[span[1]:]


# -- playing -----------------------------------------------------------------------------------

class Capped(ContractError):
    """Play reached a cap: at the time cap a `resources` reject (outcome timeout), at the play
    or step cap a `trivial` one."""

    def __init__(self, cap: str, msg: str):
        timed = cap == "time"
        super().__init__("resources" if timed else "trivial", msg, "timeout" if timed else "ok")


class Plays:
    """Episodes on one probe, within caps on episodes, steps and wall time: the play or step
    that would pass one raises `Capped` instead (`capped` then names the cap)."""

    def __init__(self, probe: Probe, seeds: int, seconds: float):
        self.probe, self.count, self.steps = probe, 0, 0
        self.max_plays, self.max_steps = MAX_PLAYS_PER_SEED * seeds, MAX_STEPS_PER_SEED * seeds
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.capped: str | None = None
        self.planned = 0  # episodes the check means to play at most (for the cap's message)

    def start_episode(self) -> None:
        if self.count >= self.max_plays:
            self.cap("plays", f"{self.max_plays}-play cap")
        self.count += 1

    def step(self, action: str) -> list:
        if self.steps >= self.max_steps:
            self.cap("steps", f"{self.max_steps}-step cap")
        if time.monotonic() > self.deadline:
            self.cap("time", f"{self.seconds:g} s cap")
        self.steps += 1
        return self.probe.step(action)

    def cap(self, name: str, cap: str) -> None:
        self.capped = name
        raise Capped(name, f"trivial stopped at its {cap} after {self.count} of at most "
                     f"{max(self.planned, self.count)} plays ({self.steps} steps): an env must "
                     f"let every check finish; {CAP_ADVICE[name]}")

    def episode(self, seed: int, policy: Policy, turns: int) -> bool:
        """Whether the policy wins one episode (terminates with a positive reward)."""
        self.start_episode()
        first = obs = self.probe.reset(seed)[0]
        for turn in range(turns):
            obs, reward, terminated, truncated, _ = self.step(policy(turn, obs, first))
            if terminated:
                return reward > 0
            if truncated:
                return False
        return False

    def replay(self, seed: int, prefix: list[str], last: str) -> bool | None:
        """Whether `prefix` then `last` wins; None when the prefix already ends the episode."""
        actions = prefix + [last]
        self.start_episode()
        self.probe.reset(seed)
        for index, action in enumerate(actions):
            obs, reward, terminated, truncated, _ = self.step(action)
            if terminated or truncated:
                if index < len(prefix):
                    return None
                return terminated and reward > 0
        return False


def chance_level(plays: Plays, solved: dict[int, Solved], max_turns: int) -> float | None:
    """On each seed, the share of the other seeds' solutions that win it; their mean."""
    seeds = [seed for seed in solved if solved[seed].actions]
    if len(seeds) < 2:
        return None
    shares = []
    for seed in seeds:
        outcomes: dict[tuple[str, ...], bool] = {}  # one replay per distinct solution
        for other in seeds:
            actions = tuple(solved[other].actions[:max_turns])
            if other != seed and actions not in outcomes:
                outcomes[actions] = plays.episode(seed, lambda turn, obs, first, a=actions:
                                                  a[min(turn, len(a) - 1)], len(actions))
        shares.append(fmean(outcomes[tuple(solved[o].actions[:max_turns])]
                            for o in seeds if o != seed))
    return round(fmean(shares), 4)


def majority(wins: int, total: int) -> bool:
    return 2 * wins > total


def check_blind(plays: Plays, facts: EnvFacts, solved: dict[int, Solved],
                policies: list[tuple[str, Policy]], tally: dict[str, list[int]]) -> None:
    seeds = list(solved)
    for name, policy in policies:
        won: list[int] = []
        played = 0
        for seed in seeds:
            if 2 * (played - len(won)) >= len(seeds):
                break
            played += 1
            if plays.episode(seed, policy, facts.max_turns):
                won.append(seed)
        tally[name] = [len(won), played]
        episodes = [(solved[s].actions if facts.oracle else solved[s].first) for s in won]
        if majority(len(won), len(seeds)) and any(e != episodes[0] for e in episodes):
            every = "" if name.startswith("echoing") else " every turn"
            raise ContractError("trivial", f"{name}{every} wins {len(won)} of {len(seeds)} seeds "
                                "(seeds with different answers: a shortcut, not a game)")


def check_near_misses(plays: Plays, facts: EnvFacts, solved: dict[int, Solved],
                      tally: dict[str, list[int]]) -> None:
    seeds = [seed for seed in solved if solved[seed].actions]
    if not seeds:
        return
    graded: dict[int, dict[str, str]] = {}  # seed -> variant -> action, where the answer counts
    for seed in seeds:
        actions = solved[seed].actions[:facts.max_turns]
        probe = control(actions[-1])
        if probe is not None and plays.replay(seed, actions[:-1], probe):
            continue  # anything ends this episode well: its final answer is not graded
        graded[seed] = near_misses(actions[-1])
    names = list(dict.fromkeys(name for variants in graded.values() for name in variants))
    wins: dict[str, int] = {}
    for name in names:
        won = played = 0
        for seed, variants in graded.items():
            if 2 * (played - won) >= len(seeds):
                break
            if name in variants:
                played += 1
                actions = solved[seed].actions[:facts.max_turns]
                won += bool(plays.replay(seed, actions[:-1], variants[name]))
        wins[name] = won
        tally[f"near miss: {name}"] = [won, played]
    for name in names:
        pair = (name, name.replace(" -", " +"))
        if name.startswith("number") and " -" in name and \
                all(majority(wins.get(n, 0), len(seeds)) for n in pair):
            raise ContractError("trivial", f"near misses of the solution's final answer win: "
                                f"{pair[0]} wins {wins[pair[0]]} and {pair[1]} wins "
                                f"{wins[pair[1]]} of {len(seeds)} seeds (a tolerance, not the "
                                "answer)")
        if name == "one letter changed" and majority(wins[name], len(seeds)):
            raise ContractError("trivial", f"near misses of the solution's final answer win: "
                                f"{name} wins {wins[name]} of {len(seeds)} seeds")


class TrivialError(ContractError):
    """A reject from this check's plays (`trivial`, or `resources` at the time cap), with the
    tally played up to it (`meta.trivial`)."""

    def __init__(self, exc: ContractError, tally: dict):
        super().__init__(exc.check, exc.msg, exc.outcome)
        self.tally = tally


def check(sandbox: Sandbox, source: str, seeds: list[int], facts: EnvFacts) -> dict:
    """Play the blind policies, near misses and chance level; returns the record's
    `meta.trivial`: policies, episodes and steps played, `capped` None, the chance level, and
    "wins/played" for every policy that won an episode. Raises TrivialError naming the policy
    that wins, or the cap that stopped play (any other ContractError from a play: resources,
    step_types)."""
    env = structure(parse(source))
    tally: dict[str, list[int]] = {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="solve") as side:
        solving = side.submit(solve, sandbox, source, Seeds(list(seeds)), env)
        with Worker(sandbox) as worker:
            probe = Probe(worker, REFERENCE_REWARD_BOUND if env.reference else REWARD_BOUND)
            load(probe, source)
            probe.check = "trivial"
            solved = solving.result()
            plays = Plays(probe, len(solved), sandbox.limits.lifetime / TIME_SHARE)
            try:
                chance = play_all(plays, facts, source, solved, tally)
            except ContractError as exc:
                if exc.check != "trivial" and plays.capped is None:
                    raise
                raise TrivialError(exc, summary(tally, plays)) from None
    return summary(tally, plays, chance)


def play_all(plays: Plays, facts: EnvFacts, source: str, solved: dict[int, Solved],
             tally: dict[str, list[int]]) -> float | None:
    """Every policy, in order, then the chance level (None for an env without solution())."""
    blind = blind_policies(facts.domain)
    literal = literal_policies(facts.domain, source, {name for name, _ in blind})
    plays.planned = planned_plays(facts, solved, len(blind) + len(literal))
    check_blind(plays, facts, solved, blind, tally)
    if facts.oracle:
        check_near_misses(plays, facts, solved, tally)
    check_blind(plays, facts, solved, literal, tally)
    return chance_level(plays, solved, facts.max_turns) if facts.oracle else None


def planned_plays(facts: EnvFacts, solved: dict[int, Solved], policies: int) -> int:
    """The most episodes `play_all` can play: each fixed policy on every seed, then on every
    seed with a solution its near misses' control and variants, and the chance level's replays."""
    finals = [episode.actions[:facts.max_turns][-1] for episode in solved.values()
              if facts.oracle and episode.actions]
    near = sum(1 + len(near_misses(final)) for final in finals)
    return policies * len(solved) + near + len(finals) * (len(finals) - 1)


def summary(tally: dict[str, list[int]], plays: Plays, chance: float | None = None) -> dict:
    return {"policies": len(tally), "plays": plays.count, "steps": plays.steps,
            "capped": plays.capped, "chance": chance,
            "wins": {name: f"{won}/{played}" for name, (won, played) in tally.items() if won}}
