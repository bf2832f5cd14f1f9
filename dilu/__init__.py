"""Dilu: serverless deep-learning functions on GPUs with introspective elasticity."""

from dilu.handler import Handler, InputError, Last, report_progress, weights

__all__ = ["Handler", "InputError", "Last", "report_progress", "weights"]
__version__ = "0.1.0"
