"""Audit benchmark: can the designer buy reward? Validation's verdicts, chance levels, hint leaks.

What it measures, in the jail, in one run:
  1. false rejects   `spade validate`'s checks on every valid env the project has, of every shape:
                     the valid and reference-format fixtures (tests/fixtures/validate), the seed
                     library and its starter tier, the docs' two examples. Target: none rejected.
  2. true rejects    the same checks on the adversarial corpus (tests/adversarial/programs):
                     every program that must not pass (no `may-pass` in its header), by check;
                     reward hacks (hack_*), hostile attempts (policy), the rest. Target: all.
  3. chance level    `meta.trivial.chance` of the seed library and starter envs: the win rate of
                     a blind player replaying another seed's solution.
  4. hint leaks      stages/leaks.py on two hints per seed env: an honest one written here (a
                     strategy, numbers and quoted words in it, as real hints have), and the
                     worst a hint can carry, every validation seed's final answer listed in
                     order. Target: no honest hint leaks.

How to run:
  python benchmarks/audit.py               # about 3 minutes on 2 cores
  python benchmarks/audit.py --json out.json
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import exit_69_when_unavailable, finish, table  # noqa: E402
from sandbox.jail import Sandbox  # noqa: E402
from stages import leaks, seed_library, validate  # noqa: E402
from stages.records import Env, Validation  # noqa: E402
from stages.shards import Stats  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "validate"
PROGRAMS = ROOT / "tests" / "adversarial" / "programs"
EXPECT_RE = re.compile(r"^# expect: validate=(\S+) ", re.M)
VALID_SETS = {
    "valid fixtures": sorted((FIXTURES / "valid").glob("*.py")),
    "reference format": sorted((FIXTURES / "reference").glob("*.py")),
    "seed library": seed_library.files("game") + seed_library.files("tool_use"),
    "starter tier": sorted((ROOT / "stages" / "seed_library" / "starter").glob("*.py")),
    "docs examples": [ROOT / "docs" / "examples" / "guess_number.py",
                      ROOT / "docs" / "examples" / "todo_list.py"],
}
# Honest hints, as a designer that knows the program would write them: a way to the answer,
# with the numbers and words a strategy names, never the answer of a seed.
HONEST = {
    "BoxPushEnv": "Never push the crate into a corner or along a wall that has no target on "
                  "it; walk around to the side opposite the direction you want it to go.",
    "CraftingEnv": "Work backwards from the target item and count the raw materials each "
                   "recipe uses: the 'trap' recipes spend a material the target still needs.",
    "CyclicHanoiEnv": "Moves only go clockwise, so moving a disk one peg back takes 2 moves; "
                      "plan the largest disk first and count moves before you commit.",
    "HiddenRuleEnv": "Probe small inputs such as 0, 1 and 2 first, then a large one like 10, "
                     "and check whether the differences or the ratios stay constant.",
    "KeyDoorMazeEnv": "Find the key before you go near the door: the door stays shut until you "
                      "carry it, and the map shows walls as '#'.",
    "MemoryVaultEnv": "Write the ledger down as a table the moment it is shown, and update the "
                      "row whenever a code change is announced: it is said only once.",
    "NumberForgeEnv": "Work backwards from the target: if it is even, think about halving; "
                      "save the operations with 1 use left for the last steps.",
    "RiverCrossingEnv": "Take the troublemaker across first and bring someone back when you "
                        "need to; a pair that cannot be left alone never stays on one bank.",
    "SeatingLogicEnv": "Place the guests the clues pin to a seat first, then the ones with "
                       "'next to' clues; you only get 2 submissions, so check every clue.",
    "WaterJugsEnv": "The tap allows few fills: pour between jugs rather than draining, and "
                    "track each jug's amount after every move.",
    "BankTransfersEnv": "Read each error: a short balance means a transfer between your own "
                        "accounts first, and a new payee must be registered before paying.",
    "FileManagerEnv": "Check whether each request says 'copy' or 'move' and 'append' or "
                      "'overwrite'; trash is recoverable, permanent delete is not.",
    "FlightRebookingEnv": "Verify the booking first; then search the same day's flights, pick "
                          "the earliest with free seats, and only then seats, bags and voucher.",
    "LibraryLoansEnv": "Match the edition, the format and the author exactly: look-alike "
                       "records differ in one of them.",
    "RoomCalendarEnv": "Check capacity and equipment before booking, and read each refusal: "
                       "it says which precondition failed.",
    "ShopCheckoutEnv": "Every call needs an id from an earlier one: look up the customer and "
                       "the SKU first, apply the coupon once, check out once.",
    "CoinBoxesEnv": "Follow the coin: the box it went into is the only one that is not empty.",
    "HeaviestSackEnv": "Add up each sack's parts before you compare; the biggest single part "
                       "does not decide it.",
    "ThreeDoorsEnv": "Look for the door with daylight under it.",
}


def verdicts(paths: list[Path]) -> list[Env | Validation]:
    designs = validate.designs_from_files(paths)
    return list(validate.run(designs, validate.Config(workers=2, seed=0), Stats()))


def false_rejects() -> dict[str, Any]:
    rows, rejected, envs = [], [], []
    for name, paths in VALID_SETS.items():
        records = verdicts(paths)
        bad = [(p.name, r.check, r.error.msg[:120]) for p, r in zip(paths, records)
               if isinstance(r, Validation)]
        rejected += bad
        envs += [r for r in records if isinstance(r, Env)]
        tools = sum(isinstance(r, Env) and r.domain == "tool_use" for r in records)
        rows.append([name, len(paths), len(paths) - tools, tools, len(bad)])
    return {"rows": rows, "rejected": rejected, "envs": envs}


def true_rejects() -> dict[str, Any]:
    paths = sorted(PROGRAMS.glob("*.py"))
    must_fail = [p for p in paths if "may-pass" not in EXPECT_RE.search(p.read_text()).group(1)]
    records = verdicts(must_fail)
    passed = [p.name for p, r in zip(must_fail, records) if isinstance(r, Env)]
    by_check = Counter(r.check for r in records if isinstance(r, Validation))
    groups: dict[str, list[bool]] = {"reward hacks (hack_*)": [], "hostile attempts": [],
                                     "other attacks": []}
    for path, record in zip(must_fail, records):
        group = ("reward hacks (hack_*)" if path.stem.startswith("hack_") else
                 "hostile attempts" if "policy" in EXPECT_RE.search(path.read_text()).group(1)
                 else "other attacks")
        groups[group].append(isinstance(record, Validation))
    rows = [[g, len(v), sum(v)] for g, v in groups.items()]
    return {"programs": len(paths), "must_fail": len(must_fail), "passed": passed,
            "by_check": dict(by_check), "rows": rows}


def final_answers(env: Env, sandbox: Sandbox) -> list[str]:
    """Every validation seed's final solution action, in seed order (the most a hint can list)."""
    from sandbox.contract import Probe, load, solution_actions
    from sandbox.jail import Worker

    answers = []
    with Worker(sandbox) as worker:
        probe = Probe(worker)
        load(probe, env.source)
        for seed in env.meta["validation"]["seeds"]:
            probe.reset(seed)
            answers.append(solution_actions(probe, seed)[-1])
    return answers


