"""Options shared by several commands, so each is spelled and documented once; the check that a
model named on the command line can be loaded here, made before any work starts; and the jail
executor that --executor and --address name."""

from __future__ import annotations

import os
import threading
from enum import Enum
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlparse

import typer

if TYPE_CHECKING:
    from stages.executor import Executor

Inputs = Annotated[list[str], typer.Argument(
    metavar="INPUT",
    help="Shards (.jsonl, .jsonl.gz, .jsonl.zst), directories of shards, or '-' for stdin.")]
Out = Annotated[str, typer.Option(
    "--out", "-o", metavar="PATH",
    help="'-' for stdout, a directory for resumable sharded output, or a .jsonl[.gz|.zst] file.")]
Overwrite = Annotated[bool, typer.Option(
    "--overwrite", help="Redo shards a previous run already finished.")]
Compress = Annotated[str, typer.Option(
    "--compress", metavar="SUFFIX",
    help="Shard file suffix in directory mode: jsonl, jsonl.gz or jsonl.zst.")]

BackendName = Annotated[str, typer.Option(
    "--backend", metavar="NAME",
    help="hf (transformers), vllm (GPU), or openai (any compatible server).")]
Model = Annotated[str, typer.Option(
    "--model", "-m", metavar="PATH",
    help="Model directory (hf, vllm; a cached hub id `org/name` also works) or the server's "
         "model name (openai).")]
BaseUrl = Annotated[str | None, typer.Option(
    "--base-url", metavar="URL", help="openai backend: server URL (default $OPENAI_BASE_URL).")]
