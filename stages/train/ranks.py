"""The ranks of `spade train-grpo --nproc N`: torchrun starts N of these, each runs train-grpo.

In: a job file the launching command wrote (the records, model and checkpoint folders, the
config and round, as JSON); or, resident (`spade trainer JOBS`), a jobs folder that `spade
train-grpo --trainer JOBS` writes jobs to.
Out: the main rank writes the outcome beside it, as JSON: the train records, checkpoint and
info, or the exception that stopped training (its type, message and exit code), which the
launching command raises as its own (Diverged is still exit 65, an unknown type exit 1);
ranks that died with no outcome (killed: out of memory, a signal) are RanksFailed, exit 69.
Guarantees: the ranks train exactly what `stages.train.loop.run` trains in one process (see
stages/train/parallel.py); nothing but the main rank writes a file. Resident ranks stay up across
rounds: no process start, rendezvous or checkpoint read when a job trains from the checkpoint
the previous job wrote (its state is kept in host memory, the GPUs are left to the engine), and
the same records as a new process each round. Every rank takes the jobs in the order of their
numbers, so no collective waits between jobs (an idle trainer times nothing out).
Trust: the ranks may run as root, and another local user may reach the jobs folder. Nothing
read from it is a pickle (a pickle runs code when read): jobs and outcomes are JSON, read as
records and a Config. The jobs folder is made 0700, and both sides refuse it (Untrusted, exit
77) unless it is this user's and neither its group nor others can write to it
(stages/trust.py).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import orjson

from stages import trust
from stages.backends import BackendUnavailable
from stages.records import RecordError, Train, parse
from stages.shards import InputMissing, OutputError
from stages.serve import pdeathsig  # also: a torchrun whose spade died stops its ranks
from stages.train import loop, parallel
from stages.train.config import Config
from stages.train.policy import Diverged


JOB, OUTCOME = ".job", ".out"  # a job file and, beside it, its outcome


class RanksFailed(BackendUnavailable):
    """The ranks stopped without an outcome: one was killed or crashed outside train-grpo."""


class TrainingFailed(RuntimeError):
    """An exception of a type the outcome does not carry, raised by the ranks (exit 1)."""


# The exceptions an outcome carries by type, so that the launching command exits as one process
# would (spade_cli/errors.py); any other becomes TrainingFailed. Subclasses first.
CARRIED = (RanksFailed, BackendUnavailable, Diverged, RecordError, InputMissing,
           OutputError)


def job(records: list, model_dir: str, ckpt_root: str, cfg: Config,
        round: int) -> bytes:
    """A job file's bytes: what `loop.run` is called with, as JSON."""
    return orjson.dumps({"records": [record.to_dict() for record in records],
                         "model_dir": model_dir, "ckpt_root": ckpt_root, "config": asdict(cfg),
                         "round": round})


def read_job(path: Path) -> tuple[list, str, str, Config, int]:
    """(records, model dir, checkpoint root, config, round) from a job file."""
    data = _json(path)
    return ([parse(record) for record in data["records"]], data["model_dir"],
            data["ckpt_root"], Config.from_dict(data["config"]), data["round"])


def outcome(result: tuple | BaseException) -> bytes:
    """What the main rank writes: `run`'s (train records, checkpoint, info), or the exception."""
    if isinstance(result, BaseException):
        carried = next((cls for cls in CARRIED if isinstance(result, cls)), None)
        return orjson.dumps({"error": {
            "type": carried.__name__ if carried else type(result).__name__, "msg": str(result),
            "code": getattr(result, "code", None)}})
    trained, checkpoint, info = result
    return orjson.dumps({"train": [record.to_dict() for record in trained],
                         "checkpoint": str(checkpoint) if checkpoint else None, "info": info})


def read_outcome(path: Path) -> tuple[list, Path | None, dict]:
    """`run`'s result from an outcome file; the exception it carries is raised."""
    data = _json(path)
    if "error" in data:
        error = data["error"]
        carried = {cls.__name__: cls for cls in CARRIED}.get(error["type"])
        if carried is OutputError:
            raise OutputError(error["msg"], error["code"])
        if carried is not None:
            raise carried(error["msg"])
        raise TrainingFailed(f"{error['type']}: {error['msg']}")
    checkpoint = data["checkpoint"]
    return ([Train.model_validate(record) for record in data["train"]],
            Path(checkpoint) if checkpoint else None, data["info"])


def _json(path: Path) -> dict:
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"not a job or outcome spade wrote (JSON): {exc}", str(path)) from None


def launch(nproc: int, records: list, model_dir: str, ckpt_root: str, cfg: Config,
           round: int, work: Path) -> tuple[list, Path | None, dict]:
    """Train on `nproc` local ranks (torchrun, standalone rendezvous); what `run` returns.
    `work`: a private folder (a TemporaryDirectory is 0700) for the job and its outcome."""
    trust.check_private(work)
    spec, result = work / f"spec{JOB}", work / f"spec{OUTCOME}"
    spec.write_bytes(job(records, model_dir, ckpt_root, cfg, round))
    result.unlink(missing_ok=True)
    code = subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={nproc}", "-m", "stages.train.ranks", str(spec)],
                           stdout=sys.stderr, env=rank_environment(nproc))  # records go to this command's stdout, not theirs
    if result.exists():
        return read_outcome(result)
    raise RanksFailed(f"train-grpo on {nproc} ranks stopped with no result (torchrun exit "
                      f"{code}): a rank was killed (out of memory is the usual cause) or "
                      f"crashed; the ranks' output is above, no checkpoint was written")


