"""`spade run`: the whole co-training loop from a recipe, round after round, resumable."""

from __future__ import annotations

import itertools
import json
import logging
import os
import shlex
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Annotated, Iterator

import typer

log = logging.getLogger("spade.run")


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="A recipe .toml file.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the equivalent shell "
                                                             "pipeline instead of running.")] = False,
    rounds: Annotated[int | None, typer.Option(min=1, help="Override the recipe's rounds.")] = None,
    from_round: Annotated[int, typer.Option(min=0, help="Start at this round (earlier rounds "
                                                         "must be finished).")] = 0,
    plan: Annotated[bool, typer.Option("--plan", help="Print each stage's GPUs and memory per "
                                                      "GPU, and exit (65 if a stage does not "
                                                      "fit).")] = False,
    gpus: Annotated[int | None, typer.Option(
        min=1, help="--plan: GPUs in the box (default: the CUDA devices here, else 8).")] = None,
    gpu_memory: Annotated[float | None, typer.Option(
        min=1, metavar="GIB", help="--plan: memory per GPU in GiB (default: this machine's "
                                   "first CUDA device, else 80).")] = None,
    host_memory: Annotated[float | None, typer.Option(
        min=1, metavar="GIB", help="--plan: host memory of the node in GiB (default: this "
                                   "machine's, when it has the GPUs planned for; else not "
                                   "checked).")] = None,
    unsafe_no_sandbox: Annotated[bool, typer.Option(
        "--unsafe-no-sandbox", help='Let the recipe say sandbox = "none": its envs then run '
                                    'as plain processes, with no jail.')] = False,
    allow_remote: Annotated[bool, typer.Option(
        "--allow-remote", help="Let the recipe's [serve] args bind the server off loopback, "
                               "where anyone who reaches it can call worker methods and "
                               "reload weights from any path.")] = False,
) -> None:
    """Run a recipe: design, validate, hint, rollouts, score-regret, train-grpo, eval per round.

    Killing it and running it again resumes: finished rounds and finished shards are skipped.
    A round is finished only once every stage it ran left a complete manifest in its output
    folder (else exit 73, and the next run runs it again).
    A recipe is checked when it is read: an unknown option or a value of the wrong type stops
    the run at once (exit 65), naming the file, the stage and the key.

    With a `[serve]` table the run starts one vLLM server (`spade serve`) on 127.0.0.1 and every
    generating stage uses it; it sleeps while train-grpo runs and loads each new checkpoint
    without a restart; a server that dies is started again and its stage rerun (`restarts`).
    RUN/run.log has a line per engine start and per reload; RUN/serve.log has the server's
    output.

    With a `[designer]` table, design, hint and audit ask that model (an OpenAI-compatible
    server, or a local hf or vllm model) instead of the run's; it is frozen: train-grpo trains
    the agent role alone. Its API key is read from the variable `api-key-env` names (exit 69
    when it is not set) and reaches those stages as OPENAI_API_KEY in their environment, never
    on a command line or in RUN/run.log.

    Examples:

        spade run recipes/quickstart.toml
        spade run recipes/quickstart.toml --dry-run > pipeline.sh
        spade run recipes/qwen3-4b-games.toml --plan --gpus 8 --gpu-memory 80
        spade run recipes/qwen3-30b-a3b-games.toml --plan --gpus 8 --gpu-memory 80 --host-memory 1024

    `--plan` prints, per stage, the GPUs it uses and its memory per GPU (weights, grads,
    optimizer, activations at the recipe's context length and micro-batch, logits, KV cache)
    and the host memory it needs on the node, and exits 65 naming the first stage that does
    not fit. A real run makes the same check against this machine's GPUs and available host
    memory before round 0 (none without a CUDA device), and checks that a `[model] init`
    directory is a model (exit 66 when it is not).

    Paths: `run_dir` is read against the working directory; a relative `[model] path` against
    run_dir (so two runs never share a model). A run holds RUN/run.lock while it runs: a
    second `spade run` on the same run directory exits 73 at once, naming the pid holding it.

    Trust: a recipe is a file someone else may have written. `sandbox = "none"` anywhere in it
    needs --unsafe-no-sandbox here, and a [serve] bound off loopback --allow-remote (else exit
    65, naming the flag; --dry-run too). The run directory and every folder in it must be this
    user's (exit 77), and nothing the run writes follows a symlink out of it (exit 77 naming
    the link): its logs, shards, manifests, checkpoints.
    """
    from spade_cli import recipe as recipes
    from spade_cli.errors import errors_to_exit

    with errors_to_exit("run"):
        recipe = recipes.load(recipe_path, rounds)
        if plan:
            show_plan(recipe, gpus, gpu_memory, host_memory)
            return
        recipe = recipes.check_consent(recipe, allow_remote, unsafe_no_sandbox)
        if dry_run:
            print_pipeline(recipe, from_round)
        else:
            recipes.check_init(recipe)
            recipes.check_designer(recipe)
            check_devices(recipe)
            execute(recipe, from_round)


