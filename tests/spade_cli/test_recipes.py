"""The shipped recipes: each dry-runs to the stages it promises, with the settings that make it
the run it names, and every number in a paper recipe says where it comes from."""

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_cli.app import app

runner = CliRunner()
RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.toml"))
PAPER = [path for path in RECIPES if path.stem.startswith("qwen3-")]
SPADE = ["design", "validate", "hint", "rollout", "score-regret", "train-grpo", "eval"]
TOOL_USE = ["design", "validate", "audit", "hint", "rollout", "score-regret", "train-grpo", "eval"]
# per recipe: the stages of its first round, in order, and words its commands must (+) or must
# not (-) contain
EXPECTED = {
    "quickstart": (["model", *SPADE], []),
    "smollm2-cpu": (["model", *SPADE], []),
    # one round, no training: served, so no trainer ranks are started either
    "coder-cpu": (["model", "design", "validate", "hint", "rollout", "score-regret"],
                  ["+spade model coder", "+--max-tokens 2000", "+--python /",
                   "-spade trainer"]),
    "qwen3-4b-games": (SPADE, ["+MODEL=/models/Qwen3-4B-Instruct-2507", "+--band 0.4 0.6",
                               "+--every 4", "+--kl-beta 0.0", "+--corpus-words 6000",
                               "+--context-length 32768", "+--nproc 8", "---offload"]),
    "qwen3-4b-games-chance-adjusted": (SPADE, ["+--chance-adjusted", "+--band 0.4 0.6",
                                               "+--nproc 8"]),
    "qwen3-4b-games-later": (SPADE, ["+--band 0.2 0.4", "+--ramp 0.0 0.6",
                                     "+--context-length 49152"]),
    "qwen3-8b-games-thinking": (SPADE, ["+MODEL=/models/Qwen3-8B", "+--kl-beta 0.005",
                                        "+--max-tokens 20000 --enable-thinking",
                                        "+--max-tokens 4096 --no-enable-thinking"]),
    "qwen3-30b-a3b-games": (SPADE, ["+MODEL=/models/Qwen3-30B-A3B-Instruct-2507",
                                    "+--nproc 8 --offload auto", "---lora-rank"]),
    "qwen3-30b-a3b-games-no-memory": (SPADE, ["---memory"]),
    "qwen3-30b-a3b-games-no-corpus": (SPADE, ["+--no-corpus", "---corpus "]),
    "qwen3-30b-a3b-games-solve-rate": (SPADE, ["+--variant solve_rate"]),
    "qwen3-30b-a3b-games-learning-potential": (SPADE, ["+--variant learning_potential"]),
    "qwen3-30b-a3b-games-two-skill": (SPADE, ["+--active-skills 2 --skill arithmetic --skill "
                                              "induction"]),
    "qwen3-30b-a3b-games-fixed-env": (["rollout", "train-grpo", "eval"], [
        "+--envs-per-round 24", "+stages/seed_library/envs.jsonl", "---hint", "-score-regret"]),
    "qwen3-4b-tool-use": (TOOL_USE, [
        "+--domain tool_use", "+--round 0 --every 32", "+--batch 16", "+--active-skills 6",
        "+--variant regret --regret-scale 1.0 --variance-term", "+--kl-beta 0.005",
        "+--mask-truncated --mask-malformed-tool-calls", "+--corpus-words 4000",
        "+--hint --round 0", "+--plays 4", "+--max-tokens 512"]),
    "qwen3-8b-tool-use": (TOOL_USE, [
        "+--round 0 --every 8", "+--active-skills 6", "+--variant blend", "+--kl-beta 0.005",
        "+--enable-thinking", "+--mask-malformed-tool-calls"]),
    "qwen3-30b-a3b-tool-use": (TOOL_USE, [
        "+--round 0 --every 8", "+--active-skills 6", "+--variant blend", "+--kl-beta 0.005",
        "---enable-thinking"]),
    # the 4B games run on one GPU: one engine, one trainer rank, AdamW's state in host memory
    "one-gpu-qwen3-4b-games": (SPADE, [
        "+MODEL=/models/Qwen3-4B-Instruct-2507", "+--nproc 1 --offload auto", "---nproc 8",
        "+--band 0.4 0.6", "+--every 4", "+--concurrency 64", "---data-parallel"]),
}


