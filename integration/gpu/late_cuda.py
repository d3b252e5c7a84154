# A CUDA process and a second process that begins using CUDA the moment a checkpoint of its container
# is under way: what inductor's compile pool does when it wakes up at the wrong time. Both write
# STATE.<i> ("token counter ok|CORRUPT", as gpu_counter.py does) every tick.
#   main (STATE.0): 1 GiB of device data, checked each tick; starts the watcher first.
#   watcher (STATE.1): no CUDA until its parent's /dev/nvidia* descriptors fall below half of what
#   they were once the parent was ready (the driver lets go of them as it checkpoints the process);
#   then a context and 64 MiB of device data of its own, checked each tick.
import os
import subprocess
import sys
import time

import torch

state_prefix = os.environ.get("STATE", "/tmp/state")
role = os.environ.get("ROLE", "main")
token = os.urandom(8).hex()


def nvidia_fds(pid: int) -> int:
    count = 0
    for entry in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{entry}").startswith("/dev/nvidia")
        except OSError:
            pass
    return count


def write_state(rank: int, counter: int, intact: bool) -> None:
    path = f"{state_prefix}.{rank}"
    with open(path + ".new", "w") as state:
        state.write(f"{token} {counter} {'ok' if intact else 'CORRUPT'}\n")
    os.replace(path + ".new", path)


if role == "watcher":
    parent = os.getppid()
    counter, data, expected = 0, None, 0
    while not os.path.exists(f"{state_prefix}.ready"):
        time.sleep(0.05)
    baseline = nvidia_fds(parent)
    while True:
        counter += 1
        if data is None and nvidia_fds(parent) < baseline / 2:
            data = torch.arange(16 << 20, dtype=torch.int32, device="cuda")  # a context, device memory
            expected = int(data.sum(dtype=torch.int64))
            open(f"{state_prefix}.watcher-cuda", "w").close()
        intact = data is None or int(data.sum(dtype=torch.int64)) == expected
        write_state(1, counter, intact)
        time.sleep(0.01 if data is None else 0.1)

watcher = subprocess.Popen([sys.executable, __file__], env=dict(os.environ, ROLE="watcher"))
chunk = torch.randint(0, 1 << 30, (256 << 20,), dtype=torch.int32, device="cuda")
expected = int(chunk.sum(dtype=torch.int64))
torch.cuda.synchronize()
open(f"{state_prefix}.ready", "w").close()
counter = 0
while True:
    counter += 1
    write_state(0, counter, int(chunk.sum(dtype=torch.int64)) == expected)
    time.sleep(0.1)
