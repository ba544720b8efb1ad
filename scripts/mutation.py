"""Mutation testing of the modules where a wrong number changes the science or the safety.

Driven by scripts/mutation.sh; the tool is mutmut 3 (the `mutation` extra). mutmut runs the
mapped test files once, records which tests reach each function, and then runs each mutant
against only those tests (per-mutant test selection), each mutant in a forked process.

Subcommands (all paths relative to the repository root):
  modules                      the module paths, smallest and most important first
  prepare MODULE WORKDIR       copy the tree into WORKDIR and write its setup.cfg for MODULE
  globs MODULE                 the mutant-name globs of MODULE (its functions in scope)
  summary WORKDIR MODULE...    read mutmut's results, drop the listed equivalents, print the
                               survivors and the line `mutation: K/N killed (E equivalent)`

Equivalent mutants live in scripts/mutation-equivalent.txt, one a line:
  <mutant name>  <one-line reason>
(`#` starts a comment). A listed name that no longer names a mutant is reported as stale.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "scripts" / "mutation-equivalent.txt"
PACKAGES = ("stages", "sandbox", "spade_cli")  # copied whole, so mutants/ imports consistently
ALSO_COPY = ("benchmarks", "recipes", "docs", "scripts", "justfile", "README.md")


@dataclass(frozen=True)
class Target:
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()  # empty: the whole module; else function-name globs


# The trainer's model-free tests: each of its targets runs them all (mutmut picks, per mutant,
# the ones that reach its function, and a sample's helpers are reached from the loss's tests)
TRAINER_TESTS = ("tests/stages/train/test_grpo.py", "tests/stages/train/test_samples.py",
                 *(f"tests/stages/train/test_loop.py::{t}" for t in (
                     "test_one_step_per_round_over_whole_episodes_by_default",
                     "test_plan_steps_epochs_and_units",
                     "test_the_step_plan_is_a_function_of_the_seed")))

# module -> the test files that cover it (new ones may be missing: they are skipped)
TARGETS: dict[str, Target] = {
    "stages/rewards.py": Target(("tests/stages/test_rewards.py",
                                 "tests/stages/test_rewards_boundaries.py")),
    "stages/score_regret.py": Target(("tests/stages/test_score_regret.py",
                                      "tests/stages/test_score_regret_boundaries.py")),
    # the loss, sample and step-plan code only, and the model-free tests: one with a model takes
    # seconds, and mutmut's timeouts would make a run of a few hundred mutants take an hour
    "stages/train/grpo.py": Target(TRAINER_TESTS, ("token_loss", "kl_k3", "loss_weights")),
    "stages/train/samples.py": Target(
        TRAINER_TESTS, ("build_samples", "crashed_step", "trained_reward", "play_samples",
                        "turns_extend", "episode_sample", "malformed_tool_call", "Sample.*")),
    "stages/train/loop.py": Target(TRAINER_TESTS, ("plan_steps",)),
    "sandbox/replies.py": Target(("tests/sandbox/test_replies.py",
                                  "tests/sandbox/test_replies_boundaries.py")),
    "stages/memory.py": Target(("tests/stages/test_memory.py",
                                "tests/stages/test_memory_boundaries.py")),
    # and the in-process tests of bounded I/O (not its two that start the CLI in a subprocess)
    "stages/shards.py": Target(
        ("tests/stages/test_shards.py", "tests/stages/test_shards_boundaries.py",
         *(f"tests/stages/test_bounded_io.py::{t}" for t in (
             "test_a_line_over_the_cap_names_file_and_line",
             "test_a_line_exactly_at_the_cap_is_read",
             "test_a_bad_cap_is_a_data_error",
             "test_a_200_mb_line_under_a_1_mb_cap_reads_in_flat_memory",
             "test_dev_zero_is_refused_at_the_cap",
             "test_a_gzip_bomb_is_refused_in_flat_memory",
             "test_a_full_disk_is_exit_74_and_leaves_nothing",
             "test_a_full_disk_while_writing_lines_is_exit_74",
             "test_an_input_error_while_writing_is_not_an_output_error",
             "test_a_read_only_dir_is_exit_73",
             "test_an_unwritable_dir_is_exit_73",
             "test_a_dangling_symlink_as_out_dir_is_exit_73_in_one_line")))),
    # the static checks, and the runtime checks (determinism, garbage, oracle, trivial, solve,
    # the whole order) judged on an env played in-process by a stand-in for the jailed worker
    # (tests/sandbox/env_worker.py); only the jail-free tests: test_contract.py's runtime tests
    # start two nsjail workers each (seconds), and every mutant of parse or structure would rerun
    # them all
    "sandbox/contract.py": Target(
        ("tests/sandbox/test_contract_boundaries.py",
         *(f"tests/sandbox/test_contract.py::{t}" for t in (
             "test_any_stdlib_import_and_the_math_verify_stand_in_pass",
             "test_denied_and_non_stdlib_imports_fail_structure_with_the_reason",
             "test_every_denied_import_says_why",
             "test_tool_use_env_may_define_its_own_parts",
             "test_tool_use_env_may_not_redefine_base_internals",
             "test_structure_tells_the_reference_format_and_a_missing_solution",
             "test_a_reference_tool_use_env_needs_reset_and_solution_not_setup",
             "test_designer_prompts_allow_the_stdlib_and_name_exactly_the_deny_list"))),
        ("extract", "check_size", "parse", "import_problem", "check_imports",
         "structure", "takes_max_turns", "static_checks", "_stub", "drop_restated_base",
         "describe", "short", "step_problem", "load", "solution_actions", "wins_most",
         "check_reset_gate", "global_random_use", "Probe.*", "Seeds.*",
         "check_reset", "trace", "check_determinism", "check_garbage", "play", "won", "replay",
         "generic_action", "generic_actions", "check_oracle", "oracle_reason", "check_trivial",
         "solve", "sent_actions", "same_episode", "same_solution", "runtime_checks")),
    # the blind policies, near misses, caps and chance, played in-process as above; of
    # test_validate.py only its jail-free tests of near misses and literals
    "stages/trivial.py": Target(
        ("tests/stages/test_trivial_boundaries.py",
         *(f"tests/stages/test_validate.py::{t}" for t in (
             "test_near_misses_change_only_the_final_answer_and_never_its_case",
             "test_literals_are_short_action_like_deduplicated_and_capped")))),
    # the hint and reward handling; test_rollout.py's plays run in nsjail (about a second each,
    # some wait out timeouts), so only its jail-free tests: test_rollout_hints.py plays the same
    # code against an in-process stand-in for the worker
    "stages/rollout.py": Target(
        ("tests/stages/test_rollout.py::test_game_actions_are_normalised_to_the_last_box",
         "tests/stages/test_rollout.py::"
         "test_a_static_pool_is_played_a_slice_per_round_every_env_once_per_pass",
         "tests/stages/test_rollout_hints.py"),
        ("hinted_only", "play_seed", "envs_for_round", "cap", "Episode.*", "Blacklist.*")),
}

# mutmut's exit codes (mutmut/stats.py): caught means a test, a timeout or a crash noticed it
CAUGHT = {1, 3, 36, 37, -24, 24, 152, 255, -11, -9}


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def globs(path: str) -> list[str]:
    """mutmut names a mutant `pkg.mod.x_func__mutmut_3` (a method: `pkg.mod.xǁClassǁm__mutmut_3`)."""
    target = TARGETS[path]
    mod = module_name(path)
    if not target.functions:
        return [f"{mod}.*"]
    out = []
    for fn in target.functions:
        if "." in fn:
            cls, meth = fn.split(".", 1)
            out.append(f"{mod}.x\u01c1{cls}\u01c1{meth}__mutmut_*")
        else:
            out.append(f"{mod}.x_{fn}__mutmut_*")
    return out


def in_scope(name: str, path: str) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs(path))


def test_files(path: str, root: Path = ROOT) -> list[str]:
    """The module's mapped test files (or `file::test` node ids) that exist."""
    return [t for t in TARGETS[path].tests if (root / t.split("::")[0]).exists()]


