"""Runtime backends: how a worker starts, watches and stops instances (`process`: child processes)."""

from worker.backends.base import RunningInstance, RuntimeBackend

__all__ = ["RunningInstance", "RuntimeBackend"]
