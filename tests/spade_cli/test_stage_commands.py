"""The model-facing commands chained from the shell: exit codes, record kinds, lineage."""

import orjson
import pytest
from typer.testing import CliRunner

from spade_cli import progress
from spade_cli.app import app
from stages import seed_library

pytest.importorskip("torch")
runner = CliRunner()


def invoke(*args, input=None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    return result


def lines(text):
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def chain(tmp_path_factory, nsjail_ok):
    """model tiny -> design -> validate -> hint -> rollout x2 -> score-regret -> train-grpo."""
    root = tmp_path_factory.mktemp("chain")
    model = root / "tiny"
    games = [line for line in seed_library.ENV_SHARD.read_text().splitlines()
             if '"domain":"game"' in line][:2]
    (root / "pool.jsonl").write_text("\n".join(games) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(progress, "INTERVAL", 0)  # a progress line at every update
        steps = run_chain(root, model)
    return root, steps


def run_chain(root, model):
    return {
        "model": invoke("model", "tiny", model),
        "design": invoke("design", "--model", model, "-b", 2, "--max-tokens", 8,
                         "--corpus-words", 30, "-o", root / "designs"),
        "validate": invoke("validate", root / "designs", "-o", root / "checked",
                           "--allow-all-rejected"),
        "hint": invoke("hint", root / "pool.jsonl", "--model", model, "--max-tokens", 8,
                       "-o", root / "envs"),
        "rollout-hint": invoke("rollout", root / "envs", "--hint", "-n", 2, "--max-turns", 2,
                               "--max-tokens", 8, "--model", model, "-o", root / "plays-hint"),
        "rollout": invoke("rollout", root / "envs", "--no-hint", "-n", 2, "--max-turns", 2,
                          "--max-tokens", 8, "--model", model, "--policy", "served/step-7",
                          "-o", root / "plays"),
        "score": invoke("score-regret", root / "envs", root / "checked", root / "plays-hint",
                        root / "plays", "--reject-penalty", 0, "-o", root / "regrets.jsonl"),
        "train": invoke("train-grpo", root / "plays", root / "regrets.jsonl", root / "designs",
                        "--model", model, "--ckpt-dir", root / "ckpt", "--lr", 1e-3,
                        "-o", root / "train.jsonl"),
    }


def test_every_command_of_the_chain_succeeds(chain):
    root, steps = chain
    for name, result in steps.items():
        assert result.exit_code == 0, f"{name}: {result.stderr}"
    assert (root / "tiny" / "config.json").exists()
    assert "train-grpo:" in steps["train"].stderr and "-> " in steps["train"].stderr


@pytest.mark.parametrize("step,line", [
    ("design", "design: 2/2 designs, "), ("validate", "validate: 2/2 designs, "),
    ("hint", "hint: 2/2 envs, "), ("rollout", "rollout: 4/4 plays, "),
    ("train", "train-grpo: 1/1 steps, "),
])
def test_long_stages_report_progress_with_rate_and_tokens(chain, step, line):
    _, steps = chain
    shown = [text for text in steps[step].stderr.splitlines() if text.startswith(line)]
    assert shown, steps[step].stderr
    assert step == "validate" or " tok/s" in shown[-1]


def test_design_records_carry_tokens_and_feed_validate(chain):
    root, _ = chain
    designs = lines((root / "designs" / "design-00000.jsonl").read_text())
    assert [d["slot"] for d in designs] == [0, 1]
    assert all(d["completion_ids"] and d["logprobs"] and d["corpus_doc"] for d in designs)
    checked = lines((root / "checked" / "validation-00000.jsonl").read_text())
    assert [c["parents"] for c in checked] == [[d["id"]] for d in designs]


def test_hint_keeps_env_ids_and_rollouts_point_to_them(chain):
    root, _ = chain
    envs = lines((root / "envs" / "env-00000.jsonl").read_text())
    pool = lines((root / "pool.jsonl").read_text())
    assert [e["id"] for e in envs] == [p["id"] for p in pool]
    plays = lines((root / "plays-hint" / "rollout-00000.jsonl").read_text())
    assert len(plays) == 4 and all(p["hint"] for p in plays)
    assert {p["env_id"] for p in plays} == {e["id"] for e in envs}
    assert all(len(p["turns"]) <= 2 for p in plays)


def test_records_name_their_policy_the_model_unless_told(chain):
    root, _ = chain
    hinted = lines((root / "plays-hint" / "rollout-00000.jsonl").read_text())
    assert {p["policy"] for p in hinted} == {str(root / "tiny")}
    named = lines((root / "plays" / "rollout-00000.jsonl").read_text())
    assert {p["policy"] for p in named} == {"served/step-7"}  # what a server-mode run passes


def test_score_and_train_outputs(chain):
    root, _ = chain
    regrets = lines((root / "regrets.jsonl").read_text())
    assert {r["kind"] for r in regrets} == {"regret"}
    assert sum(1 for r in regrets if r["rejected_by"]) == 2  # the two rejected designs
    train = lines((root / "train.jsonl").read_text())
    assert train and train[0]["kind"] == "train" and train[0]["stats"]["designer_adv_n"] == 2
    assert (root / "ckpt" / "step-000001" / "trainer_state.json").exists()


def test_design_retry_redesigns_rejected_slots(chain, tmp_path):
    root, _ = chain
    result = invoke("design", "--model", root / "tiny", "-b", 2, "--max-tokens", 8,
                    "--corpus-words", 30, "--retry", root / "checked", "--max-attempts", 2)
    assert result.exit_code == 0, result.stderr
    assert [(d["slot"], d["attempt"]) for d in lines(result.stdout)] == [(0, 1), (1, 1)]
    done = invoke("design", "--model", root / "tiny", "--retry", root / "checked",
                  "--max-attempts", 1)
    assert done.exit_code == 0 and done.stdout == "" and "0 designs for 0 slots" in done.stderr


def test_design_repair_goes_on_with_each_rejected_designs_conversation(chain):
    root, _ = chain
    result = invoke("design", "--model", root / "tiny", "-b", 2, "--max-tokens", 8,
                    "--retry", root / "checked", "--retry", root / "designs", "--repair",
                    "--max-attempts", 2)
    assert result.exit_code == 0, result.stderr
    first = {d["id"]: d for d in lines((root / "designs").joinpath(
        next(p.name for p in (root / "designs").glob("design-*.jsonl"))).read_text())}
    repairs = lines(result.stdout)
    assert [(d["slot"], d["attempt"], d["turn"]) for d in repairs] == [(0, 1, 2), (1, 1, 2)]
    for repair in repairs:
        parent = first[repair["repairs"]]
        assert repair["first_turn"] == parent["id"]
        assert repair["prompt"][1] == {"role": "assistant", "content": parent["completion"]}
        assert "Failed check" in repair["prompt"][-1]["content"]
    assert "; repairs at turn 2, " in result.stderr  # the summary line says what was asked


@pytest.mark.parametrize("args,message", [
    (["--repair"], "--repair goes with --retry"),
    (["--retry", "checked", "--repair"], "is not in the --retry inputs: pass its design shard"),
])
def test_design_repair_without_the_designs_is_a_usage_error(chain, args, message):
    root, _ = chain
    result = invoke("design", "--model", root / "tiny", "--max-attempts", 2,
                    *[root / a if a == "checked" else a for a in args])
    assert result.exit_code == 2 and message in result.stderr and result.stdout == ""


@pytest.mark.parametrize("args,code,message", [
    (["design"], 2, "Missing option '--model'"),
    (["design", "--model", "x", "--backend", "tpu"], 2, "--backend must be hf, vllm or openai"),
    (["design", "--model", "x", "--domain", "chess"], 2, "--domain must be game or tool_use"),
    (["rollout", "--model", "m", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"],
     69, "cannot reach the server"),
    (["train-grpo", "-"], 2, "Missing option '--model'"),
])
def test_usage_and_unavailable_errors(args, code, message):
    pool = seed_library.ENV_SHARD.read_text().splitlines()[0] + "\n"
    result = invoke(*args, input=pool)
    assert result.exit_code == code, result.stderr
    assert message in result.stderr


def test_missing_local_model_dir_exits_66_without_reaching_a_hub(tmp_path):
    pool = seed_library.ENV_SHARD.read_text().splitlines()[0] + "\n"
    result = invoke("hint", "--model", tmp_path / "no-model", input=pool)
    assert result.exit_code == 66 and "no such model directory" in result.stderr


@pytest.mark.parametrize("env,reason", [
    ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "127.0.0.1:9 cannot be reached"),
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
])
def test_uncached_hub_id_without_network_exits_69_in_one_line(tmp_path, monkeypatch, env, reason):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = invoke("design", "-m", "Qwen/Qwen3-4B")
    assert result.exit_code == 69, result.stderr
    assert result.stderr.count("\n") == 1 and reason in result.stderr
    assert "pass a model directory" in result.stderr


def test_a_cached_hub_id_loads_from_the_cache_without_the_hub(tmp_path, monkeypatch):
    from spade_cli.options import backend_spec

    repo = tmp_path / "hf" / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = backend_spec("hf", "org/tiny", None, None, None)
    assert spec.model == str(snapshot) and spec.options["policy"] == "org/tiny"


# each generating command, with the arguments that make it call the model on one starter env
GENERATING = [
    ("design", ["-b", 1, "--max-tokens", 8, "--corpus-words", 30]),
    ("hint", ["{pool}"]),
    ("audit", ["{pool}"]),
    ("rollout", ["{pool}", "-n", 1, "--max-turns", 1]),
    ("eval", ["--suite", "envs", "{pool}"]),
]


def generate(command: str, args: list, tmp_path, *more):
    """Run `command` on a pool of one starter env, against whatever backend is loaded."""
    pool = tmp_path / "pool.jsonl"
    pool.write_text(seed_library.STARTER_SHARD.read_text().splitlines()[0] + "\n")
    return invoke(command, *[str(a).format(pool=pool) for a in args], *more, "--backend",
                  "openai", "--model", "m", "-o", tmp_path / "out")


@pytest.mark.parametrize("command,args", GENERATING)
def test_every_generating_stage_closes_its_backend(command, args, tmp_path, monkeypatch,
                                                   nsjail_ok):
    """An in-process engine holds its GPU until closed: the next stage of a run needs it."""
    from stages import backends
    from stages.backends.scripted import ScriptedBackend

    opened = []

    class Engine(ScriptedBackend):
        closed = False

        def close(self):
            self.closed = True

    def load(spec):
        opened.append(Engine(lambda messages, tools: "\\boxed{a}"))
        return opened[-1]

    monkeypatch.setattr(backends, "load_backend", load)
    result = generate(command, args, tmp_path)
    assert result.exit_code == 0, result.stderr
    assert len(opened) == 1 and opened[0].closed and opened[0].calls


@pytest.mark.parametrize("command,args", GENERATING)
@pytest.mark.parametrize("option,seeded", [([], True), (["--sampling-seed", "none"], False)])
def test_sampling_seed_decides_whether_every_request_hands_the_engine_a_seed(
        command, args, option, seeded, tmp_path, monkeypatch, nsjail_ok):
    from stages import backends
    from stages.backends.scripted import ScriptedBackend

    requests = []  # the Sampling of every request the engine got

    def engine(spec):
        return ScriptedBackend(lambda messages, tools: "\\boxed{a}",
                               latency=lambda sampling: requests.append(sampling) or 0.0)

    monkeypatch.setattr(backends, "load_backend", engine)
    result = generate(command, args, tmp_path, *option)
    assert result.exit_code == 0, result.stderr
    assert requests and all((sampling.engine_seed is not None) == seeded for sampling in requests)


@pytest.fixture
def scripted(monkeypatch):
    """Every model a command loads is an agent that presses `a`."""
    from stages import backends
    from stages.backends.scripted import ScriptedBackend

    monkeypatch.setattr(backends, "load_backend",
                        lambda spec: ScriptedBackend(lambda messages, tools: "\\boxed{a}"))
    return ["--backend", "openai", "--model", "m"]


def test_an_env_under_another_envs_id_is_exit_65_at_its_line(tmp_path, scripted):
    first, second = lines(seed_library.ENV_SHARD.read_text())[:2]
    forged = {**second, "id": first["id"], "source_hash": first["source_hash"]}
    pool = tmp_path / "pool.jsonl"
    pool.write_bytes(orjson.dumps(first) + b"\n" + orjson.dumps(forged) + b"\n")
    message = f"id does not match its content (expected {second['id']}, got {first['id']})"
    for args, input, where in (([pool], None, f"{pool}:2"), ([], pool.read_text(), "<stdin>:2")):
        result = invoke("rollout", *args, "-n", 1, *scripted, input=input)
        assert result.exit_code == 65, result.stderr
        assert result.stderr == f"spade rollout: error: {where}: {message}\n"
        assert result.stdout == ""


def test_a_repeated_env_is_played_once_with_a_warning(tmp_path, scripted, nsjail_ok):
    line = seed_library.STARTER_SHARD.read_text().splitlines()[0]
    env_id = orjson.loads(line)["id"]
    pool = tmp_path / "pool.jsonl"
    pool.write_text(f"{line}\n{line}\n")
    result = invoke("rollout", pool, pool, "-n", 2, "--max-turns", 1, *scripted,
                    "-o", tmp_path / "plays")
    assert result.exit_code == 0, result.stderr
    plays = lines((tmp_path / "plays" / "rollout-00000.jsonl").read_text())
    assert len(plays) == 2 and len({p["seed"] for p in plays}) == 2
    assert not (tmp_path / "plays" / "rollout-00001.jsonl").exists()
    warning = (f"spade rollout: warning: env {env_id} appears 4 times in the inputs; "
               f"using it once")
    assert warning in result.stderr.splitlines()
    manifest = orjson.loads((tmp_path / "plays" / "_manifest.json").read_bytes())
    assert manifest["stats"]["duplicates"] == 3 and manifest["stats"]["read"] == 1
    assert "1 envs -> 2 plays" in result.stderr


def test_a_rollout_with_a_winner_judges_it_beside_the_plays(tmp_path, scripted, nsjail_ok):
    """A starter game that pressing `a` sometimes wins: its winners are replayed on other seeds
    and the judgement lands in its own shard, counted on the summary line."""
    pool = tmp_path / "pool.jsonl"
    pool.write_text(seed_library.STARTER_SHARD.read_text())
    result = invoke("rollout", pool, "-n", 4, "--max-turns", 3, *scripted, "-o",
                    tmp_path / "plays")
    assert result.exit_code == 0, result.stderr
    plays = lines((tmp_path / "plays" / "rollout-00000.jsonl").read_text())
    winners = {p["env_id"] for p in plays if p["reward"] > 0}
    assert winners, "pressing `a` wins none of the starter games: the test needs a winner"
    judged = lines((tmp_path / "plays" / "judgement-00000.jsonl").read_text())
    assert {j["env_id"] for j in judged} == winners
    assert all(j["replays"] > 0 and j["verdict"] in ("fair", "shortcut") for j in judged)
    assert f"{len(winners)} envs' winners replayed on other seeds" in result.stderr


def test_score_regret_merges_a_repeated_input_once(chain):
    root, _ = chain
    once = invoke("score-regret", root / "envs", root / "plays-hint", root / "plays")
    twice = invoke("score-regret", root / "envs", root / "plays-hint", root / "plays",
                   root / "plays", root / "envs")
    assert once.exit_code == twice.exit_code == 0, twice.stderr
    assert once.stdout == twice.stdout and "warning" not in once.stderr
    assert "spade score-regret: warning: env env_" in twice.stderr
    assert "more records appear more than once in the inputs; using each once" in twice.stderr