PolicyName = Annotated[str | None, typer.Option(
    "--policy", metavar="NAME",
    help="What records name as the policy that made them (default: the model directory, or "
         "the server URL and model name). In server mode the runner passes the checkpoint the "
         "server holds.")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", metavar="KEY", help="openai backend: API key (default $OPENAI_API_KEY).")]
Device = Annotated[str | None, typer.Option(
    "--device", metavar="DEVICE", help="hf backend: cpu, cuda, cuda:1.")]
Temperature = Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")]
TopP = Annotated[float, typer.Option(help="Nucleus sampling threshold.")]
TopK = Annotated[int, typer.Option(help="Top-k sampling (0 = off).")]
# The reference samples designs and agent turns with top-p 0.95, top-k 20
# (spade/slime/arguments.py:37-46, 69-79). Its hint and audit calls pass neither, so they get
# the adapter's top-p 0.9 (spade/slime/model_adapter.py:155, 177) and slime's top-k -1, off
# (slime/utils/arguments.py, --rollout-top-k).
TOP_P, TOP_K = 0.95, 20
JUDGE_TOP_P, JUDGE_TOP_K = 0.9, 0
EnableThinking = Annotated[bool | None, typer.Option(
    "--enable-thinking/--no-enable-thinking",
    help="Qwen3 templates: think before answering (the chat template's enable_thinking; openai: "
         "sent as chat_template_kwargs). Unset: the template's own default.")]
MaxTokens = Annotated[int, typer.Option(help="Most tokens one completion may have.")]
ContextLength = Annotated[int | None, typer.Option(
    min=1, metavar="N", help="The model's context in tokens (default: the model's own): a "
                             "prompt that leaves no room for --max-tokens is not generated "
                             "(rollout: outcome context_limit). The paper: 32768.")]
Seed = Annotated[int, typer.Option(help="Seed for sampling and for every random choice.")]


class SamplingSeedMode(str, Enum):
    """What --sampling-seed accepts: whether each model request hands the engine its own seed."""

    request = "request"
    none = "none"

    @property
    def per_request(self) -> bool:
        return self is SamplingSeedMode.request

    def config(self) -> dict[str, str]:
        """Its entry in a stage's config digest: none for the default, so that output written
        before the option existed still resumes."""
        return {} if self.per_request else {"sampling_seed": self.value}


SamplingSeed = Annotated[SamplingSeedMode, typer.Option(
    "--sampling-seed",
    help="request: every model request carries its own seed (derived from --seed and what the "
         "request is for), so each sample reproduces from it whatever else the engine batches. "
         "none: no request carries a seed; the engine samples from its own state, so a rerun "
         "does not reproduce the samples. none is faster only where the engine samples seeded "
         "requests one by one (vLLM's V1 model runner: docs/gpu.md, Seeds).")]
PromptsDir = Annotated[str | None, typer.Option(
    "--prompts", metavar="DIR",
    help="Directory of prompt files overriding the built-in ones by name.")]
Round = Annotated[int, typer.Option("--round", help="Co-training round these records belong to.")]
ExecutorName = Annotated[str, typer.Option(
    "--executor", metavar="NAME",
    help="Where the jails run: local (this machine), or ray (the nodes of a Ray cluster, "
         "each running its own jails; every node needs spade and nsjail).")]
Address = Annotated[str | None, typer.Option(
    "--address", metavar="HOST:PORT",
    help="With --executor ray: the cluster's head, HOST:PORT, or auto (the default: "
         "$RAY_ADDRESS, else the cluster `ray start` made on this machine).")]

HUB_PROBE_SECONDS = 3.0  # how long `check_model` waits to learn whether the hub is reachable


def backend_spec(backend: str, model: str, base_url: str | None, api_key: str | None,
                 device: str | None, context_length: int | None = None,
                 policy: str | None = None):
    from spade_cli.errors import UsageError
    from stages.backends import BackendSpec

    if backend not in ("hf", "vllm", "openai"):
        raise UsageError(f"--backend must be hf, vllm or openai, not {backend!r}")
    if not model:
        raise UsageError("--model is required")
    if backend == "openai":  # the server knows its models
        return BackendSpec(name=backend, model=model, base_url=base_url, api_key=api_key,
                           device=device, options={"policy": policy} if policy else {})
    path = check_model(model)
    # a hub id found in the cache loads from there; records still name the hub id
    options = {"policy": policy or model} if policy or path != model else {}
    if context_length:  # vllm sizes its engine by it; hf refuses prompts that would pass it
        options["max_model_len" if backend == "vllm" else "context_length"] = context_length
    return BackendSpec(name=backend, model=path, base_url=base_url, api_key=api_key,
                       device=device, options=options)


class StageBackend:
    """A stage's backend: loaded at its first use (after the jails started; never when there is
    nothing to generate), its tokens counted into `progress`, and closed when the stage ends, so
    an in-process engine frees its GPU before the next stage of a `spade run` loads one."""

    def __init__(self, spec, progress=None):
        self.spec, self.progress, self.backend = spec, progress, None

    def get(self):
        if self.backend is None:
            from spade_cli.progress import Counted
            from stages.backends import load_backend

            backend = load_backend(self.spec)
            self.backend = Counted(backend, self.progress) if self.progress else backend
        return self.backend

    def __enter__(self) -> "StageBackend":
        return self

    def __exit__(self, error_type: type | None, *exc: object) -> None:
        backend, self.backend = self.backend, None
        # after an error or Ctrl-C the process is ending: closing would wait for requests in
        # flight, which daemon threads abandon at exit
        if backend is not None and error_type is None:
            backend.close()


def open_jail_executor(executor: str, address: str | None, workers: int) -> Executor:
    """The executor --executor and --address ask for (stages/executor.py), joined now; a name
    or address that makes no sense is a UsageError, a cluster that cannot be used exit 69."""
    from spade_cli.errors import UsageError
    from stages.executor import EXECUTORS, open_executor, parse_address

    if executor not in EXECUTORS:
        raise UsageError(f"--executor must be {' or '.join(EXECUTORS)}, not {executor!r}")
    if address is not None and executor != "ray":
        raise UsageError("--address is for --executor ray")
    if address not in (None, "auto"):
        try:
            parse_address(address)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return open_executor(executor, workers, address)


def check_model(model: str) -> str:
    """The directory to load `model` from: itself, or for a hub id `org/name` its snapshot in
    the local hub cache. A hub id that is not cached is returned as it is only when the hub
    answers now; otherwise BackendUnavailable (exit 69) at once, not after a hub client's
    minute of retries. Not a directory and not a hub id: InputMissing (exit 66)."""
    from stages.backends import BackendUnavailable, check_local_model

    check_local_model(model)
    if os.path.isdir(model):
        return model
    cached = cached_snapshot(model)
    if cached:
        return cached
    why = hub_unreachable()
    if why:
        raise BackendUnavailable(
            f"{model}: not a local directory, not in the hub cache, and {why}: pass a model "
            f"directory instead (`spade model tiny DIR` builds one offline; on a machine with "
            f"network, `hf download {model} --local-dir DIR` fetches this one)")
    return model


def cached_snapshot(model: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    config = try_to_load_from_cache(model, "config.json", cache_dir=hub_cache())
    return os.path.dirname(config) if isinstance(config, str) else None


def hub_cache() -> str:
    """The hub cache directory, read from the environment now (not at library import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return os.path.join(home, "hub")


def hub_unreachable() -> str | None:
    """Why the hub cannot be used right now, or None when a connection to it (or to the proxy)
    opens within HUB_PROBE_SECONDS. Name lookup can hang: it runs on a thread we stop waiting
    for."""
    if any(os.environ.get(flag, "").lower() in ("1", "true", "yes", "on")
           for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return "HF_HUB_OFFLINE is set"
    endpoint = urlparse(os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
                        or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or ""
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    outcome: list[str | None] = []

    def probe() -> None:
        import socket

        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port} cannot be reached ({exc.strerror or exc})")

    thread = threading.Thread(target=probe, daemon=True, name="hub-probe")
    thread.start()
    thread.join(HUB_PROBE_SECONDS + 0.5)
    return outcome[0] if outcome else f"{host} did not answer within {HUB_PROBE_SECONDS:.0f}s"
