"""The binding of libcuda.so.1's process checkpoint API: lock, checkpoint, restore, unlock.

The only module of gpuckpt that uses ctypes; everything else talks to `CudaDriver`.
"""

from __future__ import annotations

import ctypes
import enum
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DriverError

LIBCUDA = "libcuda.so.1"

# cuDriverGetVersion's encoding: 1000 * major + 10 * minor.
# The cuCheckpointProcess* driver API first appears in cuda.h 12.8 (driver branch r570;
# r550 had only NVIDIA's cuda-checkpoint tool). gpuPairs in CUcheckpointRestoreArgs and
# CUcheckpointGpuPair first appear in cuda.h 13.0 (r580); 12.8/12.9 drivers see those
# bytes as reserved and must get them zeroed.
CHECKPOINT_API_MIN_VERSION = 12080
CHECKPOINT_API_MIN_BRANCH = 570
GPU_REMAP_MIN_VERSION = 13000
GPU_REMAP_MIN_BRANCH = 580

CUDA_SUCCESS = 0
CUDA_ERROR_TIMEOUT = "CUDA_ERROR_TIMEOUT"

# The API's own names for our methods, for messages and the fake driver.
FUNCTION_NAMES = {
    "lock": "cuCheckpointProcessLock",
    "checkpoint": "cuCheckpointProcessCheckpoint",
    "restore": "cuCheckpointProcessRestore",
    "unlock": "cuCheckpointProcessUnlock",
    "state": "cuCheckpointProcessGetState",
}
REQUIRED_SYMBOLS = ("cuDriverGetVersion", "cuInit", "cuGetErrorName", *FUNCTION_NAMES.values())


