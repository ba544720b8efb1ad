"""How well a model designs envs: N designs per domain through `spade design | spade validate`.

    python benchmarks/designer.py --base-url http://127.0.0.1:8000/v1 -o runs/designer-coder
    python benchmarks/designer.py -m models/coder -n 12 --max-tokens 4096 -o runs/designer-coder
    python benchmarks/designer.py --revalidate runs/designer-coder    # after a validator change

Samples at the paper's design settings (temperature, top-p, top-k of the design stage of
recipes/qwen3-4b-games.toml; `--max-tokens` a flag, default the recipe's) and prints one row
per domain: designs, accepted, yield, reject reasons by check, mean completion tokens and
seconds per design. The designs of a domain are made in parts of `--part` designs (part k
seeded `--seed` + k), each its own `spade design -o DIR`: a rerun with the same `-o` keeps the
finished parts and the designs a stopped part had made, so a study of hours on a CPU server
can be stopped and resumed, and `-n` raised later to add parts; `--jobs J` designs J parts at
once. `--revalidate DIR` validates
the stored designs again and prints the old and new tables, so a validator change is measured
on the same designs. `--repairs R` gives each rejected design up to R repair turns
(`spade design --retry ... --repair`) and prints a second table: per domain, the slots filled at
turn 1 and after each repair, the repairs that copied their parent, reject reasons by check per
turn, and tokens and seconds per repair. Runs the real commands as subprocesses.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "qwen3-4b-games.toml"
DOMAINS = ("game", "tool_use")


def paper_sampling(recipe: Path = RECIPE) -> dict:
    """temperature, top-p, top-k and max-tokens of the recipe's design stage (absent: None)."""
    stages = tomllib.loads(recipe.read_text()).get("stage", [])
    design = next(stage for stage in stages if stage.get("command") == "design")
    return {key: design.get(key) for key in ("temperature", "top-p", "top-k", "max-tokens")}


def spade(*args: str) -> list[str]:
    return [sys.executable, "-m", "spade_cli", *args]


def design_command(args, domain: str, out: Path, sampling: dict, batch: int,
                   seed: int) -> list[str]:
    if args.base_url:
        backend = ["--backend", "openai", "--base-url", args.base_url, "-m", args.served_name]
    else:
        backend = ["--backend", args.backend, "-m", args.model]
    argv = spade("design", *backend, "--domain", domain, "-b", str(batch), "--seed", str(seed),
                 "--max-tokens", str(args.max_tokens), "-o", str(out))
    for key in ("temperature", "top-p", "top-k"):
        if sampling.get(key) is not None:
            argv += [f"--{key}", str(sampling[key])]
    return argv + list(args.design_arg or [])


def validate(designs: Path, out: Path, seed: int) -> float:
    started = time.monotonic()
    subprocess.run(spade("validate", str(designs), "-o", str(out), "--overwrite", "--seed",
                         str(seed), "--allow-all-rejected"), check=True)
    return time.monotonic() - started


def records(path: Path) -> list[dict]:
    files = [file for file in sorted(path.glob("*.jsonl")) if not file.name.startswith("_")] \
        if path.is_dir() else [path]
    return [json.loads(line) for file in files for line in file.read_text().splitlines()
            if line.strip()]


def row(domain: str, designs: list[dict], checked: list[dict], seconds: float | None) -> dict:
    rejects = Counter(r.get("check", "?") for r in checked if r.get("kind") == "validation")
    accepted = sum(r.get("kind") == "env" for r in checked)
    tokens = [len(d["completion_ids"]) for d in designs if d.get("completion_ids")]
    return {"domain": domain, "designs": len(designs), "accepted": accepted,
            "yield": accepted / len(designs) if designs else 0.0, "rejects": dict(rejects),
            "cut": sum(d.get("meta", {}).get("finish_reason") in ("length", "repetition")
                       for d in designs),  # at --max-tokens, or a loop stopped (--stop-loops)
            "tokens": sum(tokens) / len(tokens) if tokens else None,
            "seconds": seconds}


def table(rows: list[dict], title: str, max_tokens: int | None) -> str:
    lines = [f"{title} (max tokens {max_tokens})",
             f"{'domain':<9} {'designs':>7} {'accepted':>8} {'yield':>6} {'cut':>4} "
             f"{'tokens':>7} {'s/design':>8}  rejects by check"]
    for r in rows:
        rejects = ", ".join(f"{check} {n}" for check, n in sorted(r["rejects"].items())) or "-"
        tokens = f"{r['tokens']:.0f}" if r["tokens"] is not None else "-"
        seconds = f"{r['seconds']:.1f}" if r["seconds"] is not None else "-"
        lines.append(f"{r['domain']:<9} {r['designs']:>7} {r['accepted']:>8} {r['yield']:>6.0%} "
                     f"{r['cut']:>4} {tokens:>7} {seconds:>8}  {rejects}")
    return "\n".join(lines)


