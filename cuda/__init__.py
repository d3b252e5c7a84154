"""The CUDA driver binding and the GPU checkpoint engine."""