class ProcessState(enum.IntEnum):
    """CUprocessState: where a process is in the checkpoint cycle."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


class LockTimeout(DriverError):
    """cuCheckpointProcessLock gave up: the process did not reach a lockable point in time."""


def version_text(version: int) -> str:
    """12080 -> "12.8", as cuDriverGetVersion encodes it."""
    return f"{version // 1000}.{version % 1000 // 10}"


def call_error(method: str, pid: int, cuda_error: str, timeout_ms: int | None = None) -> DriverError:
    """The error a failed per-process call raises (the real and the fake driver share it)."""
    message = f"{FUNCTION_NAMES[method]}(pid {pid}) failed: {cuda_error}"
    if method == "lock" and cuda_error == CUDA_ERROR_TIMEOUT:
        if timeout_ms is not None:
            message += f" after {timeout_ms} ms"
        return LockTimeout(message, cuda_error)
    return DriverError(message, cuda_error)


def remap_unsupported(pid: int, version: int) -> DriverError:
    """A restore with GPU pairs on a driver whose CUcheckpointRestoreArgs has no gpuPairs yet."""
    return DriverError(f"{FUNCTION_NAMES['restore']}(pid {pid}): moving a process to other GPUs needs driver >= "
                       f"{GPU_REMAP_MIN_BRANCH} (CUDA {version_text(GPU_REMAP_MIN_VERSION)}); "
                       f"this driver is CUDA {version_text(version)}")


# nvidia-smi's form of a GPU UUID: the 16 bytes of CUuuid in order, as 8-4-4-4-12 hex digits.
GPU_UUID = re.compile(r"GPU-([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})",
                      re.IGNORECASE)


def uuid_bytes(uuid: str) -> bytes:
    """The 16 bytes of CUuuid for "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"."""
    match = GPU_UUID.fullmatch(uuid)
    if match is None:
        raise DriverError(f"malformed GPU UUID {uuid!r}: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx "
                          "(hex digits, as nvidia-smi -L prints it)")
    return bytes.fromhex("".join(match.groups()))


@dataclass(frozen=True)
class GpuPair:
    """Restore onto `new_uuid` what was checkpointed on `old_uuid` (nvidia-smi UUIDs)."""

    old_uuid: str
    new_uuid: str

    def __post_init__(self) -> None:
        uuid_bytes(self.old_uuid)  # refuse a malformed UUID when the pair is made, not mid-restore
        uuid_bytes(self.new_uuid)


# The argument structs, byte for byte as cuda.h 13.0 declares them. Every one is 64 bytes
# in every release so far; fields added later take reserved bytes that must stay zero.
class CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


class CUcheckpointGpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", CUuuid), ("newUuid", CUuuid)]


class CUcheckpointLockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),  # 0 waits forever
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class CUcheckpointCheckpointArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CUcheckpointRestoreArgs(ctypes.Structure):
    _fields_ = [
        ("gpuPairs", ctypes.POINTER(CUcheckpointGpuPair)),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
        ("reserved1", ctypes.c_uint64),
    ]


class CUcheckpointUnlockArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


def gpu_pair_array(gpu_pairs: Sequence[GpuPair]) -> ctypes.Array[CUcheckpointGpuPair]:
    """The CUcheckpointGpuPair array a restore points at."""
    array = (CUcheckpointGpuPair * len(gpu_pairs))()
    for slot, pair in zip(array, gpu_pairs, strict=True):
        slot.oldUuid.bytes[:] = uuid_bytes(pair.old_uuid)
        slot.newUuid.bytes[:] = uuid_bytes(pair.new_uuid)
    return array


def load_library(path: str = LIBCUDA) -> Any:
    """The CUDA driver library, opened now (never at import: most shim runs need no GPU)."""
    try:
        return ctypes.CDLL(path)
    except OSError:
        raise DriverError(f"{path} not found: is the NVIDIA driver installed?") from None


class CudaDriver(ABC):
    """The checkpoint operations on a CUDA process, by its host PID; the seam tests replace."""

    @abstractmethod
    def driver_version(self) -> int:
        """The CUDA version the driver supports, as cuDriverGetVersion encodes it (13000)."""

    @abstractmethod
    def init(self) -> None:
        """cuInit(0) in this process, once; a restore needs it (or persistence mode)."""

    @abstractmethod
    def lock(self, pid: int, timeout_ms: int) -> None:
        """Block the process's further CUDA calls; LockTimeout if not done within timeout_ms (0: wait)."""

    @abstractmethod
    def checkpoint(self, pid: int) -> None:
        """Copy a locked process's device memory into its host memory and release its GPUs."""

    @abstractmethod
    def restore(self, pid: int, gpu_pairs: Sequence[GpuPair] = ()) -> None:
        """Put a checkpointed process back on its GPUs (or the new ones of `gpu_pairs`); it stays locked."""

    @abstractmethod
    def unlock(self, pid: int) -> None:
        """Let a locked process make CUDA calls again."""

    @abstractmethod
    def state(self, pid: int) -> ProcessState:
        """Where the process is in the checkpoint cycle."""