def setup_cfg(path: str, root: Path = ROOT) -> str:
    tests = test_files(path, root)
    if not tests:
        raise SystemExit(f"mutation: no test file of {path} exists")
    lines = ["[mutmut]", "source_paths =", *(f"    {p}" for p in PACKAGES),
             "only_mutate =", f"    {path}",
             "also_copy =", *(f"    {p}" for p in ALSO_COPY),
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             "pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -q",
             "use_git_change_detection = false",
             "timeout_multiplier = 10.0", "timeout_constant = 5.0", ""]
    return "\n".join(lines)


def prepare(path: str, workdir: Path) -> None:
    """A private copy of the tree: others editing the work tree never see a mutant, and
    mutmut's mutants/ (its cache between runs) stays out of the checkout."""
    if path not in TARGETS:
        raise SystemExit(f"mutation: unknown module {path} (one of {', '.join(TARGETS)})")
    workdir.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "runs", "results")
    for name in (*PACKAGES, "tests", *ALSO_COPY, "pyproject.toml"):
        src, dst = ROOT / name, workdir / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, dst)
    # a source or test that changed since the last run: mutmut re-mutates by content hash,
    # but a copied test file must replace its stale copy under mutants/ too
    stale = workdir / "mutants" / "tests"
    if stale.exists():
        shutil.rmtree(stale)
    (workdir / "setup.cfg").write_text(setup_cfg(path))


