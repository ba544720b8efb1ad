"""Executors: where the jail side of a stage runs, on this machine or across a Ray cluster.

In: a pure function of one record and the records (`map`), or a Sandbox (`worker`).
Out: `map` yields fn(record) for each record, in input order, with at most 2 x `workers`
records under way; `worker(sandbox)` is an unstarted jail worker with sandbox.jail.Worker's
start/call/close, the same `Reply` objects and the same timeouts, so callers never branch;
`starts` is how many jail starts are worth running at once (a worker pool's starter threads).
  - LocalExecutor: threads of this process, and the in-process Worker.
  - RayExecutor: `map` runs each record as a Ray task (1 CPU, spread over the nodes), which
    starts its jails on the node it runs on; `worker` is a RemoteWorker whose jail lives on one
    node, held by that node's JailHost actor (one per live node, placed when the first worker
    is asked for, the least loaded per CPU chosen), so a play's env steps run where its jail is.
Guarantees: results are those of local execution, in the same order, so records written with a
fixed seed are byte-identical. Ray is imported only by RayExecutor: without it, or when the
cluster cannot be reached within CONNECT_TIMEOUT, or when a node is lost and Ray cannot rerun
its work, ExecutorUnavailable (exit 69, one line). A node whose jail cannot start raises
SandboxUnavailable naming that node, as a jail that cannot start here does. A RemoteWorker's
call never raises: a jail host lost or silent past call_timeout + REMOTE_SLACK is that call's
`sandbox_failure`. Every node needs spade (the same version) and nsjail installed; jails die
with their task or host actor, and so with the run's driver.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

from sandbox.jail import Reply, Sandbox, SandboxUnavailable, Worker
from sandbox.pool import STARTS_PER_NODE, JailWorker, LocalJails
from stages.isolation import one_line

EXECUTORS = ("local", "ray")
CONNECT_TIMEOUT = 3.0  # seconds to reach the cluster's head before giving up
REMOTE_SLACK = 30.0  # seconds a jail host may take beyond the call's own timeout (kill, network)
HOST_START_TIMEOUT = 120.0  # seconds for every node's jail host to come up
JAIL_HOST_THREADS = 256  # calls one node's jail host serves at once: one per play it holds
RAY_HINT = "pip install 'spade-selfplay[ray]' (on every node)"

T = TypeVar("T")
R = TypeVar("R")


class ExecutorUnavailable(SandboxUnavailable):
    """No way to run the jail side as asked: Ray missing, the cluster unreachable or lost.
    A SandboxUnavailable, so every stage stops on it with exit 69 and isolation passes it on."""


class Executor(Protocol):
    starts: int

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...
    def worker(self, sandbox: Sandbox) -> JailWorker: ...
    def close(self) -> None: ...


def open_executor(name: str, workers: int, address: str | None = None) -> Executor:
    """The executor called `name` ("local" or "ray"); `address` is the Ray cluster's."""
    if name == "ray":
        return RayExecutor(workers, address)
    return LocalExecutor(workers)


def parse_address(address: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [HOST]:PORT) as (host, port); ValueError when it is not one."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--address {address!r}: expected auto or HOST:PORT (e.g. head:6379)")
    return host, int(port)


class LocalExecutor(LocalJails):
    """Threads of this process; in-process jail workers (sandbox/pool.py LocalJails)."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            pending: deque[Future] = deque()
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= 2 * self.workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    def close(self) -> None:
        pass

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- Ray ---------------------------------------------------------------------------------------

def _import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutorUnavailable(f"--executor ray needs Ray, which is not installed: "
                                  f"{RAY_HINT}") from None
    return ray


def _closed() -> Reply:
    """What a closed worker answers."""
    return Reply("program_error", error={"type": "closed", "msg": "worker closed"})


def _on_this_node(exc: SandboxUnavailable) -> SandboxUnavailable:
    """The same failure, naming the node it happened on."""
    import ray

    return type(exc)(f"node {ray.util.get_node_ip_address()}: {exc}")


def _apply(fn: Callable[[T], R], item: T) -> R:
    """One record's work, as a Ray task."""
    try:
        return fn(item)
    except SandboxUnavailable as exc:
        raise _on_this_node(exc) from None


