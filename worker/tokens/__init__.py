"""The per-GPU token manager that feeds the kernel-token shim of every instance on that GPU."""
