"""Device discovery: all NVML (pynvml) calls live here. No GPU or no driver: one CPU device."""

from __future__ import annotations

import logging
import os
import socket

from dilu.messages import DeviceInfo

log = logging.getLogger(__name__)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_device() -> DeviceInfo:
    return DeviceInfo(kind="cpu", uuid=None, name=f"cpu x{os.cpu_count()}", memory_bytes=host_memory_bytes())


def discover_gpus() -> list[DeviceInfo]:
    """Every NVIDIA GPU NVML reports, keyed by UUID; empty when NVML or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.info("no NVIDIA GPU available (%s); using the CPU", exc)
        return []
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            devices.append(DeviceInfo(kind="gpu", uuid=_text(uuid), name=_text(name),
                                      memory_bytes=int(memory), index=index))
        return devices
    finally:
        pynvml.nvmlShutdown()


def fake_gpus(count: int) -> list[DeviceInfo]:
    """Simulated GPUs: the real shim in front of shim/'s fake driver."""
    return [DeviceInfo(kind="gpu", uuid=f"GPU-fake-{index}", name="Dilu fake GPU", memory_bytes=16 * 2**30,
                       index=index, fake=True) for index in range(count)]


def discover_devices(gpus: str | None = None, fake: int = 0) -> list[DeviceInfo]:
    """One device per GPU, or the CPU where there is none; ``fake`` simulated GPUs are added
    beside either (a host without a GPU keeps its CPU worker for the functions that run there).
    ``gpus='none'`` ignores real GPUs."""
    real = [] if gpus == "none" else discover_gpus()
    return (real or [cpu_device()]) + fake_gpus(fake)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def worker_id(device: DeviceInfo, name: str | None = None) -> str:
    """The worker agent's id: the host's name (or ``name``) and the device it drives."""
    host = name or socket.gethostname()
    if device.kind != "gpu":
        return f"{host}-cpu"
    return f"{host}-{'fakegpu' if device.fake else 'gpu'}{device.index}"
