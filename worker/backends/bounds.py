"""What bounds one instance, whatever runtime runs it: memory, processes, its temp folders (pure).

Both runtimes apply the same numbers: the process runtime through the instance's cgroups and
private tmpfs mounts (``worker.cgroups``, ``worker.sandbox``), the docker runtime through the
container's memory, pids and tmpfs options (``worker.backends.docker``).

``resources.memory`` is the function's own memory; the hard limit adds what the runtime itself
takes (the interpreter and its libraries: torch alone is about 220 MiB resident), and on a GPU
what a CUDA context holds in host memory. /tmp and /dev/shm are tmpfs sized at the limit: their
pages are charged to the instance's memory, so together they can never take more than it.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
RUNTIME_MEMORY = 256 * MIB          # DILU_INSTANCE_RUNTIME_MEMORY's default
CUDA_CONTEXT_MEMORY = 2048 * MIB    # host memory of a CUDA context and its libraries, on a real GPU
PIDS = 1024                         # DILU_INSTANCE_PIDS's default: processes and threads together


@dataclass(frozen=True)
class InstanceBounds:
    memory_bytes: int        # the hard limit: past it the kernel kills the instance
    pids: int                # processes and threads at once
    tmpfs_bytes: int         # the size of its /tmp and of its /dev/shm

    def describe_oom(self, spec_memory: int) -> str:
        """The error an instance killed at its memory limit reports."""
        return (f"out of memory: the instance passed its memory limit of {_mib(self.memory_bytes)} "
                f"(resources.memory {_mib(spec_memory)} plus {_mib(self.memory_bytes - spec_memory)} for the "
                "runtime); raise resources.memory")


def bounds_for(memory_bytes: int, *, real_gpu: bool = False, runtime_memory: int = RUNTIME_MEMORY,
               pids: int = PIDS) -> InstanceBounds:
    """The bounds of an instance whose spec asks ``memory_bytes`` (pure)."""
    limit = memory_bytes + runtime_memory + (CUDA_CONTEXT_MEMORY if real_gpu else 0)
    return InstanceBounds(memory_bytes=limit, pids=pids, tmpfs_bytes=limit)


def _mib(value: int) -> str:
    return f"{value / MIB:.0f} MiB"
