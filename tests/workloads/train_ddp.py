"""A small data-parallel PyTorch job (CPU, gloo) for the integration tests: real ranks, real checkpoints.

Two commands::

    train_ddp.py allreduce --dir DIR
    train_ddp.py train --dir DIR [--steps N] [--hold-at K] [--checkpoint-every M]

Ranks and world size come from the environment ``torchrun`` sets for each process (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``; a gloo process group is joined). Started without ``torchrun`` (no ``RANK``:
gptrm's own environment, where ``WORLD_SIZE`` counts the task's GPUs, not its processes) it runs as the only
process, with no process group.

``allreduce``: every rank all-reduces (sums) ``[rank, rank + 1, rank + 2, rank + 3]`` and writes what it got
to ``DIR/allreduce-<rank>.json``; the sum over ranks is ``[s, s + W, s + 2W, s + 3W]`` with ``s = W(W-1)/2``.

``train``: a few linear layers fit a fixed random teacher on synthetic data, generated per step from the step's
number, in float64. The global batch is the same at every world size: each rank takes its share of the step's
batch, and the gradient is that of the mean over the whole batch (DDP averages the ranks' gradients, each
scaled by the world size), so the loss trajectory does not depend on how many ranks run it (up to the order
of floating-point sums).

The checkpoint contract (what gptrm's preemptions and elastic resizes expect):

- On its checkpoint signal (``SIGUSR1``, or ``--signal``) or ``SIGTERM``, the ranks agree (an all-reduce of
  the flag after every step) to stop after the same step; rank 0 saves the model, the optimizer and the losses
  so far with ``torch.save`` to ``DIR/checkpoint.pt`` (written beside it, then renamed over it: a checkpoint
  is whole or absent) and every rank exits 0.
- It saves the same way every ``--checkpoint-every`` steps and at the end.
- Started again, at whatever world size, it resumes from ``DIR/checkpoint.pt``.
- ``--hold-at K``: a run that did not resume idles after step K until it is signalled (a stand-in for a job
  longer than a test: the signal then finds it at a known step).

Rank 0 appends ``step loss world_size`` to ``DIR/steps.log`` after each step it completed, and at the end
writes ``DIR/result.json``: the final loss and every step's loss (those of earlier runs from the checkpoint).
Each rank prints one ``train_ddp:`` line per event (start, resume, checkpoint, done) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

GLOBAL_BATCH = 24    # divisible by every world size the tests use (1, 2, 3, 4)
FEATURES = 8
HIDDEN = 32
SEED = 1234
LR = 0.05
MOMENTUM = 0.9
HOLD_POLL_S = 0.05


def say(rank: int, event: str, **fields: Any) -> None:
    """One line of what the tests read: ``train_ddp: EVENT rank=R key=value ...``, written whole in one write (the
    ranks share their output pipe, and ``print`` writes a line and its newline apart when unbuffered, as under
    torchrun's ``python -u``)."""
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (f"train_ddp: {event} rank={rank} {extra}".rstrip() + "\n").encode())


def join() -> tuple[int, int]:
    """(rank, world size): the process group torchrun's environment describes, or a single process."""
    if "RANK" not in os.environ:
        return 0, 1
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def write_atomically(path: Path, write: Any) -> None:
    """Write ``path`` whole or not at all: ``write(tmp)`` beside it, flushed, then renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def allreduce(out: Path) -> None:
    rank, world = join()
    t = torch.arange(4, dtype=torch.float64) + rank
    if world > 1:
        dist.all_reduce(t)
    write_atomically(out / f"allreduce-{rank}.json",
                     lambda p: p.write_text(json.dumps({"rank": rank, "world_size": world, "sum": t.tolist()})))
    say(rank, "allreduce", world_size=world, sum=",".join(f"{v:g}" for v in t.tolist()))
    if world > 1:
        dist.destroy_process_group()


def model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole global batch of ``step`` (the same on every rank and at every world size)."""
    teacher = torch.Generator().manual_seed(SEED + 1)
    w = torch.randn(FEATURES, 1, generator=teacher)
    g = torch.Generator().manual_seed(SEED * 1_000_003 + step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=g)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(GLOBAL_BATCH, 1, generator=g)


