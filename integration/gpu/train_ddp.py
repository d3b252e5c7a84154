# Data-parallel training as users start it: torch.distributed with NCCL, one process per GPU
# (mp.spawn), DistributedDataParallel, deterministic (fixed seeds, per-rank seeded batches).
# Env: WORLD (ranks), STEPS, PAUSE_AT, STATE (rank 0 rewrites it with the step number),
# RESULT (rank 0 writes the final weights digest), MASTER_PORT.
import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def worker(rank: int, world: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29544")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda(), device_ids=[rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator(device="cuda").manual_seed(1 + rank)
    steps, pause_at = int(os.environ.get("STEPS", "300")), int(os.environ.get("PAUSE_AT", "-1"))
    for step in range(steps):
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
    mp.spawn(worker, args=(world,), nprocs=world)
