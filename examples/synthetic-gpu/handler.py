"""Synthetic GPU functions that drive the CUDA driver API directly (through ctypes).

They exist to show vertical scaling end to end where no real model can run: on a worker with a
simulated GPU (DILU_FAKE_GPUS=1) every kernel goes through the real kernel-token shim to the
fake driver, whose device clock makes the compute share each instance gets measurable. On a real
GPU they do not work (their kernel handles are not real kernels); use a PyTorch model there.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from dilu import Handler
from dilu.cuda_driver import CudaDriver


class LatencyKernels(Handler):
    """Each request is a burst of kernels followed by a synchronise, like a forward pass."""

    def load(self) -> None:
        self.driver = CudaDriver()
        self.kernels = int(self.options.get("kernels", 40))
        self.blocks = int(self.options.get("blocks", 1000))
        self.lock = threading.Lock()

    def predict(self, inputs: list) -> list:
        results = []
        with self.lock:
            for _ in inputs:
                started = time.perf_counter()
                for _ in range(self.kernels):
                    self.driver.launch(self.blocks)
                self.driver.synchronize()
                results.append({"ms": round((time.perf_counter() - started) * 1000, 3), "kernels": self.kernels})
        return results


class TrainingLoop(Handler):
    """A batch job: a background loop of training-step kernels, reporting each synchronised group
    of steps with ``report_progress`` (the profiler's measure). A request answers with the share
    of device time it achieved over the last ``window_s`` seconds."""

    def load(self) -> None:
        self.driver = CudaDriver()
        self.blocks = int(self.options.get("blocks", 100))
        self.sync_every = int(self.options.get("sync_every", 50))
        self.window_s = float(self.options.get("window_s", 0.5))
        self.samples: deque[tuple[float, int]] = deque(maxlen=4096)
        self.steps = 0
        threading.Thread(target=self._train, name="training-loop", daemon=True).start()

    def _train(self) -> None:
        while True:
            self.driver.launch(self.blocks)
            self.steps += 1
            if self.steps % self.sync_every == 0:
                self.driver.synchronize()
                self.samples.append((time.monotonic(), self.driver.device_ns))
                self.report_progress(self.sync_every)

    def predict(self, inputs: list) -> list:
        now = time.monotonic()
        recent = [s for s in list(self.samples) if now - s[0] <= self.window_s]
        share = None
        if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
            share = (recent[-1][1] - recent[0][1]) / ((recent[-1][0] - recent[0][0]) * 1e9)
        return [{"share": None if share is None else round(share, 4), "steps": self.steps} for _ in inputs]
