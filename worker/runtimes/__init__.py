"""Runtime backends: how an instance is started and stopped (process now; docker later)."""

from worker.runtimes.base import RunningInstance, RuntimeBackend

__all__ = ["RunningInstance", "RuntimeBackend"]