class JailHost:
    """A Ray actor, one per node: starts, drives and stops that node's jail workers by key."""

    def __init__(self):
        self.workers: dict[str, Worker] = {}
        self.lock = threading.Lock()

    def node(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def start(self, key: str, sandbox: Sandbox) -> Reply:
        worker = Worker(sandbox)
        try:
            reply = worker.start()
        except SandboxUnavailable as exc:
            raise _on_this_node(exc) from None
        with self.lock:
            self.workers[key] = worker
        return reply

    def call(self, key: str, op: str, fields: dict[str, Any]) -> Reply:
        worker = self.workers.get(key)
        return worker.call(op, **fields) if worker is not None else _closed()

    def close(self, key: str) -> Reply:
        """Stop the worker; what it answers from now on (as a closed local worker would)."""
        with self.lock:
            worker = self.workers.pop(key, None)
        if worker is None:
            return _closed()
        worker.close()
        return worker.dead or _closed()


class RemoteWorker:
    """A jail worker held by a node's JailHost: Worker's start/call/close, the same Replies."""

    def __init__(self, host: Any, node: str, sandbox: Sandbox, released: Callable[[], None]):
        self.host, self.node, self.sandbox = host, node, sandbox
        self.limits = sandbox.limits
        self.key = uuid.uuid4().hex
        self.dead: Reply | None = None
        self._released = released

    def __enter__(self) -> "RemoteWorker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Reply:
        """Start the jail on its node; raises SandboxUnavailable if it can't, as Worker does."""
        try:
            reply = self._get(self.host.start.remote(self.key, self.sandbox))
        except SandboxUnavailable:
            self._release()
            raise
        if reply.outcome == "sandbox_failure":  # the host itself is lost or silent
            self._release()
            raise SandboxUnavailable(reply.error["msg"])
        return reply

    def call(self, op: str, **fields: Any) -> Reply:
        """One request, answered on the node within call_timeout; never raises."""
        if self.dead is not None:
            return self.dead
        reply = self._get(self.host.call.remote(self.key, op, fields))
        if reply.outcome == "sandbox_failure":
            self.dead = reply
            self.host.close.remote(self.key)  # a late answer must not leave its jail running
        return reply

    def _get(self, ref: Any) -> Reply:
        import ray

        try:
            return ray.get(ref, timeout=self.limits.call_timeout + REMOTE_SLACK)
        except ray.exceptions.RayTaskError as exc:
            raise exc.cause from None  # the host's own exception, as a local Worker raises it
        except ray.exceptions.GetTimeoutError:
            msg = (f"node {self.node}: no answer from its jail host within "
                   f"{self.limits.call_timeout + REMOTE_SLACK:g}s")
        except ray.exceptions.RayError as exc:
            msg = f"node {self.node}: jail host lost: {one_line(exc)}"
        return Reply("sandbox_failure", error={"type": "sandbox_failure", "msg": msg})

    def _release(self) -> None:
        """Tell the executor this worker's slot on its node is free (once)."""
        released, self._released = self._released, None
        if released is not None:
            released()

    def close(self) -> None:
        if self._released is None:
            return
        try:
            self.dead = self._get(self.host.close.remote(self.key))
        finally:
            self._release()


class RayExecutor:
    """The jail side on a Ray cluster: tasks for `map`, per-node jail hosts for `worker`."""

    def __init__(self, workers: int, address: str | None = None):
        """Join the cluster at `address` ("auto": $RAY_ADDRESS, else the one `ray start` made
        on this machine); a process already joined to that cluster (or, with address None, to
        any) keeps its connection, and keeps it after close()."""
        self.ray = _import_ray()
        self.workers = max(1, workers)
        self.joined = _join(self.ray, address)
        self.starts = STARTS_PER_NODE * max(1, len(_cpu_nodes(self.ray)))
        self._task = self.ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_apply)
        self._lock = threading.Lock()
        self._hosts: list[tuple[Any, str, float]] | None = None  # (actor, node ip, CPUs)
        self._open: list[int] = []

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        ray = self.ray
        fn_ref = ray.put(fn)  # shipped once, not with every record
        pending: deque = deque()
        try:
            for item in items:
                pending.append(self._task.remote(fn_ref, item))
                if len(pending) >= 2 * self.workers:
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            for ref in pending:  # stopped early: kill what still runs, and its jails with it
                ray.cancel(ref, force=True)

    def _result(self, ref: Any) -> Any:
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            raise exc.cause from None  # the task's own exception, as local execution raises it
        except ray.exceptions.RayError as exc:  # a node lost past Ray's retries, ...
            raise ExecutorUnavailable(f"ray: {one_line(exc)}") from None

    def worker(self, sandbox: Sandbox) -> RemoteWorker:
        with self._lock:
            if self._hosts is None:
                self._hosts = self._place_hosts()
                self._open = [0] * len(self._hosts)
            index = min(range(len(self._hosts)), key=lambda i: self._open[i] / self._hosts[i][2])
            self._open[index] += 1
        host, node, _ = self._hosts[index]
        return RemoteWorker(host, node, sandbox, lambda: self._release(index))

    def _release(self, index: int) -> None:
        with self._lock:
            self._open[index] -= 1

    def _place_hosts(self) -> list[tuple[Any, str, float]]:
        """One JailHost on every live node with CPUs, pinned there."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = _cpu_nodes(ray)
        if not nodes:
            raise ExecutorUnavailable("ray: the cluster has no live node with CPUs")
        actor = ray.remote(num_cpus=0, max_concurrency=JAIL_HOST_THREADS)(JailHost)
        hosts = [actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote() for n in nodes]
        try:
            ips = ray.get([host.node.remote() for host in hosts], timeout=HOST_START_TIMEOUT)
        except ray.exceptions.RayError as exc:
            raise ExecutorUnavailable(f"ray: jail hosts did not start: {one_line(exc)}") from None
        return [(host, ip, n["Resources"]["CPU"]) for host, ip, n in zip(hosts, ips, nodes)]

    def close(self) -> None:
        """Stop the jail hosts (their jails die with them); leave the cluster if we joined it."""
        for host, _, _ in self._hosts or []:
            self.ray.kill(host)
        self._hosts = None
        if self.joined:
            self.ray.shutdown()

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cpu_nodes(ray: Any) -> list[dict]:
    """The cluster's live nodes that have CPUs to run jails."""
    return [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]


