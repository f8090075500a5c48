"""The coordinator's gRPC edge: the Admin and AgentGateway servicers, where protobuf requests become
calls on the components and gptrm errors become status codes."""

from __future__ import annotations

from coordinator.api.admin import AdminService
from coordinator.api.gateway import AgentGatewayService, validate_register

__all__ = ["AdminService", "AgentGatewayService", "validate_register"]
