# The common PyTorch training loop: a DataLoader with worker processes feeding a CUDA model
# (deterministic: per-index seeded samples, fixed seeds), for the bit-exact checkpoint tests.
# Env: STEPS, STATE (rewritten with the step number), RESULT (final weights digest), PAUSE_AT
# (from that step on, sleep a little per step so the test can checkpoint mid-run), WORKERS,
# START_METHOD ("" = the platform default, fork; or "spawn"), PIN_MEMORY ("1"/"0"),
# COMPILE ("1": torch.compile the model; inductor starts its compile workers).
import hashlib
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(1024, generator=generator), torch.randn(1024, generator=generator)


def main() -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    steps = int(os.environ.get("STEPS", "300"))
    pause_at = int(os.environ.get("PAUSE_AT", "-1"))
    state_path = os.environ.get("STATE", "/tmp/train_state")
    # CUDA first, then the workers: forked children of an initialised CUDA process
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward = torch.compile(model) if os.environ.get("COMPILE") == "1" else model
    loader = DataLoader(Synthetic(), batch_size=256, num_workers=int(os.environ.get("WORKERS", "2")),
                        pin_memory=os.environ.get("PIN_MEMORY", "1") == "1",
                        multiprocessing_context=os.environ.get("START_METHOD") or None, persistent_workers=True)
    for step, (inputs, target) in enumerate(loader):
        if step == steps:
            break
        inputs, target = inputs.cuda(non_blocking=True), target.cuda(non_blocking=True)
        loss = torch.nn.functional.mse_loss(forward(inputs), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        with open(state_path, "w") as state:
            state.write(f"{step}\n")
        if step >= pause_at >= 0:
            time.sleep(0.05)
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().cpu().numpy().tobytes())
    with open(os.environ.get("RESULT", "/tmp/train_result"), "w") as result:
        result.write(digest.hexdigest() + "\n")


if __name__ == "__main__":  # spawned workers import this module again
    main()
