"""`spade serve`: one vLLM OpenAI-compatible server in the foreground, for stages to share."""

from __future__ import annotations

from typing import Annotated

import typer

from spade_cli.options import ContextLength


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: Annotated[str, typer.Option("--model", "-m", metavar="PATH",
                                       help="Model directory (a cached hub id `org/name` "
                                            "also works).")] = ...,
    vllm_args: Annotated[list[str] | None, typer.Argument(
        metavar="VLLM_ARGS", help="More vLLM server arguments, after `--`.",
        show_default=False)] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port; 0 picks a free one.")] = 8000,
    host: Annotated[str, typer.Option(
        help="Address to bind. The server's control endpoints (sleep, wake, reload) have no "
             "authentication: an address off loopback (here or as a vLLM argument) needs "
             "--allow-remote.")] = "127.0.0.1",
    allow_remote: Annotated[bool, typer.Option(
        "--allow-remote", help="Bind off loopback although anyone who reaches the port can "
                               "call worker methods and reload weights from any path.")] = False,
    python: Annotated[str | None, typer.Option(
        metavar="PATH", help="The Python that has vLLM (default: the one running spade).")] = None,
    context_length: ContextLength = None,
    sleep_mode: Annotated[bool | None, typer.Option(
        "--sleep-mode/--no-sleep-mode",
        help="vLLM's sleep mode (CUDA/ROCm), so a trainer can have the GPU between rounds. "
             "Default: on where this machine has a CUDA device.")] = None,
    start_timeout: Annotated[float, typer.Option(
        min=1, help="Seconds to wait for the server to answer.")] = 600.0,
    data_parallel: Annotated[int, typer.Option(
        min=1, help="Engine replicas (vLLM's --data-parallel-size), each with an API server of "
                    "its own behind the one URL; requests are balanced over them, and every "
                    "sleep and reload reaches each.")] = 1,
    tensor_parallel: Annotated[int, typer.Option(
        min=1, help="GPUs each replica is split over (vLLM's --tensor-parallel-size). The "
                    "engine uses data-parallel x tensor-parallel GPUs.")] = 1,
    expert_parallel: Annotated[bool, typer.Option(
        "--expert-parallel/--no-expert-parallel",
        help="Spread a MoE model's experts over all the engine's GPUs (vLLM's "
             "--enable-expert-parallel).")] = False,
) -> None:
    """Serve a model with vLLM (`vllm serve`) until Ctrl-C; print its base URL on stdout once it
    answers.

    Stages reach it with `--backend openai --base-url URL --model spade-policy`: the served
    name stays `spade-policy` whatever checkpoint the server holds. The server runs with
    `--logprobs-mode processed_logprobs` (the logprobs the trainer expects) and vLLM's
    development endpoints (`/sleep`, `/wake_up`, `/collective_rpc` to reload weights), which
    have no authentication: so it binds to 127.0.0.1, and an address off loopback (`--host`,
    or `--host` after `--`) is exit 65 unless `--allow-remote` is given, which prints one line
    saying what the network then reaches. Exit 69 when it cannot start or dies.

    Examples:

        spade serve -m runs/q/model
        spade serve -m runs/q/model --port 0 --python ~/vllm/bin/python -- --dtype float32
        spade serve -m /models/Qwen3-4B-Instruct-2507 --data-parallel 8
        spade serve -m /models/Qwen3-30B-A3B-Instruct-2507 --tensor-parallel 8 --expert-parallel
        spade rollout envs/ --backend openai --base-url http://127.0.0.1:8000/v1 -m spade-policy
    """
    import signal
    import sys
    import time

    from spade_cli.errors import errors_to_exit
    from spade_cli.options import check_model
    from stages import serve as engine
    from stages.backends import BackendUnavailable

    with errors_to_exit("serve"):
        said = engine.layout_flag(vllm_args or ())
        if said:
            from spade_cli.errors import UsageError

            raise UsageError(f"{said[0]!r} sets the engine's layout: use --{said[1]}")
        path = check_model(model)
        sleep = engine.sleep_supported() if sleep_mode is None else sleep_mode
        started = time.monotonic()
        layout = engine.Layout(data_parallel, tensor_parallel, expert_parallel)
        server = engine.start(path, python, host, port, context_length, sleep, vllm_args or (),
                              timeout=start_timeout, layout=layout, allow_remote=allow_remote)
        # a `kill` stops the server like Ctrl-C does, instead of leaving it to PR_SET_PDEATHSIG
        signal.signal(signal.SIGTERM, interrupt)
        try:
            print(f"serve: {model} as {engine.SERVED_NAME} at {server.base_url} on "
                  f"{engine.placement(layout)}, "
                  f"ready in {time.monotonic() - started:.1f} s; Ctrl-C stops it", file=sys.stderr)
            print(server.base_url, flush=True)
            code = server.process.wait()
            raise BackendUnavailable(f"the vLLM server exited with code {code}")
        except KeyboardInterrupt:
            print("serve: stopping", file=sys.stderr)
        finally:
            server.stop()


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
