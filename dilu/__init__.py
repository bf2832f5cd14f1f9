"""Dilu: serverless deep-learning functions on GPUs with introspective elasticity."""

from dilu.handler import Handler

__all__ = ["Handler"]
__version__ = "0.1.0"
