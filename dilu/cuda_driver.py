"""A thin ctypes binding to the CUDA driver API (all of Dilu's own driver calls live here).

It reaches entry points the way the CUDA runtime does (``cuGetProcAddress_v2``), so under the
kernel-token shim every launch is gated exactly as PyTorch's would be. With the fake
``libcuda.so.1`` from ``shim/`` it runs on machines without a GPU; the fake's counters
(``device_ns``, ``launch_count``, ``ptsz_calls``, ``peak_outstanding_ns``) are exposed when present.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
LEGACY_STREAM, PER_THREAD_STREAM = 1, 2

_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_void_p)
_GPA2 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                         ctypes.c_uint64, ctypes.POINTER(ctypes.c_int))


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} failed with CUresult {code}")
        self.code = code


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


@dataclass(frozen=True)
class ProcAddress:
    pointer: int
    library: str


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_of(pointer: int) -> str:
    """The file a function pointer lives in (dladdr)."""
    info = _DlInfo()
    libc = ctypes.CDLL(None)
    if libc.dladdr(ctypes.c_void_p(pointer), ctypes.byref(info)) == 0 or not info.dli_fname:
        return "?"
    return info.dli_fname.decode()


class CudaDriver:
    def __init__(self, library: str = "libcuda.so.1") -> None:
        self.lib = ctypes.CDLL(library)
        raw = ctypes.cast(self.lib.cuGetProcAddress_v2, ctypes.c_void_p).value
        self._gpa = _GPA2(raw)
        self._check("cuInit", self.fn("cuInit", 2000, ctypes.c_int, ctypes.c_uint)(0))
        self.kernel = ctypes.c_void_p(id(self) | 1)  # any non-NULL handle names a kernel on the fake
        self._launch = _LAUNCH(self.proc_address("cuLaunchKernel", 12000).pointer)
        self._sync = self.fn("cuCtxSynchronize", 2000, ctypes.c_int)

    @staticmethod
    def _check(call: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            raise CudaError(call, code)

    def proc_address(self, symbol: str, version: int, flags: int = LEGACY_STREAM) -> ProcAddress:
        """What cuGetProcAddress_v2 returns for (symbol, version, flags), and where it lives."""
        pointer, status = ctypes.c_void_p(), ctypes.c_int()
        self._check(f"cuGetProcAddress({symbol})",
                    self._gpa(symbol.encode(), ctypes.byref(pointer), version, flags, ctypes.byref(status)))
        return ProcAddress(pointer.value, library_of(pointer.value))

    def fn(self, symbol: str, version: int, restype: Any, *argtypes: Any, flags: int = LEGACY_STREAM) -> Any:
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.proc_address(symbol, version, flags).pointer)

    # ---- work ----
    def launch(self, blocks: int, stream: int | None = None) -> None:
        self._check("cuLaunchKernel", self._launch(self.kernel, blocks, 1, 1, 128, 1, 1, 0, stream, None, None))

    def synchronize(self) -> None:
        self._check("cuCtxSynchronize", self._sync())

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        create = self.fn("cuStreamCreate", 2000, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint)
        self._check("cuStreamCreate", create(ctypes.byref(handle), 0))
        return handle.value

    def capture(self, stream: int, launches: list[int]) -> int:
        """Records ``launches`` (blocks each) on ``stream`` into a graph; returns the graph exec."""
        begin = self.fn("cuStreamBeginCapture", 10010, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
        end = self.fn("cuStreamEndCapture", 10000, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
        instantiate = self.fn("cuGraphInstantiate", 12000, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                              ctypes.c_void_p, ctypes.c_ulonglong)
        self._check("cuStreamBeginCapture", begin(stream, 0))
        for blocks in launches:
            self.launch(blocks, stream)
        graph, graph_exec = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuStreamEndCapture", end(stream, ctypes.byref(graph)))
        self._check("cuGraphInstantiate", instantiate(ctypes.byref(graph_exec), graph, 0))
        return graph_exec.value

    def graph_launch(self, graph_exec: int, stream: int | None = None) -> None:
        launch = self.fn("cuGraphLaunch", 10000, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        self._check("cuGraphLaunch", launch(graph_exec, stream))

    # ---- memory ----
    def mem_alloc(self, size: int) -> int:
        """A device pointer; raises CudaError (code 2) when the slice or the device is full."""
        pointer = ctypes.c_uint64()
        alloc = self.fn("cuMemAlloc", 3020, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
        self._check("cuMemAlloc", alloc(ctypes.byref(pointer), size))
        return pointer.value

    def mem_free(self, pointer: int) -> None:
        free = self.fn("cuMemFree", 3020, ctypes.c_int, ctypes.c_uint64)
        self._check("cuMemFree", free(pointer))

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        info = self.fn("cuMemGetInfo", 3020, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_size_t))
        self._check("cuMemGetInfo", info(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    # ---- the fake driver's counters ----
    def _counter(self, name: str) -> int:
        try:
            return ctypes.c_int64.in_dll(self.lib, name).value
        except ValueError:
            return -1

    @property
    def device_ns(self) -> int:
        return self._counter("dilu_fake_device_ns")

    @property
    def launch_count(self) -> int:
        return self._counter("dilu_fake_launch_count")

    @property
    def ptsz_calls(self) -> int:
        return self._counter("dilu_fake_ptsz_calls")

    @property
    def peak_outstanding_ns(self) -> int:
        """The most device time this process had launched and unfinished at once."""
        return self._counter("dilu_fake_peak_outstanding_ns")
