"""FastAPI dependencies: the gateway's services and a database session per request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from dilu.workflows.loading import WorkflowLoader
from gateway.services import GatewayServices


def get_services(request: Request) -> GatewayServices:
    return request.app.state.services


def get_workflows(request: Request) -> WorkflowLoader:
    return request.app.state.workflows


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.services.sessions() as session:
        yield session


ServicesDep = Annotated[GatewayServices, Depends(get_services)]
SessionDep = Annotated[Session, Depends(get_session)]
WorkflowsDep = Annotated[WorkflowLoader, Depends(get_workflows)]