# -- the memory plan (stages/train/plan.py) ------------------------------------------------------

def recipe_plan(recipe, box) -> tuple[list, object]:
    """The plan's rows for `recipe` on `box`, and the model shape they were computed for."""
    from spade_cli import recipe as recipes
    from stages.train import plan
    from stages.records import RecordError

    path, _ = recipes.model_init_commands(recipe)
    init = recipe.model.get("init", "tiny")
    built = {"smollm2": plan.SMOLLM2, "coder": plan.CODER}  # what `spade model` will build
    try:
        if (Path(path) / "config.json").is_file() or init not in recipes.BUILTIN_MODELS:
            shape = plan.model_shape(path)
        elif init == "tiny":
            shape = plan.tiny_shape(int(recipe.model.get("hidden", 64)),
                                    int(recipe.model.get("layers", 2)))
        else:
            shape = built[init]
    except plan.PlanError as exc:
        raise RecordError(str(exc), recipe.path) from None
    stages = []
    for stage in recipe.stages:
        label = stage.command
        if stage.command == "rollout":
            label += " --hint" if stage.options.get("hint") else " --no-hint"
        stages.append((label, stage.command, stage.options))
    return plan.stage_rows(shape, stages, recipe.defaults, recipe.serve, box,
                           recipe.designer), shape


def show_plan(recipe, gpus: int | None, gpu_memory: float | None,
              host_memory: float | None) -> None:
    """`--plan`: the table on stdout; RecordError (exit 65) naming the first stage that does
    not fit."""
    from stages.train import plan
    from stages.records import RecordError

    here = local_gpus() if gpus is None or gpu_memory is None else None
    # this machine's host memory stands for the node only when its GPUs are the ones planned
    host = host_memory * plan.GiB if host_memory else (local_host_memory(total=True)
                                                        if here and not gpus else None)
    box = plan.Box(gpus or (len(here) if here else 8),
                   int((gpu_memory or (here[0][1] / plan.GiB if here else 80)) * plan.GiB),
                   int(host) if host else None)
    rows, shape = recipe_plan(recipe, box)
    print_plan(recipe, rows, shape, box)
    misfit = plan.first_misfit(rows)
    if misfit is not None:
        raise RecordError(f"stage {misfit.stage} {misfit.problem}", recipe.path)


