"""The CUDA driver binding without a GPU: struct layouts, UUIDs, error mapping through a fake
libcuda, the driver checks and NVML's errors."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from gpuckpt.cuda import devices
from gpuckpt.cuda.driver import (
    REQUIRED_SYMBOLS,
    CUcheckpointCheckpointArgs,
    CUcheckpointGpuPair,
    CUcheckpointLockArgs,
    CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs,
    CUuuid,
    GpuPair,
    LibCudaDriver,
    LockTimeout,
    ProcessState,
    load_library,
    uuid_bytes,
)
from gpuckpt.errors import DriverError

GPU0 = "GPU-8f6d2c1e-0b3a-4c5d-9e7f-112233445566"
GPU1 = "GPU-a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90"

# CUresult codes as cuda.h numbers them.
ERRORS = {1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 100: "CUDA_ERROR_NO_DEVICE",
          401: "CUDA_ERROR_ILLEGAL_STATE", 801: "CUDA_ERROR_NOT_SUPPORTED", 909: "CUDA_ERROR_TIMEOUT"}
ERROR_NAMES = {code: name.encode() for code, name in ERRORS.items()}  # kept alive: the fake hands out pointers


class FakeFunction:
    """A libcuda function: callable, and takes argtypes/restype like a ctypes function."""

    def __init__(self, lib: FakeLibCuda, name: str) -> None:
        self.lib, self.name = lib, name

    def __call__(self, *args):
        return self.lib.answer(self.name, args)


class FakeLibCuda:
    """Stands where ctypes.CDLL("libcuda.so.1") would; `results[symbol]` is the CUresult it returns."""

    def __init__(self, version: int = 13000, missing: tuple[str, ...] = (), results: dict[str, int] | None = None,
                 state: int = 0) -> None:
        self.version, self.results, self.state = version, dict(results or {}), state
        self.received: list[tuple[str, tuple]] = []
        for name in REQUIRED_SYMBOLS:
            if name not in missing:
                setattr(self, name, FakeFunction(self, name))

    def answer(self, name: str, args: tuple) -> int:
        self.received.append((name, args))
        if name == "cuGetErrorName":
            code, out = args
            if code not in ERROR_NAMES:
                return 1
            out.contents.value = ERROR_NAMES[code]
            return 0
        if name == "cuDriverGetVersion":
            args[0].contents.value = self.version
        elif name == "cuCheckpointProcessGetState":
            args[1].contents.value = self.state
        return self.results.get(name, 0)

    def calls(self, name: str) -> list[tuple]:
        return [args for called, args in self.received if called == name]


# -- struct layouts (cuda.h 13.0; LAB: restore args 64 bytes, a pair 32) -----------------

@pytest.mark.parametrize("struct, size", [
    (CUuuid, 16), (CUcheckpointGpuPair, 32), (CUcheckpointLockArgs, 64), (CUcheckpointCheckpointArgs, 64),
    (CUcheckpointRestoreArgs, 64), (CUcheckpointUnlockArgs, 64)])
def test_struct_sizes_match_cuda_h(struct, size):
    assert ctypes.sizeof(struct) == size


def test_field_offsets_match_cuda_h():
    assert (CUcheckpointLockArgs.timeoutMs.offset, CUcheckpointLockArgs.reserved0.offset,
            CUcheckpointLockArgs.reserved1.offset) == (0, 4, 8)
    assert (CUcheckpointRestoreArgs.gpuPairs.offset, CUcheckpointRestoreArgs.gpuPairsCount.offset,
            CUcheckpointRestoreArgs.reserved.offset, CUcheckpointRestoreArgs.reserved1.offset) == (0, 8, 12, 56)
    assert (CUcheckpointGpuPair.oldUuid.offset, CUcheckpointGpuPair.newUuid.offset) == (0, 16)


# -- UUIDs -------------------------------------------------------------------------------

def test_uuid_round_trip():
    raw = uuid_bytes(GPU0)
    assert raw == bytes.fromhex("8f6d2c1e0b3a4c5d9e7f112233445566")
    assert uuid_bytes("GPU-" + GPU0[4:].upper()) == raw


@pytest.mark.parametrize("text", [
    "", "GPU-", "8f6d2c1e-0b3a-4c5d-9e7f-112233445566", "MIG-8f6d2c1e-0b3a-4c5d-9e7f-112233445566",
    "GPU-8f6d2c1e-0b3a-4c5d-9e7f-1122334455", "GPU-8f6d2c1e-0b3a-4c5d-9e7f-11223344556g",
    "GPU-8f6d2c1e0b3a4c5d9e7f112233445566", GPU0 + "\n", " " + GPU0])
def test_malformed_uuids_are_refused(text):
    with pytest.raises(DriverError, match="malformed GPU UUID .*expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"):
        uuid_bytes(text)


def test_gpu_pair_refuses_a_malformed_uuid_when_made():
    with pytest.raises(DriverError, match="malformed GPU UUID 'GPU-1'"):
        GpuPair(GPU0, "GPU-1")


# -- LibCudaDriver through a fake libcuda --------------------------------------------------

def test_calls_pass_pid_and_args_and_read_results():
    lib = FakeLibCuda(state=2)
    driver = LibCudaDriver(lib)
    assert driver.driver_version() == 13000
    driver.lock(1234, 5000)
    driver.checkpoint(1234)
    driver.unlock(1234)
    assert driver.state(1234) is ProcessState.CHECKPOINTED
    (pid, args), = lib.calls("cuCheckpointProcessLock")
    assert pid == 1234 and args.contents.timeoutMs == 5000 and list(args.contents.reserved1) == [0] * 7
    assert lib.calls("cuCheckpointProcessCheckpoint")[0][0] == 1234


def test_every_function_gets_its_c_signature():
    lib = FakeLibCuda()
    LibCudaDriver(lib)
    for name in REQUIRED_SYMBOLS:
        assert getattr(lib, name).restype is ctypes.c_int
    assert lib.cuCheckpointProcessRestore.argtypes == [ctypes.c_int, ctypes.POINTER(CUcheckpointRestoreArgs)]


def test_a_failed_call_names_the_call_the_pid_and_the_error():
    driver = LibCudaDriver(FakeLibCuda(results={"cuCheckpointProcessCheckpoint": 2}))
    with pytest.raises(DriverError) as caught:
        driver.checkpoint(1234)
    assert str(caught.value) == "cuCheckpointProcessCheckpoint(pid 1234) failed: CUDA_ERROR_OUT_OF_MEMORY"
    assert caught.value.cuda_error == "CUDA_ERROR_OUT_OF_MEMORY"
    assert not isinstance(caught.value, LockTimeout)


def test_a_lock_timeout_is_a_lock_timeout():
    driver = LibCudaDriver(FakeLibCuda(results={"cuCheckpointProcessLock": 909}))
    with pytest.raises(LockTimeout) as caught:
        driver.lock(77, 500)
    assert str(caught.value) == "cuCheckpointProcessLock(pid 77) failed: CUDA_ERROR_TIMEOUT after 500 ms"
    assert caught.value.cuda_error == "CUDA_ERROR_TIMEOUT"


def test_an_illegal_state_from_lock_is_not_a_timeout():
    driver = LibCudaDriver(FakeLibCuda(results={"cuCheckpointProcessLock": 401}))
    with pytest.raises(
        DriverError, match=r"^cuCheckpointProcessLock\(pid 77\) failed: CUDA_ERROR_ILLEGAL_STATE$"
    ) as caught:
        driver.lock(77, 500)
    assert not isinstance(caught.value, LockTimeout)


def test_an_error_code_without_a_name_is_shown_by_number():
    driver = LibCudaDriver(FakeLibCuda(results={"cuCheckpointProcessUnlock": 12345}))
    with pytest.raises(DriverError, match=r"cuCheckpointProcessUnlock\(pid 5\) failed: CUDA error 12345$"):
        driver.unlock(5)


def test_an_unknown_state_is_an_error():
    with pytest.raises(DriverError, match=r"cuCheckpointProcessGetState\(pid 5\) returned unknown state 9"):
        LibCudaDriver(FakeLibCuda(state=9)).state(5)


def test_restore_without_pairs_passes_zeroed_args():
    lib = FakeLibCuda()
    LibCudaDriver(lib).restore(42)
    (pid, args), = lib.calls("cuCheckpointProcessRestore")
    assert pid == 42 and bytes(args.contents) == bytes(64)


def test_restore_with_pairs_passes_the_uuids():
    lib = FakeLibCuda()
    LibCudaDriver(lib).restore(42, [GpuPair(GPU0, GPU1), GpuPair(GPU1, GPU0)])
    (_, args), = lib.calls("cuCheckpointProcessRestore")
    restore_args = args.contents
    assert restore_args.gpuPairsCount == 2
    pairs = [(bytes(restore_args.gpuPairs[i].oldUuid.bytes), bytes(restore_args.gpuPairs[i].newUuid.bytes))
             for i in range(2)]
    assert pairs == [(uuid_bytes(GPU0), uuid_bytes(GPU1)), (uuid_bytes(GPU1), uuid_bytes(GPU0))]
    assert bytes(restore_args)[12:] == bytes(52)  # reserved bytes stay zero


def test_restore_with_pairs_needs_a_cuda_13_driver():
    lib = FakeLibCuda(version=12080)
    driver = LibCudaDriver(lib)
    with pytest.raises(DriverError, match=r"needs driver >= 580 \(CUDA 13.0\); this driver is CUDA 12.8"):
        driver.restore(42, [GpuPair(GPU0, GPU1)])
    assert lib.calls("cuCheckpointProcessRestore") == []
    driver.restore(42)  # in place, it works on 12.8
    assert len(lib.calls("cuCheckpointProcessRestore")) == 1


def test_init_calls_cuinit_once():
    lib = FakeLibCuda()
    driver = LibCudaDriver(lib)
    driver.init()
    driver.init()
    assert lib.calls("cuInit") == [(0,)]


def test_a_failed_cuinit_is_reported_and_retried_next_time():
    lib = FakeLibCuda(results={"cuInit": 100})
    driver = LibCudaDriver(lib)
    with pytest.raises(DriverError, match=r"^cuInit\(0\) failed: CUDA_ERROR_NO_DEVICE$"):
        driver.init()
    lib.results.clear()
    driver.init()
    assert len(lib.calls("cuInit")) == 2


def test_a_driver_without_the_checkpoint_api_is_refused():
    with pytest.raises(DriverError, match=r"^driver 12.2 lacks cuCheckpointProcessLock: driver >= 570 \(CUDA 12.8\) "
                                          r"needed$"):
        LibCudaDriver(FakeLibCuda(version=12020, missing=("cuCheckpointProcessLock", "cuCheckpointProcessUnlock")))


def test_a_driver_missing_one_function_is_refused():
    with pytest.raises(DriverError, match=r"^driver 13.0 lacks cuCheckpointProcessGetState"):
        LibCudaDriver(FakeLibCuda(missing=("cuCheckpointProcessGetState",)))


def test_an_old_driver_is_refused_even_with_the_symbols():
    with pytest.raises(DriverError, match=r"^driver 12.4 has no process checkpoint API: driver >= 570"):
        LibCudaDriver(FakeLibCuda(version=12040))


def test_a_library_without_cudrivergetversion_is_refused():
    with pytest.raises(DriverError, match="lacks cuDriverGetVersion"):
        LibCudaDriver(FakeLibCuda(missing=("cuDriverGetVersion",)))


def test_a_missing_library_is_named():
    with pytest.raises(DriverError, match=r"^libcuda-absent\.so\.1 not found: is the NVIDIA driver installed\?$"):
        load_library("libcuda-absent.so.1")


# -- NVML and /proc ------------------------------------------------------------------------

def test_nvml_failure_is_one_line():
    try:
        devices.list_gpus()
    except DriverError as error:
        assert str(error).startswith("cannot list the GPUs: ") and "\n" not in str(error)
    else:
        pytest.skip("NVML works on this machine")


# A process holding the files its arguments name: "open:PATH" keeps an fd, "map:PATH" only a mapping
# (libc's mmap: Python's mmap module keeps a duplicate fd of its file open).
HOLDER = """
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
for how, _, path in (arg.partition(":") for arg in sys.argv[1:]):
    fd = os.open(path, os.O_RDONLY)
    if how == "map":
        assert libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) != ctypes.c_void_p(-1).value
        os.close(fd)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder() -> Iterator[Callable[..., int]]:
    started: list[subprocess.Popen] = []

    def start(*held: str) -> int:
        child = subprocess.Popen([sys.executable, "-c", HOLDER, *held], stdout=subprocess.PIPE, text=True)
        started.append(child)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return child.pid
    yield start
    for child in started:
        child.kill()
        child.wait()


