"""Ephemeral state and events: one interface, an in-process and a Redis implementation."""

from dilu.state.base import Channel, StateStore

__all__ = ["Channel", "StateStore"]