def print_plan(recipe, rows, shape, box) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from spade_cli.terminal import terminal_safe
    from stages.train import plan

    def gib(value: int) -> str:
        return f"{value / plan.GiB:.1f}" if value else "-"

    host = f", {box.host_memory / plan.GiB:.0f} GiB of host memory" if box.host_memory else ""
    table = Table(title=f"spade run --plan: {recipe.name} on {box.gpus} "
                        f"GPU{'s' if box.gpus != 1 else ''} of "
                        f"{box.gpu_memory / plan.GiB:.1f} GiB{host}; GiB per GPU, host GiB "
                        f"per node; {shape.name} ({shape.params / 1e9:.2f}B parameters) from "
                        f"{shape.source}", title_justify="left")
    for column in ("stage", "GPUs", "weights", "grads", "optimizer", "activations", "logits",
                   "KV cache", "peak", "host", "fits", "note"):
        table.add_column(column, justify="left" if column in ("stage", "fits", "note")
                         else "right")
    for row in rows:
        m = row.memory
        cells = [row.stage, str(row.gpus)]
        if m is None:
            cells += ["-"] * 8 + ["yes"]
        else:
            cells += [gib(m.weights), gib(m.grads), gib(m.optimizer), gib(m.activations),
                      gib(m.logits), gib(m.kv_cache), gib(m.peak), f"{row.host / plan.GiB:.0f}",
                      "yes" if row.fits else "NO"]
        table.add_row(*(Text(terminal_safe(cell)) for cell in cells + [row.note]))
    # wide enough for every column when the table goes to a file or a pipe
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200).print(table)
    for row in rows:
        if row.problem:
            print(f"{row.stage}: {row.problem}")
    print(f"peak: the most a GPU holds at once (weights, grads and optimizer state stay through "
          f"a step; activations, logits and the optimizer's temporaries come and go, so the "
          f"parts add up to more). A trainer fits when its peak and {plan.RESERVE / plan.GiB:g}"
          f" GiB (CUDA context, NCCL, fragmentation) fit the GPU; an engine (vLLM takes its "
          f"share of the GPU) when one full-context sequence's KV cache fits beside its "
          f"weights. host: what the stage holds in the node's host memory at its worst "
          f"(offloaded or kept training state, the main rank's export, "
          f"{plan.RANK_HOST / plan.GiB:g} GiB a trainer rank and "
          f"{plan.ENGINE_HOST / plan.GiB:g} GiB an engine GPU for their runtimes)"
          f"{'' if box.host_memory else '; not checked: give --host-memory'}.")