def test_processes_without_the_driver_are_not_found(tmp_path, monkeypatch, holder):
    nodes = tmp_path / "dev"  # stand-ins for the driver's /dev/nvidiactl and /dev/nvidia0
    nodes.mkdir()
    for name in ("nvidiactl", "nvidia0"):
        (nodes / name).write_bytes(b"\0" * 4096)
    devices_of_others = holder("open:/dev/null", "map:/dev/zero")  # "/dev/n...", but not the driver's
    opened = holder(f"open:{nodes}/nvidiactl")
    mapped = holder(f"map:{nodes}/nvidia0")
    gone = 2 ** 22 + 1  # above any pid_max
    pids = [os.getpid(), devices_of_others, opened, mapped, gone]
    assert devices.pids_holding_nvidia_devices(pids) == set()
    # the same processes, the stand-ins taken for the driver's nodes: the scan sees an fd and a mapping of them
    monkeypatch.setattr(devices, "NVIDIA_DEVICE_PREFIX", str(nodes / "nvidia"))
    assert devices.pids_holding_nvidia_devices(pids) == {opened, mapped}


@pytest.mark.hostile("a container process mapping a file named \"x /dev/nvidia0\" to pass for a driver holder")
def test_only_a_mapping_of_the_device_path_itself_holds_the_driver(tmp_path, monkeypatch):
    decoy = tmp_path / "x " / "dev" / "nvidia0"  # its maps line reads ".../x /dev/nvidia0"
    decoy.parent.mkdir(parents=True)
    decoy.write_bytes(b"\0" * 4096)
    with open(decoy, "rb") as held, mmap.mmap(held.fileno(), 4096, prot=mmap.PROT_READ):
        assert " /dev/nvidia0" in open(f"/proc/{os.getpid()}/maps").read()
        assert devices.pids_holding_nvidia_devices([os.getpid()]) == set()
        monkeypatch.setattr(devices, "NVIDIA_DEVICE_PREFIX", str(tmp_path / "x "))  # the path field itself: found
        assert devices.pids_holding_nvidia_devices([os.getpid()]) == {os.getpid()}
