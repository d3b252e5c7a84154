# Data-parallel training as users start it: torch.distributed with NCCL, one process per GPU
# (mp.spawn), DistributedDataParallel, deterministic (fixed seeds, per-rank seeded batches).
# Env: WORLD (ranks), STEPS, PAUSE_AT, STATE (rank 0 rewrites it with the step number),
# RESULT (rank 0 writes the final weights digest), MASTER_PORT, WORKERS (DataLoader workers per rank, forked after
# CUDA init as the common loop has them; 0: batches made on the GPU). RANK: run that one rank in this process, on
# the container's one GPU (a job whose ranks live in separate containers; WORLD of them).
import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


class Batches(torch.utils.data.Dataset):
    """Per-rank batches made on the CPU from their index alone: any worker makes the same batch."""

    def __init__(self, rank: int, steps: int) -> None:
        self.rank, self.steps = rank, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(100_000 * (1 + self.rank) + index)
        return torch.randn(512, 1024, generator=generator), torch.randn(512, 1024, generator=generator)


def worker(rank: int, world: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29544")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    device = 0 if "RANK" in os.environ else rank  # one rank a container: its one GPU
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda(), device_ids=[device])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator(device="cuda").manual_seed(1 + rank)
    steps, pause_at = int(os.environ.get("STEPS", "300")), int(os.environ.get("PAUSE_AT", "-1"))
    workers = int(os.environ.get("WORKERS", "0"))
    loader = iter(torch.utils.data.DataLoader(Batches(rank, steps), batch_size=None, num_workers=workers,
                                              pin_memory=True)) if workers else None
    for step in range(steps):
        if loader is not None:
            inputs, target = (tensor.cuda(non_blocking=True) for tensor in next(loader))
        else:
            inputs = torch.randn(512, 1024, device="cuda", generator=generator)
            target = torch.randn(512, 1024, device="cuda", generator=generator)
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        if rank == 0:
            with open(os.environ.get("STATE", "/tmp/train_state"), "w") as state:
                state.write(f"{step}\n")
        if step >= pause_at >= 0:
            time.sleep(0.05)
    if rank == 0:
        digest = hashlib.sha256()
        for parameter in model.parameters():
            digest.update(parameter.detach().cpu().numpy().tobytes())
        with open(os.environ.get("RESULT", "/tmp/train_result"), "w") as result:
            result.write(digest.hexdigest() + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(os.environ.get("WORLD", "2"))
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]), world)
    else:
        mp.spawn(worker, args=(world,), nprocs=world)