def local_gpus() -> list[tuple[int, int]] | None:
    """(free, total) bytes of each CUDA device here, or None without one. Asked in a child
    process, so that the runner holds no CUDA context of its own through the run."""
    import subprocess
    import sys

    if not (Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()):
        return None
    probe = ("import json, torch\n"
             "print(json.dumps([torch.cuda.mem_get_info(i) for i in "
             "range(torch.cuda.device_count())] if torch.cuda.is_available() else None))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=300)
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 \
            else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return [tuple(device) for device in found] if found else None


def check_devices(recipe) -> None:
    """Before round 0 of a real run: the plan against this machine's CUDA devices, with the
    memory free on them now; RecordError (exit 65) when a stage does not fit. Nothing to check
    without a CUDA device, or for a model the plan knows no shape of."""
    from spade_cli import summary
    from stages.train import plan
    from stages.records import RecordError

    here = local_gpus()
    if not here:
        return
    box = plan.Box(len(here), min(free for free, _ in here), local_host_memory())
    try:
        rows, _ = recipe_plan(recipe, box)
    except RecordError as exc:
        summary.log_line(f"run {recipe.name}: warning: no memory plan: {exc.msg}", echo=True)
        return
    misfit = plan.first_misfit(rows)
    if misfit is not None:
        raise RecordError(f"stage {misfit.stage} {misfit.problem}, on this machine's "
                          f"{box.gpus} GPUs with {box.gpu_memory / plan.GiB:.1f} GiB free each "
                          f"and {box.host_memory / plan.GiB:.0f} GiB of host memory available "
                          f"(spade run --plan shows every stage)", recipe.path)


def local_host_memory(total: bool = False) -> int | None:
    """This machine's host memory in bytes: what is available now (MemAvailable), or its
    total; None where /proc/meminfo does not say."""
    import re

    try:
        info = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = re.search(rf"^{'MemTotal' if total else 'MemAvailable'}:\s+(\d+) kB", info, re.M)
    return int(found.group(1)) * 1024 if found else None


def print_pipeline(recipe, from_round: int) -> None:
    from spade_cli import recipe as recipes
    from stages import serve as engine

    run_dir = recipe.run_dir
    model, init = recipes.model_init_commands(recipe)
    print("#!/usr/bin/env bash\nset -euo pipefail")
    print(f"# recipe {one_line_comment(recipe.name)}: {recipe.rounds} rounds, env sets of "
          f"{recipe.window} rounds")
    for argv in init:
        print(recipes.shell_line(argv))
    if recipe.memory_seed and recipe.memory:
        print(recipes.shell_line(recipes.memory_seed_command(recipe)))
    print(f"MODEL={shlex.quote(model)}")
    sleep = recipe.serve is not None and sleeps(recipe.serve)
    if recipe.serve:
        print_serve(recipe, sleep)
    if recipe.designer:
        print_designer(recipe.designer)

    def call(argv, label):
        if sleep and argv[0] == "train-grpo":
            print_control(engine.sleep_calls(), "serve: the engine sleeps while train-grpo has "
                                                "the GPU")
        print(f"# {label}" + (" (runs while rejected slots remain)" if "attempt" in label
                              and not label.split()[2].startswith("1/") else ""))
        print(key_prefix(recipe, argv[0]) + shell_words(argv))

    def after_train(out, current):
        print(f'MODEL="$(ls -d {shlex.quote(run_dir)}/ckpt/step-* | sort | tail -n 1)"')
        if recipe.serve:
            print_control(engine.update_calls(WEIGHTS_PATH, sleep),
                          "serve: the engine loads the new checkpoint")
        return "$MODEL"

    server = server_args("$BASE_URL") if recipe.serve else None
    loop = recipes.Loop(recipe, call, after_train, lambda path, kind: True, server)
    for index in range(from_round, recipe.rounds):
        print(f"\n# ---- round {index} ----")
        loop.round(index, "$MODEL")


# after a failed stage, how long a dying server may take to exit and be named as the cause
STAGE_FAILED_WAIT = 2.0
WEIGHTS_PATH = "{weights_path}"  # the printed reload call reads it as "$(realpath "$MODEL")"
SHELL_VARS = ("$MODEL", "$BASE_URL")


def shell_words(argv: list[str]) -> str:
    """A spade command line whose shell variables expand (quoted as one word each): an
    argument that is exactly `$MODEL` or `$BASE_URL` is the runner's; every other argument,
    recipe values included, is quoted so that the shell reads it as it is."""
    return "spade " + " ".join(f'"{a}"' if a in SHELL_VARS else shlex.quote(a) for a in argv)


def print_designer(designer) -> None:
    """The script's comment on a separate designer: who it is, that it is frozen, and which
    variable its key comes from (the name, never the key)."""
    from spade_cli.recipe import KEY_VARIABLE

    print(f"# designer: {one_line_comment(designer)} designs, hints and audits: a separate "
          f"model, never trained (train-grpo trains the agent role alone)")
    if designer.api_key_env:
        print(f"# its API key: ${designer.api_key_env}, given to those commands as "
              f"{KEY_VARIABLE} and to no other")


def key_prefix(recipe, command: str) -> str:
    """`OPENAI_API_KEY="$NAME" ` before a command that gets the designer's key (the variable's
    name, never its value), else nothing."""
    from spade_cli.recipe import KEY_VARIABLE

    name = recipe.designer.key_name(command) if recipe.designer else None
    return f'{KEY_VARIABLE}="${name}" ' if name else ""


def one_line_comment(text: str) -> str:
    """Recipe text put in a `#` comment of the printed script: one line, so it stays one."""
    return " ".join(str(text).split())


def print_serve(recipe, sleep: bool) -> None:
    """The lines that start the run's server: `spade serve` as a coprocess, whose first line
    out is the base URL, once it answers; and the resident trainer; both stopped when the
    script exits."""
    from spade_cli import recipe as recipes

    print("# serve: one vLLM server for the whole run; generating stages reach it as "
          "spade-policy")
    argv = serve_command(recipe, "$MODEL", recipe.serve.port, sleep)
    log = f"{shlex.quote(recipe.run_dir)}/serve.log"
    # exec: $SERVE_PID is then `spade serve` itself, which stops the server when killed
    print(f"coproc SERVE {{ exec {shell_words(argv)} 2>> {log}; }}")
    if recipe.serve.request_timeout is not None:
        from stages.backends.openai import TIMEOUT_ENV

        print(f"export {TIMEOUT_ENV}={recipe.serve.request_timeout:g}")
    if recipe.stage("train-grpo"):  # as the runner, which starts them before the first one
        print("# train-grpo's ranks, kept up across rounds: each train-grpo below trains on them")
        print(f"{recipes.shell_line(trainer_command(recipe))} 2>> "
              f"{shlex.quote(recipe.run_dir)}/trainer.log &")
        print("TRAINER_PID=$!")
        print('trap "kill $SERVE_PID $TRAINER_PID 2> /dev/null || true" EXIT')
    else:
        print('trap "kill $SERVE_PID 2> /dev/null || true" EXIT')
    print('read -r BASE_URL <&"${SERVE[0]}"')
    print('SERVER="${BASE_URL%/v1}"')


def trainer_command(recipe) -> list[str]:
    """`spade trainer` over RUN/trainer with the ranks the recipe's train-grpo asks for."""
    from spade_cli import recipe as recipes

    train = recipe.stage("train-grpo")
    nproc = int(train.options.get("nproc", 1)) if train else 1
    return ["trainer", f"{recipe.run_dir}/{recipes.TRAINER_JOBS}", "--nproc", str(nproc)]


def print_control(calls: list[tuple[str, dict | None]], comment: str) -> None:
    print(f"# {comment}")
    for path, body in calls:
        line = f'curl -fsS -o /dev/null -X POST "$SERVER{path}"'
        if body is not None:
            data = shlex.quote(json.dumps(body)).replace(WEIGHTS_PATH,
                                                         "'\"$(realpath \"$MODEL\")\"'")
            line += f" -H 'Content-Type: application/json' -d {data}"
        print(line)


def serve_command(recipe, model: str, port: int, sleep: bool) -> list[str]:
    """`spade serve` with the recipe's `[serve]` settings: what the runner starts in-process.
    The server's context is the recipe's default `context-length`."""
    settings = recipe.serve
    argv = ["serve", "-m", model, "--port", str(port),
            "--sleep-mode" if sleep else "--no-sleep-mode",
            "--start-timeout", f"{settings.start_timeout:g}"]
    if recipe.allow_remote:
        argv.append("--allow-remote")
    if settings.python:
        argv += ["--python", settings.python]
    argv += settings.layout.args(("--data-parallel", "--tensor-parallel", "--expert-parallel"))
    if recipe.defaults.get("context-length"):
        argv += ["--context-length", str(recipe.defaults["context-length"])]
    return argv + (["--", *settings.args] if settings.args else [])


def server_args(base_url: str) -> list[str]:
    """What a generating stage is given, in server mode, in place of `--model PATH`."""
    from stages.serve import SERVED_NAME

    return ["--backend", "openai", "--base-url", base_url, "--model", SERVED_NAME]


def sleeps(settings) -> bool:
    """Whether the server sleeps through train steps: the recipe's `sleep`, else whether a
    CUDA device is here (a trainer then shares it; vLLM's CPU build has no sleep mode)."""
    from stages.serve import sleep_supported

    return settings.sleep if settings.sleep is not None else sleep_supported()


class Engine:
    """The run's server in server mode: started before the first round that runs, with that
    round's model; asleep while train-grpo has the GPU; given each new checkpoint after it;
    stopped at the end. Each start, sleep and reload is a run-log line."""

    def __init__(self, recipe, run_dir: Path):
        from stages import serve

        self.recipe, self.settings = recipe, recipe.serve
        self.sleep = sleeps(self.settings)
        self.port = self.settings.port or serve.free_port()
        self.log = run_dir / "serve.log"
        self.server = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, model: str) -> None:
        from spade_cli import summary
        from spade_cli.options import check_model
        from stages import serve

        path = check_model(model)
        if serve.stale_head_on_reload(path):
            summary.log_line(f"serve: warning: {model} ties its output head to the embeddings, "
                             f"and vLLM's CPU build keeps a tied head's old weights when it "
                             f"reloads a checkpoint: untie them, or serve on a GPU", echo=True)
        started = time.monotonic()
        self.server = serve.start(path, self.settings.python, "127.0.0.1", self.port,
                                  self.recipe.defaults.get("context-length"), self.sleep,
                                  self.settings.args, self.log, self.settings.start_timeout,
                                  layout=self.settings.layout,
                                  allow_remote=self.recipe.allow_remote)
        summary.log_line(f"serve: engine started with {model} at {self.base_url} on "
                         f"{serve.placement(self.settings.layout)} "
                         f"in {time.monotonic() - started:.1f}s (log {self.log})", echo=True)

    def before(self, argv: list[str]) -> None:
        """Before each stage: the server is still there; train-grpo gets the GPU."""
        from spade_cli import summary

        self.check()
        if self.sleep and argv[0] == "train-grpo":
            started = time.monotonic()
            self.server.sleep()
            summary.log_line(f"serve: engine asleep for train-grpo in "
                             f"{time.monotonic() - started:.1f}s")

    def after(self, argv: list[str]) -> None:
        """After a stage: an eval of the served checkpoint keeps it from `--keep-last` pruning,
        as `spade eval --model CKPT` does itself (here its --model is the served name)."""
        from spade_cli.eval import keep_evaluated

        if argv[0] == "eval" and self.server is not None:
            options = dict(zip(argv, argv[1:]))
            keep_evaluated(self.server.model, options.get("-o", "-"),
                           options.get("--suite", "eval"))

    def load(self, checkpoint: str) -> None:
        """The new checkpoint into the engine; a server that died meanwhile (as train-grpo ran)
        is started again with it, if `restarts` allows one."""
        from spade_cli import summary

        if self.dead() and self.settings.restarts:
            return self.restart(checkpoint, "it exited while train-grpo ran")
        started, woken = time.monotonic(), self.server.asleep
        self.server.update(checkpoint)
        summary.log_line(f"serve: engine reloaded {checkpoint}{' and woke' if woken else ''} "
                         f"in {time.monotonic() - started:.1f}s", echo=True)

    def check(self, wait: float = 0.0) -> None:
        """BackendUnavailable (exit 69) if the server has died (or does within `wait` s)."""
        if self.server is not None:
            self.server.check(wait)

    def dead(self) -> bool:
        return self.server is not None and self.server.process.poll() is not None

    def restart(self, model: str, why: str) -> None:
        """A new server in the dead one's place (same port, so the stages' URL holds)."""
        from spade_cli import summary

        summary.log_line(f"serve: engine died (exit {self.server.process.returncode}): {why}; "
                         f"starting it again", echo=True)
        self.server.stop()  # whatever is left of its process group
        self.server = None
        self.start(model)

    def __enter__(self) -> "Engine":
        from stages.backends.openai import TIMEOUT_ENV

        self.timeout_before = os.environ.get(TIMEOUT_ENV)
        if self.settings.request_timeout is not None:  # the stages run in this process
            os.environ[TIMEOUT_ENV] = f"{self.settings.request_timeout:g}"
        return self

    def __exit__(self, *exc) -> None:
        from stages.backends.openai import TIMEOUT_ENV

        self.stop()
        if self.timeout_before is None:
            os.environ.pop(TIMEOUT_ENV, None)
        else:
            os.environ[TIMEOUT_ENV] = self.timeout_before

    def stop(self) -> None:
        """The run ended or failed: stop the server if one was started."""
        from spade_cli import summary

        if self.server is not None:
            self.server.stop()
            summary.log_line(f"serve: engine stopped (it held {self.server.model})")
            self.server = None


