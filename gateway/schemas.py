"""Request and response bodies of the public API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dilu.slices import MAX_SHARE, MIN_SHARE, ComputeSlice


class DeployRequest(BaseModel):
    """Either the YAML text (preferred: errors carry line numbers) or the decoded spec."""

    yaml: str | None = Field(None, description="model.yaml text")
    spec: dict[str, Any] | None = Field(None, description="The spec as JSON, instead of yaml")
    bundle: str | None = Field(None, description="The function's code: the digest of an uploaded bundle "
                                                 "(POST /v1/bundles; dilu deploy does both)")
    source_dir: str | None = Field(None, description="Instead of a bundle, on a local platform: the absolute "
                                                     "folder the handler module is resolved in")


class SliceUpdate(BaseModel):
    """A new compute slice for every instance of a function (vertical scaling)."""

    model_config = ConfigDict(allow_inf_nan=False)

    sm_request: float = Field(..., ge=MIN_SHARE, le=MAX_SHARE, description="Guaranteed compute share; at most sm_limit")
    sm_limit: float = Field(..., ge=MIN_SHARE, le=MAX_SHARE, description="Burst compute share")

    @model_validator(mode="after")
    def _request_within_limit(self) -> SliceUpdate:
        ComputeSlice.checked(self.sm_request, self.sm_limit)    # SliceError is a ValueError
        return self

    @property
    def compute(self) -> ComputeSlice:
        return ComputeSlice(self.sm_request, self.sm_limit)


class InstancePublic(BaseModel):
    id: str
    worker_id: str
    version: int
    state: str
    endpoint: str | None
    error: str | None
    created_at: datetime
    ready_at: datetime | None
    ended_at: datetime | None
    sm_request: float | None = None
    sm_limit: float | None = None
    role: str = Field("serve", description="serve, or profile for the instance profiling measures")
    telemetry: dict[str, Any] | None = Field(None, description="Token-manager view, on GPU workers")


class FunctionPublic(BaseModel):
    name: str
    version: int
    status: str
    error: str | None
    ready_instances: int
    starting_instances: int
    requests_total: int
    queued_requests: int = Field(0, description="Requests waiting for an instance at this gateway")
    in_flight_requests: int = Field(0, description="Requests being served, seen from this gateway")
    invoke_url: str
    profile: dict[str, Any] | None = Field(None, description="What profiling found for this version")
    loading: dict[str, Any] | None = Field(None, description="This version's cold start by stage (spawn, runtime, "
                                                             "imports, load, ready): running mean seconds and "
                                                             "starts seen")
    streams: dict[str, Any] | None = Field(None, description="Streamed answers at this gateway, recent: time to "
                                                             "first chunk and between chunks, p50 and p99 in ms")
    spec: dict[str, Any]
    source_dir: str = Field(description="The local folder it was deployed from; empty for a bundle or an image")
    bundle: str | None = Field(None, description="Digest of the uploaded code bundle")
    created_at: datetime
    updated_at: datetime


class EventPublic(BaseModel):
    at: datetime
    function: str
    action: str
    reason: str
    instance_id: str | None
