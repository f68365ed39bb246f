"""Multi-process training (DDP): one process per GPU, or gloo processes on CPU.

Launch: ``torchrun --nproc_per_node N -m caprl train ...``, ``srun`` with N tasks under
SLURM, or plain ``caprl train ...`` with ``train.gpus: N`` in params.yaml, which spawns the
N processes itself. Every process reads the same params; rank 0 writes checkpoints and
talks to MLflow.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from caprl.device import default_device


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over processes (identity in one process); differentiable-free."""
        if self.active:
            x = x.detach().clone()
            dist.all_reduce(x)
        return x

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        if not self.active:
            return metrics
        keys = sorted(metrics)
        values = self.sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64)) / self.world
        return dict(zip(keys, values.tolist()))

    def any(self, flag: bool) -> bool:
        return bool(self.sum(torch.tensor([int(flag)])).item()) if self.active else flag

    def gather(self, obj: Any) -> list[Any]:
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def shard(self, items: list[Any]) -> tuple[list[Any], int]:
        """This process's contiguous block of a global batch, and its offset."""
        per = -(-len(items) // self.world)
        start = min(self.rank * per, len(items))
        return items[start : start + per], start


def from_environment() -> Dist:
    """Join the process group described by torchrun's or SLURM's variables, if any."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))
    if world <= 1:
        return Dist(device=default_device())
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    local_rank = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29533")
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world)
    return Dist(rank=rank, world=world, local_rank=local_rank, device=device)


def launched() -> bool:
    return int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))) > 1


def _worker(local_rank: int, world: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        fn(*args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(world: int, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(*args)`` in ``world`` local processes (what torchrun would do on one node).

    SIGTERM/SIGUSR1 to this launcher are passed on to the workers (which save their state
    and exit); a worker's exit code becomes the launcher's.
    """
    import signal

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = torch.multiprocessing.start_processes(_worker, args=(world, port, fn, args), nprocs=world,
                                                    join=False, start_method="spawn")

    def forward(signum: int, _frame: Any) -> None:
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    try:
        while not context.join():
            pass
    except torch.multiprocessing.ProcessExitedException as exc:
        raise SystemExit(exc.exit_code or 1) from exc
    except torch.multiprocessing.ProcessRaisedException as exc:
        raise SystemExit(f"a training process failed:\n{exc}") from exc
