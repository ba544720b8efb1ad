"""The ranks of `spade train-grpo --nproc N`: torchrun starts N of these, each runs train-grpo.

In: a spec file the launching command wrote (the records, model and checkpoint folders, the
config and round, pickled: spade writes it and spade reads it, on this machine).
Out: the main rank writes the outcome beside it: (train records, checkpoint, info), or the
exception that stopped training, which the launching command raises as its own (Diverged is
still exit 65); ranks that died with no outcome (killed: out of memory, a signal) are
RanksFailed, exit 69.
Guarantees: the ranks train exactly what `stages.train_grpo.run` trains in one process (see
stages/parallel.py); nothing but the main rank writes a file.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from stages import parallel, train_grpo
from stages.backends import BackendUnavailable


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
                           stdout=sys.stderr)  # records go to this command's stdout, not theirs
    if outcome.exists():
        result = pickle.loads(outcome.read_bytes())
        if isinstance(result, BaseException):
            raise result
        return result
    raise RanksFailed(f"train-grpo on {nproc} ranks stopped with no result (torchrun exit "
                      f"{code}): a rank was killed (out of memory is the usual cause) or "
                      f"crashed; the ranks' output is above, no checkpoint was written")


def main(spec: str) -> int:
    records, model_dir, ckpt_root, cfg, round = pickle.loads(Path(spec).read_bytes())
    layout = parallel.from_environment()
    outcome = Path(spec).with_name("outcome.pkl")
    try:
        result = train_grpo.run(records, model_dir, ckpt_root, cfg, round=round, layout=layout)
    except Exception as exc:
        if layout.main:
            outcome.write_bytes(pickle.dumps(exc))
        raise
    if layout.main:
        outcome.write_bytes(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