def _join(ray: Any, address: str | None) -> bool:
    """Connect this process to the cluster at `address`; True if this call connected it."""
    if address is None and ray.is_initialized():
        return False
    address = address or "auto"
    target = address
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:  # $RAY_ADDRESS, else the cluster `ray start` recorded on this machine
            target = get_ray_address_from_environment("auto", None)
        except ConnectionError:
            raise ExecutorUnavailable("ray: no running cluster found on this machine: start one "
                                      "with `ray start --head`, or pass --address HOST:PORT")
    host, port = parse_address(target)
    if ray.is_initialized():
        joined = ray.get_runtime_context().gcs_address
        if parse_address(joined) == (host, port):
            return False
        raise ExecutorUnavailable(f"ray: this process is already joined to {joined}, "
                                  f"not {target}")
    try:  # a quick look first: ray.init waits and retries for a minute on a dead address
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise ExecutorUnavailable(f"ray: cannot reach the cluster at {target}: "
                                  f"{exc.strerror or exc}") from None
    try:  # "auto" as such: only then does Ray pick up this machine's cluster token by itself
        ray.init(address=address, logging_level=logging.WARNING)
    except Exception as exc:  # noqa: BLE001 - versions, tokens: Ray's own one-line reason
        raise ExecutorUnavailable(f"ray: cannot join the cluster at {target}: "
                                  f"{one_line(exc)}") from None
    return True
