"""The GPU scheduler: a pipeline of filter and score plugins over an immutable cluster snapshot."""

from dilu.policy.scheduler.framework import ClusterSnapshot, Device, Placement, PlacementRequest, Scheduler
from dilu.policy.scheduler.profiles import PROFILES, create_scheduler

__all__ = ["PROFILES", "ClusterSnapshot", "Device", "Placement", "PlacementRequest", "Scheduler", "create_scheduler"]
