"""The resolved security policy the kit enforces at session create, and the
two rank functions the policy is compared with."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .models import SandboxIsolation, SandboxNetwork

_STRENGTH: dict[str, int] = {"none": 0, "container": 1, "vm": 2}
_OPENNESS: dict[str, int] = {"none": 0, "internal": 1, "egress": 2}


class SandboxPolicy(BaseModel):
    """The resolved security policy the kit enforces at session create.

    ``egress`` is the network CEILING (a session's network must be at or
    tighter); ``isolation`` is the strength FLOOR (a session runs at at least
    this level); ``durable`` gates whether a persistent session is permitted
    at all; ``scrub_transcript`` is carried for the consumer to read: it is
    applied consumer-side, NOT a create-time gate.
    """

    model_config = ConfigDict(frozen=True)

    egress: SandboxNetwork
    isolation: SandboxIsolation
    scrub_transcript: bool
    durable: bool


def isolation_strength(isolation: SandboxIsolation) -> int:
    """The strength rank of an isolation tier (none < container < vm)."""
    try:
        return _STRENGTH[isolation]
    except KeyError:
        raise ValueError(f"isolation {isolation!r} is not one of none, container, vm") from None


def network_openness(network: SandboxNetwork) -> int:
    """The openness rank of a network tier (none < internal < egress)."""
    try:
        return _OPENNESS[network]
    except KeyError:
        raise ValueError(f"network {network!r} is not one of none, internal, egress") from None


__all__ = ["SandboxPolicy", "isolation_strength", "network_openness"]