def read_equivalents(text: str) -> dict[str, str]:
    """`name reason...` lines; a name without a reason is an error (each needs one)."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"mutation-equivalent.txt:{n}: {name} has no reason")
        out[name] = reason.strip()
    return out


@dataclass
class Tally:
    module: str
    total: int = 0
    killed: int = 0
    equivalent: int = 0
    survivors: list[tuple[str, str]] = field(default_factory=list)  # (name, status)
    stale: list[str] = field(default_factory=list)

    @property
    def counted(self) -> int:
        return self.total - self.equivalent


def status(code: int | None) -> str:
    if code in CAUGHT:
        return "killed"
    return {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", None: "not checked"}.get(
        code, "suspicious")


def tally(module: str, exit_codes: dict[str, int | None], equivalents: dict[str, str]) -> Tally:
    t = Tally(module)
    mod = module_name(module) + "."
    names = {k for k in exit_codes if in_scope(k, module)}
    for name in sorted(names, key=_order):
        t.total += 1
        code = exit_codes[name]
        if name in equivalents:
            t.equivalent += 1
            if code in CAUGHT:  # listed as equivalent yet a test kills it: the listing is wrong
                t.stale.append(name + " (killed: not equivalent)")
        elif code in CAUGHT:
            t.killed += 1
        else:
            t.survivors.append((name, status(code)))
    t.stale += sorted(n for n in equivalents if n.startswith(mod) and n not in names)
    return t


def _order(name: str) -> tuple[str, int]:
    head, _, num = name.rpartition("__mutmut_")
    return head, int(num) if num.isdigit() else 0


def summary_line(tallies: list[Tally]) -> str:
    killed = sum(t.killed for t in tallies)
    counted = sum(t.counted for t in tallies)
    equivalent = sum(t.equivalent for t in tallies)
    return f"mutation: {killed}/{counted} killed ({equivalent} equivalent)"


def mutant_diff(workdir: Path, module: str, name: str) -> str:
    """The mutated line(s) against the original function, from mutmut's trampolined copy."""
    try:
        tree = ast.parse((workdir / "mutants" / module).read_text())
    except (OSError, SyntaxError):
        return ""
    local = name.rsplit(".", 1)[-1]
    orig_name = local.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if local not in defs or orig_name not in defs:
        return ""
    a = ast.unparse(defs[orig_name]).splitlines()[1:]
    b = ast.unparse(defs[local]).splitlines()[1:]
    return "; ".join(_changed(x.strip(), y.strip()) for x, y in zip(a, b) if x != y)[:300]


def _changed(old: str, new: str, context: int = 30) -> str:
    """The differing middle of two lines, with a little context either side."""
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[-1 - end] == new[-1 - end]:
        end += 1
    lo = max(0, start - context)
    pre = "..." if lo else ""
    post_o, post_n = old[len(old) - end:][:context], new[len(new) - end:][:context]
    return f"{pre}{old[lo:len(old) - end]}{post_o}  ->  {pre}{new[lo:len(new) - end]}{post_n}"


def summary(workdir: Path, modules: list[str], verbose: bool = True) -> int:
    equivalents = read_equivalents(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    tallies = []
    for module in modules:
        meta = workdir / module_slug(module) / "mutants" / (module + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        t = tally(module, codes, equivalents)
        tallies.append(t)
        print(f"{module}: {t.killed}/{t.counted} killed ({t.equivalent} equivalent)")
        for name, st in t.survivors if verbose else ():
            diff = mutant_diff(workdir / module_slug(module), module, name)
            print(f"  {st}: {name}  {diff}")
        for name in t.stale:
            print(f"  stale equivalent listing: {name}")
    print(summary_line(tallies))
    return 0


def module_slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", "-")


def main(argv: list[str]) -> int:
    cmd, *args = argv or ["help"]
    if cmd == "modules":
        print("\n".join(TARGETS))
    elif cmd == "slug":
        print(module_slug(args[0]))
    elif cmd == "prepare":
        prepare(args[0], Path(args[1]))
    elif cmd == "globs":
        print("\n".join(globs(args[0])))
    elif cmd == "summary":
        return summary(Path(args[0]), args[1:])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
