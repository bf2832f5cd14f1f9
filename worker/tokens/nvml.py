"""Measured device time per process, from NVML (what closes the token manager's loop).

``nvmlDeviceGetProcessUtilization`` reports, per process with work on the GPU, the share of each
sampling period its kernels ran (``smUtil``, whole percent); the driver samples every few tens
to hundreds of milliseconds depending on the GPU, so the manager reads it at most every
``CALIBRATE_EVERY_S`` and averages what came since the last read. On a simulated GPU a fake
``libnvidia-ml.so.1`` reports the fake device clock the same way.
"""

from __future__ import annotations

import logging
from collections import defaultdict

log = logging.getLogger(__name__)


class NvmlDeviceTime:
    """Per-process shares of one GPU's time since the previous call."""

    def __init__(self, gpu_uuid: str) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except pynvml.NVMLError:
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self._last_seen = 0

    def busy_shares(self) -> dict[int, float]:
        """{pid: share of the device (0-1)} over the samples since the last call."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(self._handle, self._last_seen)
        except self._nvml.NVMLError as exc:
            if "Not Found" not in str(exc):
                log.debug("no per-process utilisation: %s", exc)
            return {}
        per_pid: dict[int, list[float]] = defaultdict(list)
        for sample in samples:
            per_pid[int(sample.pid)].append(sample.smUtil / 100.0)
            self._last_seen = max(self._last_seen, int(sample.timeStamp))
        return {pid: sum(values) / len(values) for pid, values in per_pid.items()}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


def open_device_time(gpu_uuid: str) -> NvmlDeviceTime | None:
    """NVML for ``gpu_uuid``, or None (logged) where the library or the call is missing: the
    manager then runs open-loop on its calibrated capacity."""
    try:
        return NvmlDeviceTime(gpu_uuid)
    except Exception as exc:  # noqa: BLE001 - no NVML is a supported configuration
        log.warning("no NVML for %s (%s): token shares follow the calibrated capacity, open-loop", gpu_uuid, exc)
        return None
