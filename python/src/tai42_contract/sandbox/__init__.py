"""The TAI42 sandbox contract: the neutral session models (:mod:`.models`),
the resolved policy (:mod:`.policy`), the error family (:mod:`.errors`), the
provider face (:mod:`.base`) and the registry facet (:mod:`.registry`). It
carries shapes and rules, no logic beyond validation and ranking; the
conformance suite any provider runs is :mod:`.testing`."""

from .base import Sandbox, SandboxExecHandle, SandboxSession
from .errors import (
    SandboxError,
    SandboxExecTimeoutError,
    SandboxFileNotFoundError,
    SandboxImageNotFoundError,
    SandboxImagePullError,
    SandboxOutputLimitError,
    SandboxSessionNotFoundError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SandboxUserNotFoundError,
    SandboxWorkspaceNotFoundError,
)
from .models import (
    ExecResult,
    SandboxDurability,
    SandboxImageInfo,
    SandboxIsolation,
    SandboxNetwork,
    SandboxPruneResult,
    SandboxPullProgress,
    SandboxPullStatus,
    SandboxSessionInfo,
    SandboxSessionSpec,
    SandboxStreamChunk,
    SandboxStreamExit,
    SandboxWorkspaceInfo,
)
from .policy import SandboxPolicy, isolation_strength, network_openness
from .registry import (
    SandboxRegistry,
    register_sandbox,
    registered_sandboxes,
    require_sandbox,
    unregister_sandbox,
)

__all__ = [
    "ExecResult",
    "Sandbox",
    "SandboxDurability",
    "SandboxError",
    "SandboxExecHandle",
    "SandboxExecTimeoutError",
    "SandboxFileNotFoundError",
    "SandboxImageInfo",
    "SandboxImageNotFoundError",
    "SandboxImagePullError",
    "SandboxIsolation",
    "SandboxNetwork",
    "SandboxOutputLimitError",
    "SandboxPolicy",
    "SandboxPruneResult",
    "SandboxPullProgress",
    "SandboxPullStatus",
    "SandboxRegistry",
    "SandboxSession",
    "SandboxSessionInfo",
    "SandboxSessionNotFoundError",
    "SandboxSessionSpec",
    "SandboxSpecRejectedError",
    "SandboxStreamChunk",
    "SandboxStreamExit",
    "SandboxUnavailableError",
    "SandboxUserNotFoundError",
    "SandboxWorkspaceInfo",
    "SandboxWorkspaceNotFoundError",
    "isolation_strength",
    "network_openness",
    "register_sandbox",
    "registered_sandboxes",
    "require_sandbox",
    "unregister_sandbox",
]
