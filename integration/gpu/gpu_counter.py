# A CUDA workload for checkpoint/restore tests: GPU memory filled with known data.
# Env: GIB (GiB of device data per process), PROCS (CUDA processes in the container),
# STATE (state file prefix), IDLE=1 (no GPU work until STATE.check exists), SEED (every process
# fills the same data, as data-parallel replicas hold the same weights; default: one seed per process). Each process
# rewrites STATE.<i> every tick with
# "token counter ok|CORRUPT"; `ok` means the device data's checksum is unchanged. SPREAD=1: process i uses GPU i
# (one process per GPU of a multi-GPU container).
import os
import subprocess
import sys
import time

import torch

gib = float(os.environ.get("GIB", "1"))
procs = int(os.environ.get("PROCS", "1"))
rank = int(os.environ.get("RANK", "0"))
state_prefix = os.environ.get("STATE", "/tmp/state")

children = []
if rank == 0:
    for other in range(1, procs):
        children.append(subprocess.Popen([sys.executable, __file__], env=dict(os.environ, RANK=str(other))))

if os.environ.get("SPREAD") == "1":
    torch.cuda.set_device(rank)
token = os.urandom(8).hex()
chunk_elems = 256 << 20  # 1 GiB of int32 per chunk keeps temporaries small
chunks, expected = [], []
generator = torch.Generator(device="cuda").manual_seed(int(os.environ.get("SEED", 1000 + rank)))
remaining = int(gib * (1 << 30)) // 4
while remaining > 0:
    count = min(chunk_elems, remaining)
    chunk = torch.randint(0, 1 << 30, (count,), dtype=torch.int32, device="cuda", generator=generator)
    chunks.append(chunk)
    expected.append(int(chunk.sum(dtype=torch.int64)))
    remaining -= count
torch.cuda.synchronize()
torch.cuda.empty_cache()  # hand the randint temporaries back: the process holds ~GIB of device memory

idle = os.environ.get("IDLE") == "1"  # the GPU left alone, its data checked only when STATE.check appears
counter, intact = 0, True
while True:
    counter += 1
    if not idle or os.path.exists(f"{state_prefix}.check"):
        intact = all(int(chunk.sum(dtype=torch.int64)) == want for chunk, want in zip(chunks, expected))
    path = f"{state_prefix}.{rank}"
    with open(path + ".new", "w") as state:
        state.write(f"{token} {counter} {'ok' if intact else 'CORRUPT'}\n")
    os.replace(path + ".new", path)
    time.sleep(0.1)
