# A 2-rank NCCL job in one container (torch.distributed, one process per GPU): each tick
# all-reduces a tensor and checks the sum. Rank r writes STATE.r = "token counter ok|WRONG".
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STATE = os.environ.get("STATE", "/tmp/state")


def worker(rank: int, world: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    token = os.urandom(8).hex()
    data = torch.full((64 << 20,), float(rank + 1), device="cuda")  # 256 MiB per rank
    counter = 0
    while True:
        counter += 1
        total = data.clone()
        dist.all_reduce(total)
        right = bool(torch.all(total == sum(range(1, world + 1))).item())
        with open(f"{STATE}.{rank}.new", "w") as state:
            state.write(f"{token} {counter} {'ok' if right else 'WRONG'}\n")
        os.replace(f"{STATE}.{rank}.new", f"{STATE}.{rank}")
        time.sleep(0.1)


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