class Trainer:
    """Server mode's resident trainer (`spade trainer` over RUN/trainer): started before the
    first train-grpo, started again if it died since, stopped at the end. Each start is a
    run-log line; its ranks' output goes to RUN/trainer.log."""

    def __init__(self, recipe, run_dir: Path):
        from spade_cli import recipe as recipes

        self.nproc = int(trainer_command(recipe)[-1])
        self.jobs = run_dir / recipes.TRAINER_JOBS
        self.log = run_dir / "trainer.log"
        self.ranks = None

    def before(self, argv: list[str]) -> None:
        from spade_cli import summary
        from stages import trust
        from stages.train import ranks as train_ranks

        if argv[0] != "train-grpo" or (self.ranks and self.ranks.poll() is None):
            return
        if self.ranks:
            summary.log_line(f"trainer: its ranks exited (code {self.ranks.returncode}); "
                             f"starting them again", echo=True)
        started = time.monotonic()
        with trust.open_append(self.log, "ab") as log:
            self.ranks = train_ranks.start(self.nproc, self.jobs, log)
        train_ranks.ready(self.jobs, wait=train_ranks.START_TIMEOUT)
        summary.log_line(f"trainer: {self.nproc} rank{'s' if self.nproc > 1 else ''} up in "
                         f"{time.monotonic() - started:.1f}s (log {self.log})", echo=True)

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        from stages.train import ranks as train_ranks

        if self.ranks is not None:
            train_ranks.stop(self.ranks, self.jobs)
            self.ranks = None