def test_every_shipped_recipe_has_expectations():
    assert sorted(path.stem for path in RECIPES) == sorted(EXPECTED)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_dry_runs_to_its_stages_and_settings(path):
    result = runner.invoke(app, ["run", str(path), "--dry-run", "--rounds", "1"])
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    stages, words = EXPECTED[path.stem]
    # the stages of the loop (server mode's resident trainer is not one)
    assert list(dict.fromkeys(line.split()[1] for line in lines
                              if line.startswith("spade ")
                              and not line.startswith("spade trainer "))) == stages
    text = "\n".join(lines).replace("'", "")
    for word in words:
        assert (word[1:] in text) == (word[0] == "+"), word


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_every_number_in_a_paper_recipe_cites_its_source(path):
    """A number is from the paper, from the reference code (file:line), or marked as ours."""
    tomllib.loads(path.read_text())
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("#") or "=" not in line:
            continue
        value, _, comment = line.partition("=")[2].partition("#")
        if re.fullmatch(r"\s*\[?[-+0-9., e]+\]?\s*", value):
            assert re.search(r"\bref\b.*:\d|\bpaper\b|\bours\b", comment), \
                f"{path.name}:{number}: {line.strip()}"


# the reference's engines on its 8 GPUs: 8 of 1 GPU (4B, 8B), one of 8 with its experts spread
# (30B-A3B); here one vLLM server laid out the same way
LAYOUTS = {"4b": ["--data-parallel", "8"], "8b": ["--data-parallel", "8"],
           "30b": ["--tensor-parallel", "8", "--expert-parallel"]}
GENERATING = ("design", "audit", "hint", "rollout", "eval")


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_a_paper_recipe_generates_with_one_engine_over_all_8_gpus(path):
    """One `spade serve` for the whole run, over the node's 8 GPUs, asleep while train-grpo
    trains on 8 ranks; no generating stage loads an engine of its own."""
    from spade_cli import recipe as recipes

    result = runner.invoke(app, ["run", str(path), "--dry-run", "--rounds", "2"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    serves = [line for line in lines if "spade serve" in line]
    assert len(serves) == 1 and serves[0].startswith("coproc SERVE { exec spade serve ")
    argv = shlex.split(serves[0].split("exec ", 1)[1].split(" 2>>", 1)[0])
    layout = LAYOUTS[path.stem.split("-")[1]]
    flags = [arg for arg in argv if "parallel" in arg]
    assert flags == [arg for arg in layout if arg.startswith("--")]
    assert " ".join(layout) in " ".join(argv) and "--sleep-mode" in argv
    assert recipes.load(str(path)).serve.gpus == 8
    stages = [shlex.split(line)[1:] for line in lines
              if line.startswith("spade ")]
    generating = [argv for argv in stages if argv[0] in GENERATING]
    assert {argv[0] for argv in generating} >= {"rollout", "eval"}
    for argv in generating:  # the server, never an in-process engine on a model path
        options = dict(zip(argv, argv[1:]))
        assert options["--backend"] == "openai" and options["--model"] == "spade-policy"
        assert options["--base-url"] == "$BASE_URL" and "vllm" not in argv
    trains = [i for i, line in enumerate(lines) if line.startswith("spade train-grpo")]
    assert len(trains) == 2
    for i in trains:
        assert lines[i - 2].endswith('"$SERVER/sleep?level=2"')  # the GPUs are the trainer's
        assert "--nproc 8" in lines[i] and "--lora-rank" not in lines[i]
        assert ("--offload auto" in lines[i]) == ("30b" in path.stem)


def test_the_context_length_reaches_each_backend_as_its_own_option(tmp_path):
    from spade_cli.options import backend_spec

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert backend_spec("vllm", str(model), None, None, None, 32768).options == {
        "max_model_len": 32768}
    assert backend_spec("hf", str(model), None, None, None, 32768).options == {
        "context_length": 32768}
    assert backend_spec("hf", str(model), None, None, None).options == {}


@pytest.mark.parametrize("path", [p for p in PAPER if "games" in p.stem and "fixed" not in p.stem],
                         ids=lambda p: p.stem)
def test_a_games_recipe_gives_the_designer_the_references_scale(path):
    """The reference plays ceil(192 / 24) = 8 no-hint plays per game, so its designer scale is
    8 x 24 / 24 x k = 32 (ref spade/core/utils/rewards.py compute_env_reward_scale)."""
    from stages import rewards

    recipe = tomllib.loads(path.read_text())
    stages = {(s["command"], s.get("hint")): s for s in recipe["stage"]}
    design, plays = stages[("design", None)], stages[("rollout", False)]["plays"]
    scale = rewards.designer_scale(plays * design["batch"], design["batch"], design["every"],
                                   rewards.RewardConfig())
    assert plays * design["batch"] == 192 and scale == 32.0