def hints(envs: list[Env]) -> dict[str, Any]:
    sandbox = Sandbox()
    rows = []
    for env in envs:
        if env.class_name not in HONEST:
            continue
        honest = leaks.check(env.model_copy(update={"hint": HONEST[env.class_name]}), sandbox)
        listed = " then ".join(final_answers(env, sandbox))
        worst = leaks.check(env.model_copy(update={"hint": f"Try {listed}."}), sandbox)
        rows.append([env.class_name, env.meta["trivial"]["chance"],
                     f"{honest['won']}/{honest['seeds']}", "LEAKS" if honest["leaks"] else "-",
                     f"{worst['won']}/{worst['seeds']}", "LEAKS" if worst["leaks"] else "-"])
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)

    def body() -> int:
        valid = false_rejects()
        print(table("1. valid envs through validation", ["set", "envs", "games", "tool use",
                                                         "rejected"], valid["rows"]))
        for name, check, msg in valid["rejected"]:
            print(f"  rejected: {name}: {check}: {msg}")
        attacks = true_rejects()
        print(table(f"2. adversarial programs that must not pass ({attacks['must_fail']} of "
                    f"{attacks['programs']})", ["group", "programs", "rejected"], attacks["rows"]))
        print("  by check: " + ", ".join(f"{c} {n}" for c, n in sorted(attacks["by_check"].items())))
        for name in attacks["passed"]:
            print(f"  passed: {name}")
        leaked = hints([e for e in valid["envs"] if e.meta.get("source_file", "").find(
            "seed_library") >= 0])
        print(table("3-4. seed library: chance level and hint leaks (won/seeds)",
                    ["env", "chance", "honest hint", "", "every answer listed", ""],
                    leaked["rows"]))
        total = sum(row[1] for row in valid["rows"])
        false = len(valid["rejected"])
        honest_leaks = sum(row[3] == "LEAKS" for row in leaked["rows"])
        results = {"valid": {k: v for k, v in valid.items() if k != "envs"}, "attacks": attacks,
                   "hints": leaked}
        return finish(results, [
            ("no valid env rejected", false == 0, f"{false}/{total} rejected"),
            ("every must-fail program rejected", not attacks["passed"],
             f"{attacks['must_fail'] - len(attacks['passed'])}/{attacks['must_fail']} rejected"),
            ("no honest hint leaks", honest_leaks == 0,
             f"{honest_leaks}/{len(leaked['rows'])} leak"),
        ], args.json)

    return exit_69_when_unavailable("audit", body)


if __name__ == "__main__":
    sys.exit(main())
