# A CUDA workload without PyTorch: the driver API through ctypes only (libcuda.so.1 found through the ld cache,
# which in CDI mode only the spec's update-ldcache hook makes), a PTX kernel JIT-compiled by the driver
# (libnvidia-ptxjitcompiler, another file the spec mounts), pinned host memory. GIB GiB of device memory hold
# known bytes; each tick the kernel adds one to a device counter, one 64 MiB chunk is read back and compared, and
# STATE.0 is rewritten as "token counter ok|CORRUPT" (the format gpu_counter.py writes, which the harness reads).
import ctypes
import os
import time

CHUNK = 64 << 20
PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry bump(.param .u64 counter)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [counter];
    cvta.to.global.u64 %rd2, %rd1;
    ld.global.u32 %r1, [%rd2];
    add.s32 %r2, %r1, 1;
    st.global.u32 [%rd2], %r2;
    ret;
}
"""

cuda = ctypes.CDLL("libcuda.so.1")


def check(result: int, what: str) -> None:
    if result != 0:
        raise SystemExit(f"driver_counter: {what} failed: CUDA error {result}")


check(cuda.cuInit(0), "cuInit")
device, context = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
module, kernel = ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData (PTX JIT)")
check(cuda.cuModuleGetFunction(ctypes.byref(kernel), module, b"bump"), "cuModuleGetFunction")
stream = ctypes.c_void_p()
check(cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")

chunks = max(1, int(float(os.environ.get("GIB", "1")) * (1 << 30)) // CHUNK)
data, counter_dev = ctypes.c_uint64(), ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(data), ctypes.c_size_t(chunks * CHUNK)), "cuMemAlloc (data)")
check(cuda.cuMemAlloc_v2(ctypes.byref(counter_dev), ctypes.c_size_t(4)), "cuMemAlloc (counter)")
check(cuda.cuMemsetD32_v2(counter_dev, 0, ctypes.c_size_t(1)), "cuMemsetD32")
pinned, readback = ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuMemAllocHost_v2(ctypes.byref(pinned), ctypes.c_size_t(CHUNK)), "cuMemAllocHost")
check(cuda.cuMemAllocHost_v2(ctypes.byref(readback), ctypes.c_size_t(CHUNK)), "cuMemAllocHost")
expected = os.urandom(1 << 20) * (CHUNK >> 20)
ctypes.memmove(pinned, expected, CHUNK)
for index in range(chunks):
    check(cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(data.value + index * CHUNK), pinned, ctypes.c_size_t(CHUNK)),
          "cuMemcpyHtoD")

argument = ctypes.c_uint64(counter_dev.value)
parameters = (ctypes.c_void_p * 1)(ctypes.addressof(argument))
device_count = ctypes.c_uint32()
state_prefix = os.environ.get("STATE", "/tmp/state")
token, counter, intact = os.urandom(8).hex(), 0, True
while True:
    counter += 1
    check(cuda.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream, parameters, None), "cuLaunchKernel")
    index = counter % chunks
    check(cuda.cuMemcpyDtoHAsync_v2(readback, ctypes.c_uint64(data.value + index * CHUNK), ctypes.c_size_t(CHUNK),
                                    stream), "cuMemcpyDtoHAsync")
    check(cuda.cuMemcpyDtoHAsync_v2(ctypes.byref(device_count), counter_dev, ctypes.c_size_t(4), stream),
          "cuMemcpyDtoHAsync")
    check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
    intact = intact and device_count.value == counter and ctypes.string_at(readback, CHUNK) == expected
    path = f"{state_prefix}.0"
    with open(path + ".new", "w") as state:
        state.write(f"{token} {counter} {'ok' if intact else 'CORRUPT'}\n")
    os.replace(path + ".new", path)
    time.sleep(0.1)