def finished(designs: Path) -> bool:
    try:
        return json.loads((designs / "_manifest.json").read_text())["complete"]
    except (FileNotFoundError, KeyError, ValueError):
        return False


def journaled(designs: Path) -> int:
    """Designs a stopped `spade design` saved (its journal's lines)."""
    return sum(len(path.read_bytes().splitlines()) for path in designs.glob("_journal-*.jsonl"))


def design_part(args, domain: str, part: Path, sampling: dict, batch: int, seed: int) -> None:
    """Make (or finish) one part's designs; its timing.json adds up the seconds spent and the
    designs made over every run that worked on it, so s/design survives a resume."""
    designs, timing_file = part / "designs", part / "timing.json"
    if finished(designs):
        return
    timing = json.loads(timing_file.read_text()) if timing_file.exists() else \
        {"seconds": 0.0, "made": 0}
    before = journaled(designs)
    started = time.monotonic()
    subprocess.run(design_command(args, domain, designs, sampling, batch, seed), check=True)
    timing["seconds"] += time.monotonic() - started
    timing["made"] += len(records(designs)) - before
    part.mkdir(parents=True, exist_ok=True)
    timing_file.write_text(json.dumps(timing))


def parts(args) -> list[tuple[int, int]]:
    """(part index, designs in it): -n split into parts of --part."""
    return [(k, min(args.part, args.n - k * args.part))
            for k in range(-(-args.n // args.part))]


def domain_row(folder: Path, domain: str, checked_name: str) -> dict:
    designs, checked, seconds, made = [], [], 0.0, 0
    for part in sorted((folder / domain).glob("part-*")):
        if not (part / checked_name).exists():
            continue
        designs += records(part / "designs")
        checked += records(part / checked_name)
        timing = json.loads((part / "timing.json").read_text())
        seconds, made = seconds + timing["seconds"], made + timing["made"]
    return row(domain, designs, checked, seconds / made if made else None)


def study(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampling = paper_sampling()

    def make(domain: str, index: int, batch: int) -> None:
        part = out / domain / f"part-{index:02d}"
        design_part(args, domain, part, sampling, batch, args.seed + index)
        validate(part / "designs", part / "validated", args.seed)
        for turn in range(2, args.repairs + 2):
            repair_part(args, domain, part, sampling, args.seed + index, turn)

    # parts at once: a server batching many requests makes more tokens a second in all, and
    # one part's slowest design then does not leave it idle
    started = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        for done in [pool.submit(make, domain, index, batch) for index, batch in parts(args)
                     for domain in args.domains]:  # domains in turn: a queue serves both
            done.result()
    rows = [domain_row(out, domain, "validated") for domain in args.domains]
    turns = [turn_row(out, domain, args.repairs) for domain in args.domains] \
        if args.repairs else []
    wall = time.monotonic() - started
    (out / "study.json").write_text(json.dumps({"sampling": sampling, "max_tokens":
                                                args.max_tokens, "jobs": args.jobs,
                                                "wall_seconds": wall, "rows": rows,
                                                "repairs": args.repairs, "turns": turns},
                                               indent=1))
    return rows, turns, wall


def turn_dirs(part: Path, turn: int) -> tuple[Path, Path]:
    """A part's designs and verdicts of designer turn `turn` (1: the fresh designs)."""
    if turn == 1:
        return part / "designs", part / "validated"
    return part / f"repair-{turn}", part / f"repaired-{turn}"


def repair_part(args, domain: str, part: Path, sampling: dict, seed: int, turn: int) -> None:
    """Repair the rejects of turn - 1 (nothing when it had none) and validate the repairs."""
    designs, checked = turn_dirs(part, turn - 1)
    if not any(r.get("kind") == "validation" for r in records(checked)):
        return
    out, verdicts = turn_dirs(part, turn)
    timing_file = part / f"timing-{turn}.json"
    if not finished(out):
        started = time.monotonic()
        subprocess.run(design_command(args, domain, out, sampling, 1, seed) + [
            "--retry", str(checked), "--retry", str(designs), "--repair",
            "--max-attempts", str(args.repairs + 1)], check=True)
        timing_file.write_text(json.dumps({"seconds": time.monotonic() - started,
                                           "made": len(records(out))}))
    validate(out, verdicts, args.seed)


def turn_row(folder: Path, domain: str, repairs: int) -> dict:
    """Slots filled by turn, copies, rejects by check and cost per turn, over every part."""
    slots, filled_at, per_turn = 0, [], []
    for turn in range(1, repairs + 2):
        designs, checked, seconds, made = [], [], 0.0, 0
        for part in sorted((folder / domain).glob("part-*")):
            made_dir, verdict_dir = turn_dirs(part, turn)
            if not verdict_dir.exists():
                continue
            designs += records(made_dir)
            checked += records(verdict_dir)
            if turn > 1 and (part / f"timing-{turn}.json").exists():
                timing = json.loads((part / f"timing-{turn}.json").read_text())
                seconds, made = seconds + timing["seconds"], made + timing["made"]
        if turn == 1:
            slots = len(designs)
        filled_at += [turn] * sum(r.get("kind") == "env" for r in checked)
        cells = row(domain, designs, checked, seconds / made if made else None)
        cells["copies"] = sum(bool(d.get("meta", {}).get("copy_retried")) for d in designs)
        cells["copied_again"] = sum(bool(d.get("meta", {}).get("copies_parent"))
                                    for d in designs)
        per_turn.append(cells)
    return {"domain": domain, "slots": slots,
            "filled": [sum(t <= turn for t in filled_at) for turn in range(1, repairs + 2)],
            "turns": per_turn}


def turn_table(rows: list[dict]) -> str:
    lines = ["slots filled by designer turn (repairs continue the rejected design's conversation)",
             f"{'domain':<9} {'turn':>4} {'asked':>5} {'accepted':>8} {'filled':>10} "
             f"{'copies':>6} {'tokens':>7} {'s/design':>8}  rejects by check"]
    for r in rows:
        for turn, (cells, filled) in enumerate(zip(r["turns"], r["filled"]), 1):
            rejects = ", ".join(f"{c} {n}" for c, n in sorted(cells["rejects"].items())) or "-"
            tokens = f"{cells['tokens']:.0f}" if cells["tokens"] is not None else "-"
            seconds = f"{cells['seconds']:.1f}" if cells["seconds"] is not None else "-"
            copies = f"{cells['copies']}/{cells['copied_again']}" if turn > 1 else "-"
            share = f"{filled}/{r['slots']}"
            lines.append(f"{r['domain']:<9} {turn:>4} {cells['designs']:>5} "
                         f"{cells['accepted']:>8} {share:>10} {copies:>6} {tokens:>7} "
                         f"{seconds:>8}  {rejects}")
    lines.append("copies: repairs that answered with their parent's code and were asked again / "
                 "that copied it again")
    return "\n".join(lines)


def revalidate(folder: Path, seed: int) -> tuple[list[dict], list[dict]]:
    stored = json.loads((folder / "study.json").read_text())
    before, after = stored["rows"], []
    for old in before:
        domain = old["domain"]
        for part in sorted((folder / domain).glob("part-*")):
            validate(part / "designs", part / "revalidated", seed)
        after.append(domain_row(folder, domain, "revalidated"))
    return before, after


def main(argv: list[str] | None = None) -> None:
    sampling = paper_sampling()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible server (what spade serve starts)")
    parser.add_argument("--served-name", default="spade-policy")
    parser.add_argument("-m", "--model", help="model directory for --backend (default hf)")
    parser.add_argument("--backend", default="hf")
    parser.add_argument("-n", type=int, default=48, help="designs per domain")
    parser.add_argument("--part", type=int, default=12,
                        help="designs per part (the unit a rerun keeps whole)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="parts designed at once (a CPU server: as many as its KV cache holds)")
    parser.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=DOMAINS)
    parser.add_argument("--max-tokens", type=int, default=sampling["max-tokens"] or 4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repairs", type=int, default=0, metavar="R",
                        help="repair turns for each rejected design (0: none)")
    parser.add_argument("-o", "--out", default="runs/designer")
    parser.add_argument("--revalidate", metavar="DIR", help="validate a study's designs again")
    parser.add_argument("--request-timeout", type=float, default=7200.0, metavar="SECONDS",
                        help="how long one design may take on the server (SPADE_REQUEST_TIMEOUT;"
                             " a CPU server makes a few tokens a second per request)")
    parser.add_argument("--design-arg", action="append", metavar="ARG",
                        help="one more `spade design` argument (repeatable)")
    args = parser.parse_args(argv)
    os.environ["SPADE_REQUEST_TIMEOUT"] = str(args.request_timeout)  # the design subprocesses'
    if args.revalidate:
        before, after = revalidate(Path(args.revalidate), args.seed)
        stored = json.loads((Path(args.revalidate) / "study.json").read_text())
        print(table(before, "before", stored["max_tokens"]))
        print(table(after, "after", stored["max_tokens"]))
        return
    if not (args.base_url or args.model):
        parser.error("give --base-url or -m MODEL")
    rows, turns, wall = study(args)
    print(table(rows, f"designer study: {args.base_url or args.model}, sampling "
                      f"{ {k: v for k, v in sampling.items() if k != 'max-tokens'} }",
                args.max_tokens))
    if turns:
        print(turn_table(turns))
    print(f"this run: {wall:.0f} s with {args.jobs} part(s) at once; s/design is a part's own "
          f"seconds over the designs it made (a resumed part adds up its runs)")


if __name__ == "__main__":
    main()