class Stop:
    """Set by the checkpoint signal or SIGTERM; :meth:`agreed` tells every rank whether any rank saw it."""

    def __init__(self, signals: list[signal.Signals]) -> None:
        self.seen: signal.Signals | None = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.seen = signal.Signals(signum)

    def agreed(self, world: int) -> bool:
        flag = torch.tensor([1.0 if self.seen is not None else 0.0])
        if world > 1:
            dist.all_reduce(flag)
        return bool(flag.item() > 0)


def train(args: argparse.Namespace) -> int:
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    out: Path = args.dir
    stop = Stop([signal.Signals[args.signal], signal.SIGTERM])
    rank, world = join()
    if GLOBAL_BATCH % world:
        raise SystemExit(f"train_ddp: world size {world} does not divide the global batch {GLOBAL_BATCH}")
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    ckpt_path = out / "checkpoint.pt"
    step, losses = 0, []
    resumed = ckpt_path.exists()
    if resumed:
        ckpt = torch.load(ckpt_path, map_location="cpu")
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, losses = int(ckpt["step"]), list(ckpt["losses"])
        say(rank, "resumed", step=step, world_size=world, saved_world_size=ckpt["world_size"])
    else:
        say(rank, "start", world_size=world)
    ddp = DistributedDataParallel(net) if world > 1 else net
    share = GLOBAL_BATCH // world
    log = (out / "steps.log").open("a", buffering=1) if rank == 0 else None

    def checkpoint(why: str) -> None:
        if rank == 0:
            state = {"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step, "losses": losses,
                     "world_size": world}
            write_atomically(ckpt_path, lambda p: torch.save(state, p))
        if world > 1:
            dist.barrier()   # no rank leaves before the checkpoint is whole
        say(rank, "checkpoint", step=step, reason=why)

    def stopped() -> bool:
        if not stop.agreed(world):
            return False
        checkpoint(stop.seen.name if stop.seen is not None else "another rank was signalled")
        return True

    while step < args.steps:
        x, y = batch(step + 1)
        xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        opt.zero_grad()
        sq = ((ddp(xs) - ys) ** 2).sum()
        (sq * world / GLOBAL_BATCH).backward()
        opt.step()
        total = sq.detach().clone()
        if world > 1:
            dist.all_reduce(total)
        step += 1
        losses.append(total.item() / GLOBAL_BATCH)
        if log is not None:
            log.write(f"{step} {losses[-1]!r} {world}\n")
        if stopped():
            return 0
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
            checkpoint("periodic")
        if step == args.hold_at and not resumed:
            say(rank, "holding", step=step)
            while not stopped():
                time.sleep(HOLD_POLL_S)
            return 0
    checkpoint("end")
    if rank == 0:
        write_atomically(out / "result.json", lambda p: p.write_text(json.dumps(
            {"final_loss": losses[-1], "steps": step, "losses": losses, "world_size": world})))
    say(rank, "done", steps=step, final_loss=repr(losses[-1]), world_size=world)
    if world > 1:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("allreduce", help="all-reduce a tensor across the ranks and write what each got")
    a.add_argument("--dir", type=Path, required=True)
    t = sub.add_parser("train", help="train, checkpointing on the signal, resuming from the checkpoint")
    t.add_argument("--dir", type=Path, required=True, help="checkpoint, step log and result")
    t.add_argument("--steps", type=int, default=60)
    t.add_argument("--hold-at", type=int, default=0, help="a fresh run idles after this step until signalled")
    t.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every this many steps")
    t.add_argument("--signal", default="SIGUSR1", help="the checkpoint signal")
    args = p.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.command == "allreduce":
        allreduce(args.dir)
        return 0
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
