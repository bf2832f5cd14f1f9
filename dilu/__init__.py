"""Dilu: serverless deep-learning functions on GPUs with introspective elasticity."""

from dilu.handler import Handler, InputError

__all__ = ["Handler", "InputError"]
__version__ = "0.1.0"
