"""A separate designer in a recipe (`[designer]`): the table is checked when the recipe is read;
design, hint and audit ask it (its flags on their command lines, its key only in their
environment, never on a command line, in --dry-run or in run.log); rollout, train-grpo and eval
keep the run's model; the designer is frozen, so train-grpo reads no design shards and trains the
agent role alone."""

import http.server
import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_cli import recipe as recipes
from spade_cli.app import app
from stages import seed_library
from tests.spade_cli.test_run import PAPER_RECIPE, Stages, fake_model, make_workspace

runner = CliRunner()
HEAD = 'schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n'
KEY = "sk-designer-7f3a9c"  # a stand-in key: it must show up nowhere but the stages' environment
URL = "http://10.0.0.5:8000/v1"
REMOTE = (f'[designer]\nbackend = "openai"\nbase-url = "{URL}"\nmodel = "big-designer"\n'
          f'api-key-env = "DESIGNER_KEY"\n')
DESIGNER_FLAGS = f"--backend openai --base-url {URL} --model big-designer --policy"


@pytest.mark.parametrize("table,message", [
    ('designer = "openai"\n', 'r.toml: designer: expected a table, got "openai"'),
    ('[designer]\nbackend = "openai"\nbase-url = "http://h/v1"\nmodel = "m"\nkey = "sk"\n',
     "r.toml: designer: 'key' is not a designer setting (backend, base-url, model, api-key-env)"),
    ('[designer]\nbackend = "sglang"\nmodel = "m"\n',
     'r.toml: designer: backend: expected one of openai, vllm, hf, got "sglang"'),
    ('[designer]\nbackend = "openai"\nbase-url = "10.0.0.5:8000"\nmodel = "m"\n',
     'r.toml: designer: base-url: expected an http:// or https:// URL, got "10.0.0.5:8000"'),
    ('[designer]\nbackend = "hf"\nmodel = 7\n',
     "r.toml: designer: model: expected the server's model name (openai) or a model directory "
     "(hf, vllm), got 7"),
    ('[designer]\nbackend = "openai"\nbase-url = "http://h/v1"\nmodel = "m"\n'
     'api-key-env = "sk-abc; rm -rf /"\n',
     'r.toml: designer: api-key-env: expected the name of an environment variable, got '
     '"sk-abc; rm -rf /"'),
    ('[designer]\nmodel = "m"\n', "r.toml: designer: backend: missing (one of openai, vllm, hf)"),
    ('[designer]\nbackend = "openai"\nbase-url = "http://h/v1"\n',
     "r.toml: designer: model: missing"),
    ('[designer]\nbackend = "openai"\nmodel = "m"\n',
     "r.toml: designer: base-url: required with backend openai"),
    ('[designer]\nbackend = "vllm"\nmodel = "m"\nbase-url = "http://h/v1"\n',
     "r.toml: designer: base-url: for backend openai only, not vllm"),
    ('[designer]\nbackend = "hf"\nmodel = "m"\napi-key-env = "KEY"\n',
     "r.toml: designer: api-key-env: for backend openai only, not hf"),
    ('[designer]\nbackend = "hf"\nmodel = "m"\n[[stage]]\ncommand = "design"\nbackend = "vllm"\n',
     "r.toml: stage design: 'backend' is set by the runner with a separate designer "
     "([designer])"),
    ('[designer]\nbackend = "hf"\nmodel = "m"\n[[stage]]\ncommand = "hint"\napi-key = "sk"\n',
     "r.toml: stage hint: 'api-key' is set by the runner with a separate designer"),
    ('[designer]\nbackend = "hf"\nmodel = "m"\n[[stage]]\ncommand = "train-grpo"\n'
     'roles = "agent,designer"\n',
     "r.toml: stage train-grpo: 'roles' is set by the runner with a separate designer"),
])
def test_a_bad_designer_table_stops_the_run_when_the_recipe_is_read(tmp_path, table, message):
    path = tmp_path / "r.toml"
    path.write_text(HEAD + table)
    result = runner.invoke(app, ["run", str(path), "--dry-run"])
    assert result.exit_code == 65 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_a_designer_table_is_read_with_dashes_or_underscores(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(HEAD + '[designer]\nbackend = "openai"\nbase_url = "https://api.x/v1"\n'
                           'model = "m"\napi_key_env = "X_KEY"\n')
    assert recipes.load(str(path)).designer == recipes.Designer("openai", "m", "https://api.x/v1",
                                                                "X_KEY")
    path.write_text(HEAD + '[designer]\nbackend = "hf"\nmodel = "~/models/d"\n')
    designer = recipes.load(str(path)).designer
    assert designer.backend == "hf" and designer.model == str(Path.home() / "models" / "d")
    path.write_text(HEAD)
    assert recipes.load(str(path)).designer is None


def dry_run(tmp_path, monkeypatch, table: str = REMOTE, rounds: str = "3") -> str:
    """The --dry-run script of the tiny recipe (with an audit stage) and `table`."""
    workspace = make_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    recipe = workspace / "tiny.toml"
    recipe.write_text(recipe.read_text().replace(
        '[[stage]]\ncommand = "hint"', '[[stage]]\ncommand = "audit"\n\n[[stage]]\n'
                                       'command = "hint"') + "\n" + table)
    monkeypatch.setenv("DESIGNER_KEY", KEY)
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run", "--rounds", rounds])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def commands(script: str) -> list[tuple[str, str]]:
    """(command, line) of each spade stage command the script runs, env prefix included."""
    found = []
    for line in script.splitlines():
        words = line.split()
        if "spade" in words[:2] and not line.startswith("#"):
            found.append((words[words.index("spade") + 1], line))
    return found


def test_design_hint_and_audit_ask_the_designer_and_the_other_stages_the_runs_model(
        tmp_path, monkeypatch):
    lines = commands(dry_run(tmp_path, monkeypatch))
    asked = {command for command, line in lines if DESIGNER_FLAGS in line}
    assert asked == {"design", "hint", "audit"}
    for command, line in lines:
        if command in ("design", "hint", "audit"):
            assert f"--policy '{URL}#big-designer'" in line and '"$MODEL"' not in line
            assert line.startswith('OPENAI_API_KEY="$DESIGNER_KEY" spade ')
        else:
            assert "big-designer" not in line and "OPENAI_API_KEY" not in line
        if command in ("rollout", "train-grpo"):
            assert '--model "$MODEL"' in line


def test_the_key_is_never_in_the_dry_run_and_the_script_says_the_designer_is_frozen(
        tmp_path, monkeypatch):
    script = dry_run(tmp_path, monkeypatch)
    assert KEY not in script
    assert (f"# designer: big-designer (frozen, openai at {URL}) designs, hints and audits: a "
            f"separate model, never trained") in script
    assert "# its API key: $DESIGNER_KEY, given to those commands as OPENAI_API_KEY" in script


def test_a_frozen_designer_gives_train_grpo_no_design_shards_and_the_agent_role_alone(
        tmp_path, monkeypatch):
    """Without [designer] round 2 trains round 0's designs (k = 2); with it no round does."""
    trains = [line for command, line in commands(dry_run(tmp_path, monkeypatch)) if
              command == "train-grpo"]
    assert len(trains) == 3
    for line in trains:
        assert "design-a" not in line and "score-regret" not in line
        assert line.split("--roles ")[1].split()[0] == "agent"
    own = [line for command, line in commands(dry_run(tmp_path / "own", monkeypatch, ""))
           if command == "train-grpo"]
    assert "runs/tiny/r00/design-a0" in own[2] and "--roles" not in own[2]


def test_a_local_designer_is_its_own_model_and_gets_no_key(tmp_path, monkeypatch):
    lines = commands(dry_run(tmp_path, monkeypatch,
                             '[designer]\nbackend = "vllm"\nmodel = "/models/Qwen3-8B"\n'))
    design = next(line for command, line in lines if command == "design")
    assert design.startswith("spade design ")
    assert "--backend vllm --model /models/Qwen3-8B --policy /models/Qwen3-8B" in design
    assert "--base-url" not in design


class Seen(Stages):
    """Stages that also note the key each one saw in its environment, and write a shard of
    what it makes so that the loop goes on to every stage."""

    MAKES = {"design": "design", "validate": "env", "audit": "env", "hint": "env",
             "rollout": "rollout", "score-regret": "regret", "train-grpo": "train"}

    def __init__(self):
        super().__init__()
        self.keys: dict[str, set] = {}

    def main(self, args, prog_name, standalone_mode):
        super().main(args, prog_name, standalone_mode)
        self.keys.setdefault(args[0], set()).add(os.environ.get("OPENAI_API_KEY"))
        if args[0] in self.MAKES:
            out = Path(args[args.index("-o") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{self.MAKES[args[0]]}-00000.jsonl").write_text("{}\n")


def test_the_key_reaches_design_hint_and_audit_through_their_environment_only(tmp_path,
                                                                               monkeypatch):
    from spade_cli import commands as command_group

    workspace = make_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    fake_model(workspace / "model")
    recipe = workspace / "tiny.toml"
    recipe.write_text(recipe.read_text().replace('init = "tiny"', 'init = "model"').replace(
        '[[stage]]\ncommand = "hint"', '[[stage]]\ncommand = "audit"\n\n[[stage]]\n'
                                       'command = "hint"') + "\n" + REMOTE)
    monkeypatch.setenv("DESIGNER_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "the-callers-own")
    stages = Seen()
    monkeypatch.setattr(command_group, "group", lambda: stages)
    result = runner.invoke(app, ["run", "tiny.toml"])
    assert result.exit_code == 0, result.stderr
    assert stages.keys["design"] == stages.keys["audit"] == stages.keys["hint"] == {KEY}
    for command in ("validate", "rollout", "score-regret", "train-grpo"):
        assert stages.keys[command] == {"the-callers-own"}, command
    assert os.environ["OPENAI_API_KEY"] == "the-callers-own"  # put back after each stage
    log = (workspace / "runs" / "tiny" / "run.log").read_text()
    assert KEY not in log and KEY not in result.stderr and KEY not in result.stdout
    assert f"designer big-designer (frozen, openai at {URL}) designs" in log
    assert "$ spade design " in log and DESIGNER_FLAGS in log
    assert KEY not in (workspace / "runs" / "tiny" / "recipe.json").read_text()


def test_a_missing_key_variable_stops_the_run_at_its_start_but_not_the_dry_run(tmp_path,
                                                                              monkeypatch):
    workspace = make_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    recipe = workspace / "tiny.toml"
    recipe.write_text(recipe.read_text() + "\n" + REMOTE)
    monkeypatch.delenv("DESIGNER_KEY", raising=False)
    assert runner.invoke(app, ["run", "tiny.toml", "--dry-run"]).exit_code == 0
    result = runner.invoke(app, ["run", "tiny.toml"])
    assert result.exit_code == 69 and result.stderr.count("\n") == 1
    assert "tiny.toml: designer: api-key-env: $DESIGNER_KEY is not set" in result.stderr
    assert not (workspace / "runs").exists()  # nothing ran


class Chat(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible stand-in: `answer(body)` writes each chat's reply."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        reply = json.dumps({"choices": [{"message": {"content": self.answer(body)},
                                         "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def serve(handler: type[Chat]) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A stand-in chat server on a free loopback port, and its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class Server(Chat):
    """Answers every chat with no code, noting who asked."""

    asked: list[tuple[str, str]] = []

    def answer(self, body):
        self.asked.append((self.headers.get("Authorization"), body.get("model")))
        return "no code today"


def test_a_design_stage_sends_the_key_to_the_designers_server_and_names_it_in_records(
        tmp_path, monkeypatch):
    server, url = serve(Server)
    monkeypatch.chdir(tmp_path)
    fake_model(tmp_path / "model")
    (tmp_path / "r.toml").write_text(
        HEAD + 'memory = false\n[model]\ninit = "model"\n'
        f'[designer]\nbackend = "openai"\nbase-url = "{url}"\nmodel = "big-designer"\n'
        'api-key-env = "DESIGNER_KEY"\n'
        '[[stage]]\ncommand = "design"\nbatch = 2\nno-corpus = true\nmax-tokens = 64\n'
        '[[stage]]\ncommand = "validate"\n')
    monkeypatch.setenv("DESIGNER_KEY", KEY)
    Server.asked = []
    try:
        result = runner.invoke(app, ["run", "r.toml"])
    finally:
        server.shutdown()
    assert result.exit_code == 0, result.stderr
    assert Server.asked == [(f"Bearer {KEY}", "big-designer")] * 2
    designs = [json.loads(line) for shard in (tmp_path / "r" / "r00" / "design-a0").glob(
        "design-*.jsonl") for line in shard.read_text().splitlines()]
    assert [d["policy"] for d in designs] == [f"{url}#big-designer"] * 2
    assert KEY not in (tmp_path / "r" / "run.log").read_text()
    manifest = (tmp_path / "r" / "r00" / "design-a0" / "_manifest.json").read_text()
    assert KEY not in manifest


def test_the_plan_leaves_a_remote_designers_memory_out(monkeypatch, tmp_path):
    """At 24 GiB a GPU the paper recipe's own design engine does not fit; its remote designer
    is not on the box, so the first stage short of memory is a later one."""
    monkeypatch.chdir(PAPER_RECIPE.parents[1])
    recipe = tmp_path / "remote.toml"
    recipe.write_text(PAPER_RECIPE.read_text() + "\n" + REMOTE)
    result = runner.invoke(app, ["run", str(recipe), "--plan", "--gpus", "8",
                                 "--gpu-memory", "24"])
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith("│")}
    for stage in ("design", "audit", "hint"):
        assert "designer big-designer on its server: not counted" in rows[stage]
    assert result.exit_code == 65 and "stage design" not in result.stderr


GAME = seed_library.files("game")[0].read_text()


class Repairing(Chat):
    """A stand-in designer that imports socket until told why that fails, then answers fixed."""

    asked: list[list[dict]] = []

    def answer(self, body):
        self.asked.append(body["messages"])
        told = "Failed check" in body["messages"][-1]["content"]
        return f"```python\n{GAME if told else 'import socket' + chr(10) + GAME}```"


def test_a_recipe_with_repair_fills_with_repairs_the_slots_a_separate_designer_got_wrong(
        tmp_path, monkeypatch, nsjail_ok):
    """0 of 2 accepted at turn 1, 2 of 2 after one repair; every repair request carries the
    validator's reason in the designer's own conversation."""
    server, url = serve(Repairing)
    monkeypatch.chdir(tmp_path)
    fake_model(tmp_path / "model")
    (tmp_path / "r.toml").write_text(
        HEAD + 'memory = false\n[model]\ninit = "model"\n'
        f'[designer]\nbackend = "openai"\nbase-url = "{url}"\nmodel = "coder"\n'
        '[[stage]]\ncommand = "design"\nbatch = 2\nno-corpus = true\nattempts = 3\n'
        'repair = true\n[[stage]]\ncommand = "validate"\n')
    Repairing.asked = []
    try:
        result = runner.invoke(app, ["run", "r.toml"])
    finally:
        server.shutdown()
    assert result.exit_code == 0, result.stderr
    round_dir = tmp_path / "r" / "r00"
    verdicts = {a: sorted(p.name.split("-")[0] for p in (round_dir / f"validate-a{a}")
                          .glob("*.jsonl")) for a in (0, 1)}
    assert verdicts == {0: ["validation"], 1: ["env"]}
    assert not (round_dir / "design-a2").exists()  # every slot filled: no third attempt
    repairs = Repairing.asked[2:]
    assert len(repairs) == 2 and all(len(m) == 3 and "structure" in m[-1]["content"]
                                     and "socket" in m[-1]["content"] for m in repairs)
    assert "accepted by designer turn: 2 2/2" in (tmp_path / "r" / "run.log").read_text()
