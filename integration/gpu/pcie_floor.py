"""The host<->device copy floor of this GPU machine: what the driver's checkpoint (device to the
process's fresh anonymous memory) and restore (that memory back to the device) cannot beat.

Copies of SIZE_GIB (default 2) GiB with CUDA's own copies, each timed after a warm-up of the same
kind: pinned host memory (the bus's own rate), pageable memory already touched, and pageable memory
never touched (every page faulted in by the copy, as the driver's host copy is), the last two with
transparent hugepages as the node has them and as `always` (what gpuckpt sets while GPU state moves;
put back after). Prints one JSON object.
Usage (root, on the GPU machine, the torch interpreter): python3 pcie_floor.py [SIZE_GIB]
"""

import json
import sys
import time
from pathlib import Path

import torch

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def timed(copy) -> float:
    torch.cuda.synchronize()
    started = time.monotonic()
    copy()
    torch.cuda.synchronize()
    return time.monotonic() - started


def rates(size: int, device: torch.Tensor) -> dict[str, float]:
    """GB/s of each kind of copy, the better of two runs."""
    gb = size / 1e9
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    touched = torch.ones(size, dtype=torch.uint8)
    found: dict[str, float] = {}
    for _ in range(2):
        for name, copy in (("pinned_h2d", lambda: device.copy_(pinned, non_blocking=True)),
                           ("pinned_d2h", lambda: pinned.copy_(device, non_blocking=True)),
                           ("pageable_touched_h2d", lambda: device.copy_(touched)),
                           ("pageable_touched_d2h", lambda: touched.copy_(device))):
            found[name] = max(found.get(name, 0.0), round(gb / timed(copy), 2))
        # memory never touched (its allocation is an mmap): the copy faults every page in
        fresh_s = timed(lambda: torch.empty(size, dtype=torch.uint8).copy_(device))
        found["pageable_fresh_d2h"] = max(found.get("pageable_fresh_d2h", 0.0), round(gb / fresh_s, 2))
    return found


def main() -> None:
    size = int(float(sys.argv[1] if len(sys.argv) > 1 else 2) * (1 << 30))
    device = torch.ones(size, dtype=torch.uint8, device="cuda")
    node_thp = THP.read_text().split("[")[1].split("]")[0]
    result = {"gpu": torch.cuda.get_device_name(), "bytes": size, "thp_node": node_thp,
              "gb_per_s": {node_thp: rates(size, device)}}
    if node_thp != "always":
        THP.write_text("always")
        try:
            result["gb_per_s"]["always"] = rates(size, device)
        finally:
            THP.write_text(node_thp)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
