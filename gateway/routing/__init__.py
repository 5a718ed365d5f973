"""Routing: pure functions from a load snapshot to one endpoint, picked from a name table."""

from __future__ import annotations

from gateway.routing.base import Candidate, RoutingContext, RoutingPolicy
from gateway.routing.policies import POLICIES, policy_for
from gateway.routing.precision import select_precisions

__all__ = ["POLICIES", "Candidate", "RoutingContext", "RoutingPolicy", "policy_for",
           "select_precisions"]
