# A deterministic PyTorch training loop (synthetic data, fixed seeds) for the bit-exact test.
# Env: STEPS, STATE (file rewritten with the step number), RESULT (final weights digest),
# PAUSE_AT (step at which to write STATE.ready and slow down so the test can checkpoint).
import hashlib
import os
import time

import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
steps = int(os.environ.get("STEPS", "400"))
pause_at = int(os.environ.get("PAUSE_AT", "-1"))
state_path = os.environ.get("STATE", "/tmp/train_state")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data_generator = torch.Generator(device="cuda").manual_seed(1)
for step in range(steps):
    inputs = torch.randn(512, 1024, device="cuda", generator=data_generator)
    target = torch.randn(512, 1024, device="cuda", generator=data_generator)
    loss = torch.nn.functional.mse_loss(model(inputs), target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    with open(state_path, "w") as state:
        state.write(f"{step}\n")
    if step >= pause_at >= 0:
        time.sleep(0.05)  # give the test time to checkpoint mid-run
digest = hashlib.sha256()
for parameter in model.parameters():
    digest.update(parameter.detach().cpu().numpy().tobytes())
with open(os.environ.get("RESULT", "/tmp/train_result"), "w") as result:
    result.write(digest.hexdigest() + "\n")
