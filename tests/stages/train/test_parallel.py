"""The sharded trainer: N ranks make the update one rank makes, on one machine or two."""

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stages.train import parallel  # noqa: E402
from stages.records import Rollout, Turn  # noqa: E402

pytestmark = pytest.mark.slow
TRAIN = ["--lr", "1e-3", "--micro-batch-tokens", "40"]  # several passes, shared unevenly


@pytest.fixture(scope="module")
def plays_file(tmp_path_factory):
    """Six 3-turn plays in two envs, written as a rollout shard."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("plays") / "plays.jsonl"
    lines = []
    for seed in range(6):
        prompt, turns = [1, 50, 51, 52, 2], []
        for _ in range(3):
            completion = [rng.randrange(10, 1500) for _ in range(rng.randrange(2, 7))] + [3]
            turns.append(Turn(action="a", prompt_ids=list(prompt), completion_ids=completion,
                              logprobs=[rng.uniform(-3, -0.5) for _ in completion]))
            prompt = prompt + completion + [1, rng.randrange(10, 1500), 2]
        lines.append(json.dumps(Rollout(env_id=f"env_{seed % 2}", seed=seed,
                                        reward=float(seed % 3 == 0), turns=turns).to_dict()))
    path.write_text("\n".join(lines) + "\n")
    return path


def train(args, timeout=300, **kwargs):
    done = subprocess.run([sys.executable, "-m", "spade_cli", "train-grpo", *args],
                          capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def weights(checkpoint):
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))


def largest_difference(a, b):
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def one_rank(plays_file, tiny_model, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("one") / "ckpt"
    done = train([str(plays_file), "-m", tiny_model, "--ckpt-dir", str(ckpt), *TRAIN])
    return ckpt / "step-000001", done


def test_two_ranks_make_the_update_one_rank_makes(plays_file, tiny_model, one_rank, tmp_path):
    single, single_run = one_rank
    ckpt = tmp_path / "ckpt"
    done = train([str(plays_file), "-m", tiny_model, "--ckpt-dir", str(ckpt), "--nproc", "2",
                  *TRAIN])
    pair = ckpt / "step-000001"
    assert largest_difference(weights(single), weights(pair)) < 1e-5
    (one,), (two,) = ([json.loads(line) for line in out.stdout.splitlines()]
                      for out in (single_run, done))
    for key in ("loss", "loss_tokens", "forward_tokens", "entropy"):
        assert two["stats"][key] == pytest.approx(one["stats"][key], rel=1e-6)
    assert two["stats"]["grad_norm"] == pytest.approx(one["stats"]["grad_norm"], rel=1e-4)
    # the optimizer state is the same file either way: the next round on one rank from the
    # two-rank checkpoint matches the next round from the one-rank checkpoint
    nxt = [train([str(plays_file), "-m", str(start), "--ckpt-dir", str(tmp_path / name), *TRAIN])
           for start, name in ((single, "after-one"), (pair, "after-two"))]
    assert all(run.returncode == 0 for run in nxt)
    assert largest_difference(weights(tmp_path / "after-one" / "step-000002"),
                              weights(tmp_path / "after-two" / "step-000002")) < 1e-5


@pytest.mark.parametrize("offload", ["all", "optimizer"])
def test_two_offloaded_ranks_make_the_same_update(plays_file, tiny_model, one_rank, tmp_path,
                                                  offload):
    """With FSDP2's offload the shards and the optimizer step live in host memory; with the
    optimizer's, AdamW's state and step; the update is the same."""
    single, _ = one_rank
    ckpt = tmp_path / "ckpt"
    train([str(plays_file), "-m", tiny_model, "--ckpt-dir", str(ckpt), "--nproc", "2",
           "--offload", offload, *TRAIN])
    assert largest_difference(weights(single), weights(ckpt / "step-000001")) < 1e-5


KL = ["--lr", "1e-3", "--micro-batch-tokens", "60", "--kl-beta", "0.5"]


def test_a_kl_round_on_two_ranks_with_a_replay_pass_finishes_with_the_one_rank_update(
        plays_file, tiny_model, one_rank, tmp_path):
    """A rank with fewer micro-batches replays one at weight 0; with a KL anchor that replay
    must run the anchor's forward too, or the ranks' all-gathers stop pairing up (a hang).
    From a trained checkpoint, so the policy differs from its anchor and KL pulls."""
    from stages import shards
    from stages.train.config import Config
    from stages.train.loop import _rank_passes
    from stages.train.samples import build_samples

    samples, _ = build_samples(shards.read([str(plays_file)]), Config())
    chosen = list(range(len(samples)))
    passes = [_rank_passes(samples, chosen, Config(micro_batch_tokens=60),
                           parallel.Layout(rank, 2)) for rank in (0, 1)]
    assert any(not counts for share in passes for _, counts in share)  # a replay happens
    start, _ = one_rank
    runs = {nproc: train([str(plays_file), "-m", str(start), "--ckpt-dir",
                          str(tmp_path / str(nproc)), "--nproc", str(nproc), *KL], timeout=120)
            for nproc in (1, 2)}
    one, two = (weights(tmp_path / str(nproc) / "step-000002") for nproc in (1, 2))
    assert largest_difference(one, two) < 1e-5
    (kl_one,), (kl_two,) = ([json.loads(line)["stats"]["kl_ref"]
                             for line in runs[n].stdout.splitlines()] for n in (1, 2))
    assert kl_one > 0 and kl_two == pytest.approx(kl_one, rel=1e-5)


@pytest.mark.gpu
def test_the_sharded_trainer_on_one_cuda_rank_makes_the_plain_update(plays_file, tiny_model,
                                                                      tmp_path):
    """FSDP2 over a group of one on CUDA (nccl for CUDA tensors, gloo for the offloaded
    shards) against the same update without FSDP, both under bf16 autocast: the layout does
    not change the math. AdamW's first step moves each weight by about lr whatever its
    gradient's size, so bf16 noise can flip a tiny gradient's sign: weights agree to 2.5 lr."""
    runs, stats = {}, {}
    for name, extra in (("plain", []), ("sharded", ["--offload", "all"])):
        done = train([str(plays_file), "-m", tiny_model, "--ckpt-dir", str(tmp_path / name),
                      "--device", "cuda", *extra, *TRAIN])
        runs[name] = weights(tmp_path / name / "step-000001")
        stats[name] = json.loads(done.stdout.splitlines()[0])["stats"]
    start = weights(Path(tiny_model))
    assert max(float((runs["plain"][k].float() - start[k].float()).abs().max())
               for k in start if k in runs["plain"]) > 5e-4  # it trained at all
    assert largest_difference(runs["plain"], runs["sharded"]) < 2.5e-3
    assert stats["sharded"]["loss"] == pytest.approx(stats["plain"]["loss"], rel=1e-2, abs=1e-4)
    assert stats["sharded"]["grad_norm"] == pytest.approx(stats["plain"]["grad_norm"], rel=2e-2)


def descendants(pid: int) -> list[str]:
    """The processes under `pid` (ours alone: other runs' ranks may be on the machine too)."""
    children: dict[str, list[str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it has exited since
            continue
        children.setdefault(fields[1], []).append(stat.parent.name)
    found, todo = [], [str(pid)]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def command_line(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has exited since
        return b"torch.distributed.run"


def test_a_killed_rank_is_one_line_and_exit_69_with_no_checkpoint(plays_file, tiny_model,
                                                                    tmp_path):
    """What the kernel's OOM killer does to a rank: the command says so, it is no bug."""
    import signal
    import time

    ckpt = tmp_path / "ckpt"
    command = subprocess.Popen(
        [sys.executable, "-m", "spade_cli", "train-grpo", str(plays_file), "-m", tiny_model,
         "--ckpt-dir", str(ckpt), "--nproc", "2", *TRAIN],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and command.poll() is None:
        ranks = [pid for pid in descendants(command.pid)
                 if b"stages.train.ranks" in command_line(pid)
                 and b"torch.distributed.run" not in command_line(pid)]
        if ranks:  # a worker, not torchrun itself (whose command line names the module too)
            os.kill(int(ranks[0]), signal.SIGKILL)
            break
        time.sleep(0.05)
    out, err = command.communicate(timeout=120)
    assert command.returncode == 69, err[-2000:]
    assert "Traceback" not in err.splitlines()[-1]
    assert "train-grpo on 2 ranks stopped with no result" in err.splitlines()[-1]
    assert out == "" and not list(ckpt.glob("step-*[0-9]"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_two_node_rendezvous_on_loopback_trains_as_one_rank(plays_file, tiny_model, one_rank,
                                                              tmp_path):
    """Two launchers, one rank each, as two machines would start them."""
    single, _ = one_rank
    ckpt = tmp_path / "ckpt"
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={rank}",
         "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
         "-m", "spade_cli", "train-grpo", str(plays_file), "-m", tiny_model,
         "--ckpt-dir", str(ckpt), *TRAIN],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in (0, 1)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][1][-2000:]
    assert largest_difference(weights(single), weights(ckpt / "step-000001")) < 1e-5
    # the main rank writes the records; the other only trained
    assert len(outputs[0][0].splitlines()) == 1 and outputs[1][0] == ""


def test_ranks_share_micro_batches_by_tokens_and_make_as_many_passes():
    assert parallel.assign([100, 60, 50, 40, 10], 2) == [[0, 3], [1, 2, 4]]  # 140 and 120 tokens
    assert parallel.assign([5], 3) == [[0], [], []]
    from stages.train.config import Config
    from stages.train.loop import _rank_passes
    from stages.train.samples import Sample

    samples = [Sample.of_turn("agent", [1] * n, [2], [0.0], 1.0, source=f"p{i}")
               for i, n in enumerate([30, 9, 9, 9])]
    cfg = Config(micro_batch_tokens=20)
    passes = [_rank_passes(samples, [0, 1, 2, 3], cfg, parallel.Layout(rank, 2))
              for rank in (0, 1)]
    assert passes[0] == [([0], True), ([0], False)]  # its replay keeps the collectives even
    assert passes[1] == [([1, 2], True), ([3], True)]


def _gather_on_rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        layout = parallel.Layout(rank, 2)
        for rows in (5, 1):  # shares 3 + 2, and 1 + an empty one
            whole = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
            sharded = distribute_tensor(whole, mesh, [Shard(0)])
            got = parallel.gather_to_main(torch, sharded, layout, "cpu")
            results.put((rank, rows, None if got is None else got.tolist(), whole.tolist()))
    finally:
        dist.destroy_process_group()


def test_a_sharded_weight_is_gathered_whole_to_the_main_rank_only():
    """The export's path: uneven shares (FSDP2 splits dim 0 as torch.chunk does) come back in
    order on rank 0; the other rank receives nothing."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    workers = [context.Process(target=_gather_on_rank, args=(rank, port, results))
               for rank in (0, 1)]
    for worker in workers:
        worker.start()
    got = [results.get(timeout=120) for _ in range(4)]
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    for rank, rows, gathered, whole in got:
        assert gathered == (whole if rank == 0 else None), (rank, rows)


def test_a_bf16_sharded_forward_scores_tokens_at_the_sampling_temperature(tiny_model,
                                                                           monkeypatch):
    """FSDP2 casts the float inputs of a forward to its param dtype unless told not to, and
    its walk enters dataclasses: 0.6 would reach the head as bf16 0.6015625."""
    import functools

    import transformers

    from stages.train import checkpoint, packing

    seen = []
    head_logprobs = packing.head_logprobs

    def spy(torch_, head, hidden, targets, temperatures, *args, **kwargs):
        seen.append((hidden.dtype, temperatures.dtype, temperatures.tolist()))
        return head_logprobs(torch_, head, hidden, targets, temperatures, *args, **kwargs)

    monkeypatch.setattr(packing, "head_logprobs", spy)
    layout = parallel.Layout()
    parallel.start(torch, layout, "cpu", fsdp=True)  # a group of one
    try:
        model, buffers = checkpoint.skeleton(torch, transformers, tiny_model, torch.float32)
        model.loss_logprobs = functools.partial(packing.loss_logprobs, torch, model)
        parallel.shard(torch, model, bf16=True)
        checkpoint.materialize(model, buffers, "cpu", "cpu")
        checkpoint.fill(torch, transformers, model, None, tiny_model, layout,
                        trainer_state=False)
        sequence = packing.pack(torch, [stage_sample(0.6)], "cpu")
        with torch.no_grad():
            model.loss_logprobs(sequence, False)
    finally:
        parallel.stop()
    ((hidden, dtype, temperatures),) = seen
    assert hidden == torch.bfloat16  # the forward did run in bf16
    assert dtype == torch.float32 and temperatures == [torch.tensor(0.6).item()] * 3


def stage_sample(temperature: float):
    from stages.train.samples import Sample

    return Sample.of_turn("agent", list(range(10, 27)), [30, 31, 32], [-1.0] * 3, 1.0,
                          temperature, "p0")
