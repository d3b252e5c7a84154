"""An inference server for the cold-start vs restore benchmark (cold_vs_restore.py).

In a container: loads a model's weights from a safetensors file onto the GPU, captures its
forward pass in a CUDA graph (SERVER_MODE=graph, the default) or compiles it with
`torch.compile(mode="reduce-overhead")` (SERVER_MODE=compiled: inductor's kernels, replayed
as CUDA graphs; inductor's compile workers stay beside the server as they do in any server
that compiles), warms it up, then answers `GET /infer` on 127.0.0.1:PORT with the digest of
the output for a fixed input (deterministic: the same GPU gives the same bytes).
Prints its own phases (import, load, capture or compile) to stdout.
  python3 infer_server.py                  serve MODEL (env; default /models/model.safetensors)
  python3 infer_server.py --generate PATH  write a model of LAYERS x 4096 x 4096 bf16 weights
                                           (64: 2 GiB) and PATH.json with the eager answer
"""

import hashlib
import http.server
import json
import os
import sys
import time
from collections.abc import Callable

started = time.monotonic()
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

WIDTH, BATCH = 4096, 8
import_s = time.monotonic() - started


def stack_forward(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for weight in weights:
        x = torch.tanh(x @ weight)  # bounded: 64 layers neither vanish nor overflow in bf16
    return x


def answer(out: torch.Tensor) -> dict:
    values = out.float().cpu().flatten().tolist()
    return {"sha256": hashlib.sha256(repr(values).encode()).hexdigest(), "sum": sum(values),
            "abs_sum": sum(abs(value) for value in values)}


def generate(path: str) -> None:
    layers = int(os.environ.get("LAYERS", "64"))
    generator = torch.Generator(device="cuda").manual_seed(20261126)
    tensors = {f"layer{i}": (torch.randn(WIDTH, WIDTH, device="cuda", generator=generator) / WIDTH**0.5)
               .to(torch.bfloat16) for i in range(layers)}
    tensors["input"] = torch.randn(BATCH, WIDTH, device="cuda", generator=generator).to(torch.bfloat16)
    eager = answer(stack_forward([tensors[f"layer{i}"] for i in range(layers)], tensors["input"]))
    save_file({name: tensor.cpu() for name, tensor in tensors.items()}, path)
    with open(path + ".json", "w") as reference:
        json.dump({"eager": eager, "layers": layers, "bytes": os.path.getsize(path)}, reference)


def captured(weights: list[torch.Tensor], static_x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The forward pass captured in one CUDA graph by hand: replay, then read the static output."""
    side = torch.cuda.Stream()  # warm-up before capture on a side stream, as PyTorch's graph docs do
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            stack_forward(weights, static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = stack_forward(weights, static_x)

    def run() -> torch.Tensor:
        graph.replay()
        return static_out
    return run


class Stack(torch.nn.Module):
    """The layers as a module's buffers: what inductor's CUDA graphs keep in place (plain tensor
    arguments would be copied into the graph's own inputs on every call)."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.count = len(weights)
        for index, weight in enumerate(weights):
            self.register_buffer(f"layer{index}", weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stack_forward([getattr(self, f"layer{index}") for index in range(self.count)], x)


def compiled(weights: list[torch.Tensor], static_x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The forward pass through inductor with CUDA graphs (its own warm-up and recording on the first calls)."""
    model = torch.compile(Stack(weights), mode="reduce-overhead")

    def run() -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return model(static_x)
    return run


def serve(path: str, port: int, mode: str) -> None:
    mark = time.monotonic()
    tensors = load_file(path, device="cuda")
    weights = [tensors[f"layer{i}"] for i in range(len(tensors) - 1)]
    static_x = tensors["input"].clone()
    torch.cuda.synchronize()
    load_s = time.monotonic() - mark
    mark = time.monotonic()
    run = compiled(weights, static_x) if mode == "compiled" else captured(weights, static_x)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    capture_s = time.monotonic() - mark

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/infer":
                self.send_error(404)
                return
            body = json.dumps(answer(run())).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet: one line per request is noise
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    print(json.dumps({"mode": mode, "import_s": round(import_s, 3), "load_s": round(load_s, 3),
                      "capture_s": round(capture_s, 3),
                      "ready_s": round(time.monotonic() - started, 3),
                      "weights_bytes": sum(w.numel() * w.element_size() for w in weights)}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2])
    else:
        serve(os.environ.get("MODEL", "/models/model.safetensors"), int(os.environ.get("PORT", "8080")),
              os.environ.get("SERVER_MODE", "graph"))