def rank_environment(nproc: int) -> dict[str, str]:
    """Our environment, with each rank's share of the CPU cores for torch's threads: torchrun
    would give every rank one, and the CPU works for the ranks (AdamW under --offload,
    all of training on a machine without GPUs)."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // nproc))
    return {**os.environ, "OMP_NUM_THREADS": threads}


def main(spec: str) -> int:
    trust.check_private(Path(spec).parent)
    _train(Path(spec), Path(spec).with_suffix(OUTCOME), parallel.from_environment())
    return 0


def _train(spec: Path, done: Path, layout: parallel.Layout,
           resident: loop.Resident | None = None) -> None:
    """One job trained; the main rank writes what `run` returned or raised (atomically)."""
    records, model_dir, ckpt_root, cfg, round = read_job(spec)
    try:
        result = loop.run(records, model_dir, ckpt_root, cfg, round=round, layout=layout,
                                resident=resident)
    except Exception as exc:
        result = exc
    if layout.main:
        tmp = done.with_name(done.name + ".tmp")
        tmp.write_bytes(outcome(result))
        os.replace(tmp, done)
    if isinstance(result, BaseException):
        # resident ranks too: the others may be waiting in a collective this rank left
        raise result


# -- resident ranks ---------------------------------------------------------------------------

STOP, READY = "stop", "ready"
POLL = 0.05  # seconds between looks at the jobs folder


START_TIMEOUT = 600.0  # seconds for resident ranks to come up (imports, CUDA, rendezvous)


def start(nproc: int, jobs: Path, log=None) -> subprocess.Popen:
    """Resident ranks over `jobs` (torchrun, standalone rendezvous; output to `log`, default
    our stderr), in a session of their own, stopped if we die; they are ready once
    `jobs/ready` names the world size. `jobs` is made 0700; Untrusted if it is not private."""
    trust.private_dir(jobs)
    for stale in [jobs / READY, jobs / STOP, *jobs.glob(f"*{JOB}*"), *jobs.glob(f"*{OUTCOME}*")]:
        stale.unlink(missing_ok=True)  # jobs belong to the ranks that were given them
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc-per-node={nproc}", "-m", "stages.train.ranks", "--serve",
                             str(jobs)], stdout=log or sys.stderr, stderr=log,
                            env=rank_environment(nproc),
                            start_new_session=True, preexec_fn=pdeathsig(signal.SIGTERM))


def stop(ranks: subprocess.Popen, jobs: Path, grace: float = 30.0) -> None:
    """Ask the ranks to stop (between jobs); their process group is killed if they have not
    within `grace` seconds (one still training, or stuck)."""
    (jobs / STOP).touch()
    try:
        ranks.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        ranks.kill()  # its ranks die with it (serve)
        ranks.wait()


def serve(jobs: Path) -> int:
    """Every rank: run job after job, in order, until `jobs/stop` appears."""
    trust.check_private(jobs)
    # torchrun starts its workers in sessions of their own: without this, a rank whose
    # torchrun was killed would live on and take the next job alone
    die_with_torchrun = pdeathsig(signal.SIGKILL)
    if die_with_torchrun:
        die_with_torchrun()
    layout = parallel.from_environment()
    resident = loop.Resident()
    if layout.main:
        (jobs / "ready.tmp").write_text(f"{layout.world} {os.getpid()}\n")
        os.replace(jobs / "ready.tmp", jobs / READY)
    for number in itertools.count(1):
        spec = jobs / f"{number:06d}{JOB}"
        while not spec.exists():
            if (jobs / STOP).exists():
                resident.close()
                return 0
            time.sleep(POLL)
        _train(spec, spec.with_suffix(OUTCOME), layout, resident)


def submit(jobs: Path, records: list, model_dir: str, ckpt_root: str, cfg: Config,
           round: int, wait: float = 60.0) -> tuple[list, Path | None, dict]:
    """One job for the resident ranks over `jobs`; what `run` returns once they are done.
    RanksFailed if they are not there (within `wait` s of starting) or die meanwhile."""
    world, pid = ready(jobs, wait)
    numbers = [int(p.name[:6]) for p in jobs.glob(f"*{JOB}")]
    spec = jobs / f"{max(numbers, default=0) + 1:06d}{JOB}"
    tmp = spec.with_name(spec.name + ".tmp")
    tmp.write_bytes(job(records, model_dir, ckpt_root, cfg, round))
    os.replace(tmp, spec)
    done = spec.with_suffix(OUTCOME)
    while not done.exists():
        if not _alive(pid):
            raise RanksFailed(f"the resident trainer over {jobs} ({world} ranks) died during "
                              f"the job: its output is in the run's log; no checkpoint written")
        time.sleep(POLL)
    return read_outcome(done)


def ready(jobs: Path, wait: float = 60.0) -> tuple[int, int]:
    """(world size, main rank's pid) of the resident ranks over `jobs`, once they are up;
    Untrusted, before anything in it is read, if `jobs` is not private."""
    deadline = time.monotonic() + wait
    while not (jobs / READY).exists():
        if time.monotonic() > deadline:
            raise RanksFailed(f"no resident trainer answers over {jobs} (start one with "
                              f"`spade trainer {jobs}`)")
        time.sleep(POLL)
    trust.check_private(jobs)
    world, pid = map(int, (jobs / READY).read_text().split())
    if not _alive(pid):
        raise RanksFailed(f"the resident trainer over {jobs} has exited")
    return world, pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        sys.exit(serve(Path(sys.argv[2])))
    sys.exit(main(sys.argv[1]))
