"""Dilu: serverless deep-learning functions on GPUs with introspective elasticity."""

from dilu.handler import Handler, InputError, report_progress

__all__ = ["Handler", "InputError", "report_progress"]
__version__ = "0.1.0"