class LibCudaDriver(CudaDriver):
    """The driver itself, through libcuda.so.1.

    `library` is any object with the driver's functions as attributes (a ctypes.CDLL
    by default); tests pass a fake one.
    """

    def __init__(self, library: Any = None) -> None:
        self._lib = library if library is not None else load_library()
        missing = [name for name in REQUIRED_SYMBOLS if not hasattr(self._lib, name)]
        if "cuDriverGetVersion" in missing:
            raise DriverError(f"{LIBCUDA} lacks cuDriverGetVersion: is it an NVIDIA CUDA driver library?")
        self._version = self._read_version()
        needed = f"driver >= {CHECKPOINT_API_MIN_BRANCH} (CUDA {version_text(CHECKPOINT_API_MIN_VERSION)}) needed"
        if missing:
            raise DriverError(f"driver {version_text(self._version)} lacks {missing[0]}: {needed}")
        if self._version < CHECKPOINT_API_MIN_VERSION:
            raise DriverError(f"driver {version_text(self._version)} has no process checkpoint API: {needed}")
        self._declare()
        self._initialized = False

    def _read_version(self) -> int:
        version = ctypes.c_int(0)
        result = self._lib.cuDriverGetVersion(ctypes.pointer(version))
        if result != CUDA_SUCCESS:
            name = self._error_name(result)
            raise DriverError(f"cuDriverGetVersion failed: {name}", name)
        return version.value

    def _declare(self) -> None:
        """Give each function its C signature, so ctypes converts and checks the arguments."""
        int_p = ctypes.POINTER(ctypes.c_int)
        signatures = {
            "cuDriverGetVersion": [int_p],
            "cuInit": [ctypes.c_uint],
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuCheckpointProcessLock": [ctypes.c_int, ctypes.POINTER(CUcheckpointLockArgs)],
            "cuCheckpointProcessCheckpoint": [ctypes.c_int, ctypes.POINTER(CUcheckpointCheckpointArgs)],
            "cuCheckpointProcessRestore": [ctypes.c_int, ctypes.POINTER(CUcheckpointRestoreArgs)],
            "cuCheckpointProcessUnlock": [ctypes.c_int, ctypes.POINTER(CUcheckpointUnlockArgs)],
            "cuCheckpointProcessGetState": [ctypes.c_int, int_p],  # CUprocessState is a C enum
        }
        for name, argtypes in signatures.items():
            function = getattr(self._lib, name)
            function.argtypes = argtypes
            function.restype = ctypes.c_int  # CUresult

    def _error_name(self, result: int) -> str:
        name = ctypes.c_char_p()
        get_error_name = getattr(self._lib, "cuGetErrorName", None)
        if get_error_name is None or get_error_name(result, ctypes.pointer(name)) != CUDA_SUCCESS or not name.value:
            return f"CUDA error {result}"  # a code this driver has no name for
        return name.value.decode("ascii", "replace")

    def _call(self, method: str, pid: int, argument: Any, timeout_ms: int | None = None) -> None:
        result = getattr(self._lib, FUNCTION_NAMES[method])(pid, argument)
        if result != CUDA_SUCCESS:
            raise call_error(method, pid, self._error_name(result), timeout_ms)

    def driver_version(self) -> int:
        return self._version

    def init(self) -> None:
        if self._initialized:
            return
        # cuInit is itself idempotent and thread-safe: two threads racing here do no harm.
        result = self._lib.cuInit(0)
        if result != CUDA_SUCCESS:
            name = self._error_name(result)
            raise DriverError(f"cuInit(0) failed: {name}", name)
        self._initialized = True

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = CUcheckpointLockArgs(timeoutMs=timeout_ms)
        self._call("lock", pid, ctypes.pointer(args), timeout_ms)

    def checkpoint(self, pid: int) -> None:
        self._call("checkpoint", pid, ctypes.pointer(CUcheckpointCheckpointArgs()))

    def restore(self, pid: int, gpu_pairs: Sequence[GpuPair] = ()) -> None:
        args = CUcheckpointRestoreArgs()
        if gpu_pairs:
            if self._version < GPU_REMAP_MIN_VERSION:
                raise remap_unsupported(pid, self._version)
            array = gpu_pair_array(gpu_pairs)  # kept alive by this frame for the call
            args.gpuPairs = ctypes.cast(array, ctypes.POINTER(CUcheckpointGpuPair))
            args.gpuPairsCount = len(gpu_pairs)
        self._call("restore", pid, ctypes.pointer(args))

    def unlock(self, pid: int) -> None:
        self._call("unlock", pid, ctypes.pointer(CUcheckpointUnlockArgs()))

    def state(self, pid: int) -> ProcessState:
        value = ctypes.c_int(-1)
        self._call("state", pid, ctypes.pointer(value))
        try:
            return ProcessState(value.value)
        except ValueError:
            raise DriverError(f"{FUNCTION_NAMES['state']}(pid {pid}) returned unknown state {value.value}") from None


def load_driver() -> CudaDriver:
    """The node's CUDA driver: the one place shipped code gets one."""
    return LibCudaDriver()