def execute(recipe, from_round: int) -> None:
    """Run the recipe in its run directory: one that is this user's, every folder in it too
    (Untrusted, exit 77, else), with every write confined to it (stages/trust.py)."""
    from stages import trust

    run_dir = Path(recipe.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    trust.check_tree_owned(run_dir)
    with trust.confine(run_dir), lock_run_dir(run_dir):
        run_locked(recipe, from_round, run_dir)


LOCK_FILE = "run.lock"


@contextmanager
def lock_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold RUN/run.lock (an exclusive flock) for the whole run: a second `spade run` on the
    same directory raises Busy (exit 73) naming the pid that holds it, before it writes
    anything. The lock goes with the process (no stale lock after a kill); the file keeps the
    last holder's pid."""
    import fcntl
    import os

    from spade_cli.errors import Busy
    from stages import trust

    path = run_dir / LOCK_FILE
    trust.check_write(path)  # never through a link: the lock truncates its file
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise Busy(f"{run_dir}: another spade run (pid {holder}) is running in this run "
                       f"directory; wait for it to end, or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_locked(recipe, from_round: int, run_dir: Path) -> None:
    from spade_cli import commands
    from spade_cli import recipe as recipes
    from spade_cli import summary
    from spade_cli.errors import UsageError
    from spade_cli.progress import Progress
    from stages.backends import BackendUnavailable
    from stages.isolation import one_line

    from stages.shards import remove_temp_files

    resolved = recipes.resolved(recipe)
    digest = recipes.digest(resolved)
    remove_temp_files(run_dir)  # a killed run's half-written files: the lock says none is live
    recipes.write_json(run_dir / "recipe.json", resolved)
    summary.open_run_log(run_dir / "run.log")
    if recipe.designer:
        summary.log_line(f"run {recipe.name}: designer {recipe.designer} designs, hints and "
                         f"audits; train-grpo trains the agent role alone")
    group = commands.group()
    progress = Progress(f"run {recipe.name}", "rounds", recipe.rounds, periodic=False)
    current = {"round": from_round}

    engine = Engine(recipe, run_dir) if recipe.serve else None  # stopped when `with` ends
    trainer = Trainer(recipe, run_dir) if recipe.serve else None

    def call(argv: list[str], label: str) -> None:
        """Run one stage; in server mode, a server that died before or under it is started
        again and the stage rerun (it resumes from its finished shards), `restarts` times."""
        progress.note(f"run {recipe.name} r{current['round']:02d}: {label}")
        for attempt in itertools.count():
            try:
                return run_stage(argv)
            except BackendUnavailable as exc:
                if not (engine and engine.dead() and attempt < engine.settings.restarts):
                    raise
                engine.restart(engine.server.model, one_line(exc))

    def run_stage(argv: list[str]) -> None:
        if engine:
            engine.before(argv)
        if trainer:
            trainer.before(argv)
        summary.log_line(f"$ {recipes.shell_line(argv)}")
        try:
            with environment(recipes.designer_environment(recipe, argv[0])):
                group.main(args=argv, prog_name="spade", standalone_mode=False)
        except SystemExit as exc:
            if exc.code not in (0, None):
                if engine:  # a stage that failed because the server died says so
                    engine.check(wait=STAGE_FAILED_WAIT)
                raise SystemExit(exc.code) from None
        if engine:
            engine.after(argv)

    def after_train(train_out: str, current_model: str) -> str:
        model = checkpoint_after(train_out, current_model)
        if engine:
            engine.load(model)
        return model

    start_model, init = recipes.model_init_commands(recipe)
    model = start_model
    for index in range(from_round):
        marker = _marker(run_dir, index)
        if marker is None:
            raise UsageError(f"--from-round {from_round}: round {index} is not finished")
        model = marker["model"]
    loop = recipes.Loop(recipe, call, after_train, produced,
                        server_args(engine.base_url) if engine else None)
    with progress, engine or nullcontext(), trainer or nullcontext():
        if init and not (Path(start_model) / "config.json").exists():
            for argv in init:
                call(argv, "build the initial model")
        if recipe.memory_seed and recipe.memory \
                and not (run_dir / "memory" / "seed.jsonl").exists():
            call(recipes.memory_seed_command(recipe), "seed the memory")
        for index in range(from_round, recipe.rounds):
            marker = _marker(run_dir, index)
            current["round"] = index
            progress.reached(index, recipe.rounds)
            if marker and marker.get("recipe") == digest:
                model = marker["model"]
                summary.log_line(f"run {recipe.name}: round {index} already finished")
                continue
            if marker:
                warn_rerun(recipe.name, index, marker.get("resolved"), resolved)
            if engine and engine.server is None:  # the first round that runs, with its model
                engine.start(model)
            model = loop.round(index, model)
            check_outputs(index, loop.outputs)
            recipes.write_json(run_dir / f"r{index:02d}" / "_round.json",
                               {"round": index, "model": model, "recipe": digest,
                                "resolved": resolved})
    summary.log_line(f"run {recipe.name}: {recipe.rounds} rounds done, model {model}",
                     echo=True)


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ for one stage, then what was there before: the stages run in this
    process, so this is their environment (the designer's key reaches design, hint and audit
    so, and no other stage)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def warn_rerun(name: str, index: int, before: dict | None, now: dict) -> None:
    """A finished round whose recipe changed is run again: say so, and what changed."""
    from spade_cli import recipe as recipes
    from spade_cli import summary

    changes = recipes.changes(before, now) if before else []
    what = "; ".join(changes) if changes else "the recipe changed since it finished"
    summary.log_line(f"run {name}: warning: round {index} was finished with other settings and "
                     f"runs again: {what}", echo=True)


def check_outputs(index: int, outputs: list[str]) -> None:
    """Before a round is marked done: every stage it called left its output directory with a
    complete manifest. A stage that exited 0 without one (its output went elsewhere) is
    OutputError (exit 73), and the round stays unfinished, so a rerun runs it again."""
    from stages.shards import EX_CANTCREAT, MANIFEST, OutputError

    for out in outputs:
        try:
            complete = json.loads((Path(out) / MANIFEST).read_text()).get("complete") is True
        except (OSError, ValueError, AttributeError):
            complete = False
        if not complete:
            raise OutputError(f"{out}: no complete {MANIFEST} after its stage finished: round "
                              f"{index} is not marked done", EX_CANTCREAT)


def _marker(run_dir: Path, index: int) -> dict | None:
    path = run_dir / f"r{index:02d}" / "_round.json"
    return json.loads(path.read_text()) if path.exists() else None


def checkpoint_after(train_out: str, current: str) -> str:
    """The checkpoint train-grpo wrote (from its manifest), or the current model if none."""
    manifest = Path(train_out) / "_manifest.json"
    if not manifest.exists():
        return current
    ckpt = json.loads(manifest.read_text()).get("config", {}).get("ckpt")
    return ckpt if ckpt and ckpt != "None" else current


def produced(path: str, kind: str | None) -> bool:
    """Whether a stage output (dir or file) exists with shards (of `kind`, when given)."""
    target = Path(path)
    if target.is_file():
        return True
    if not target.is_dir():
        return False
    pattern = f"{kind}-*.jsonl*" if kind else "*.jsonl*"
    return any(p.stat().st_size > 0 for p in target.glob(pattern))
