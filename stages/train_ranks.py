"""The ranks of `spade train-grpo --nproc N`: torchrun starts N of these, each runs train-grpo.

In: a spec file the launching command wrote (the records, model and checkpoint folders, the
config and round, pickled: spade writes it and spade reads it, on this machine); or, resident
(`spade trainer JOBS`), a jobs folder that `spade train-grpo --trainer JOBS` writes specs to.
Out: the main rank writes the outcome beside it: (train records, checkpoint, info), or the
exception that stopped training, which the launching command raises as its own (Diverged is
still exit 65); ranks that died with no outcome (killed: out of memory, a signal) are
RanksFailed, exit 69.
Guarantees: the ranks train exactly what `stages.train_grpo.run` trains in one process (see
stages/parallel.py); nothing but the main rank writes a file. Resident ranks stay up across
rounds: no process start, rendezvous or checkpoint read when a job trains from the checkpoint
the previous job wrote (its state is kept in host memory, the GPUs are left to the engine), and
the same records as a new process each round. Every rank takes the jobs in the order of their
numbers, so no collective waits between jobs (an idle trainer times nothing out).
"""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

from stages import parallel, train_grpo
from stages.backends import BackendUnavailable
from stages.serve import pdeathsig  # also: a torchrun whose spade died stops its ranks


class RanksFailed(BackendUnavailable):
    """The ranks stopped without an outcome: one was killed or crashed outside train-grpo."""


def launch(nproc: int, records: list, model_dir: str, ckpt_root: str, cfg: train_grpo.Config,
           round: int, work: Path) -> tuple[list, Path | None, dict]:
    """Train on `nproc` local ranks (torchrun, standalone rendezvous); what `run` returns."""
    spec, outcome = work / "spec.pkl", work / "outcome.pkl"
    spec.write_bytes(pickle.dumps((records, model_dir, ckpt_root, cfg, round)))
    outcome.unlink(missing_ok=True)
    code = subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={nproc}", "-m", "stages.train_ranks", str(spec)],
                           stdout=sys.stderr, env=rank_environment(nproc))  # records go to this command's stdout, not theirs
    if outcome.exists():
        result = pickle.loads(outcome.read_bytes())
        if isinstance(result, BaseException):
            raise result
        return result
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
    outcome = Path(spec).with_name("outcome.pkl")
    _train(Path(spec), outcome, parallel.from_environment())
    return 0


def _train(spec: Path, outcome: Path, layout: parallel.Layout,
           resident: train_grpo.Resident | None = None) -> None:
    """One spec trained; the main rank writes what `run` returned or raised (atomically)."""
    records, model_dir, ckpt_root, cfg, round = pickle.loads(spec.read_bytes())
    try:
        result = train_grpo.run(records, model_dir, ckpt_root, cfg, round=round, layout=layout,
                                resident=resident)
    except Exception as exc:
        result = exc
    if layout.main:
        tmp = outcome.with_name(outcome.name + ".tmp")
        tmp.write_bytes(pickle.dumps(result))
        os.replace(tmp, outcome)
    if isinstance(result, BaseException):
        # resident ranks too: the others may be waiting in a collective this rank left
        raise result


# -- resident ranks ---------------------------------------------------------------------------

JOB, OUTCOME, STOP, READY = ".job", ".out", "stop", "ready"
POLL = 0.05  # seconds between looks at the jobs folder


START_TIMEOUT = 600.0  # seconds for resident ranks to come up (imports, CUDA, rendezvous)


def start(nproc: int, jobs: Path, log=None) -> subprocess.Popen:
    """Resident ranks over `jobs` (torchrun, standalone rendezvous; output to `log`, default
    our stderr), in a session of their own, stopped if we die; they are ready once
    `jobs/ready` names the world size."""
    jobs.mkdir(parents=True, exist_ok=True)
    for stale in [jobs / READY, jobs / STOP, *jobs.glob(f"*{JOB}*"), *jobs.glob(f"*{OUTCOME}*")]:
        stale.unlink(missing_ok=True)  # jobs belong to the ranks that were given them
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc-per-node={nproc}", "-m", "stages.train_ranks", "--serve",
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
    # torchrun starts its workers in sessions of their own: without this, a rank whose
    # torchrun was killed would live on and take the next job alone
    die_with_torchrun = pdeathsig(signal.SIGKILL)
    if die_with_torchrun:
        die_with_torchrun()
    layout = parallel.from_environment()
    resident = train_grpo.Resident()
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


def submit(jobs: Path, records: list, model_dir: str, ckpt_root: str, cfg: train_grpo.Config,
           round: int, wait: float = 60.0) -> tuple[list, Path | None, dict]:
    """One job for the resident ranks over `jobs`; what `run` returns once they are done.
    RanksFailed if they are not there (within `wait` s of starting) or die meanwhile."""
    world, pid = ready(jobs, wait)
    numbers = [int(p.name[:6]) for p in jobs.glob(f"*{JOB}")]
    spec = jobs / f"{max(numbers, default=0) + 1:06d}{JOB}"
    tmp = spec.with_name(spec.name + ".tmp")
    tmp.write_bytes(pickle.dumps((records, model_dir, ckpt_root, cfg, round)))
    os.replace(tmp, spec)
    outcome = spec.with_suffix(OUTCOME)
    while not outcome.exists():
        if not _alive(pid):
            raise RanksFailed(f"the resident trainer over {jobs} ({world} ranks) died during "
                              f"the job: its output is in the run's log; no checkpoint written")
        time.sleep(POLL)
    result = pickle.loads(outcome.read_bytes())
    if isinstance(result, BaseException):
        raise result
    return result


def ready(jobs: Path, wait: float = 60.0) -> tuple[int, int]:
    """(world size, main rank's pid) of the resident ranks over `jobs`, once they are up."""
    deadline = time.monotonic() + wait
    while not (jobs / READY).exists():
        if time.monotonic() > deadline:
            raise RanksFailed(f"no resident trainer answers over {jobs} (start one with "
                              f"`spade trainer {jobs}`)")
        time.sleep(POLL)
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
