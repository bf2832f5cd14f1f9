"""How an instance process treats the memory a request frees: it keeps it in its heap.

A model's forward pass allocates and frees the same large buffers on every call (activations,
convolution workspaces: megabytes each). glibc's malloc hands big blocks back to the kernel
(``munmap`` above the mmap threshold, trimming the top of the heap above the trim threshold), so
the next call gets fresh pages and pays a page fault for each 4 KiB of them. Measured on two
cores with a small convolutional model: 6-16 thousand minor faults per call, a fifth of its run
time, on every call, and worst on a young instance (a pre-warmed workflow node, a fresh
scale-out). Raising both thresholds keeps the blocks for reuse: no faults after the first call.
Model servers commonly swap in jemalloc or tcmalloc for the same reason; the tunables need
nothing installed.

The memory held this way is what the instance's own peak already used, so it stays within the
limit the instance was given. A function that sets its own allocator tuning (``GLIBC_TUNABLES``
or any ``MALLOC_*`` variable in its env) keeps it and gets none of ours; both are read when the
process starts, so such an instance starts fresh instead of from a spare
(``worker.backends.spares.EXEC_TIME_PREFIXES``).
"""

from __future__ import annotations

MIB = 1 << 20
MMAP_THRESHOLD = 32 * MIB      # blocks below this come from the heap (glibc's own dynamic maximum)
TRIM_THRESHOLD = 1024 * MIB    # free memory at the heap's top is returned only above this
TUNABLES = f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"


def tunes_its_own_allocator(env: dict[str, str]) -> bool:
    """Whether ``env`` already says how malloc should behave (pure)."""
    return any(name == "GLIBC_TUNABLES" or name.startswith("MALLOC_") for name in env)


def keeping_freed_memory(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the heap tunables added, unless it tunes the allocator itself (pure)."""
    if tunes_its_own_allocator(env):
        return dict(env)
    return {**env, "GLIBC_TUNABLES": TUNABLES}
