"""The neutral session models: the shape of a session request and result.

Field names and JSON are the daemon's wire format. A spec validates its own
shape when it is made, as the Go contract's ``SessionSpec.Validate`` does,
and a bad one raises :class:`SandboxSpecRejectedError` naming the field, with
reason "invalid" and the daemon's rule text, before any request is sent.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from .errors import SandboxSpecRejectedError, _q

SandboxDurability = Literal["ephemeral", "persistent"]
SandboxIsolation = Literal["none", "container", "vm"]
SandboxNetwork = Literal["none", "internal", "egress"]

# The Go contract's limits on spec fields (models.go), checked here so that
# Python refuses what the daemon would, with the same field and rule.
MAX_LABELS = 64
MAX_LABEL_KEY_LEN = 128
MAX_LABEL_VALUE_LEN = 1024
MAX_WORKSPACE_KEY = 128
MAX_IMAGE_LEN = 512
MAX_ENV_KEY_LEN = 1024
_MAX_TTL_SECONDS = (2**63 - 1) // 10**9
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_LABEL_KEY_CHARS = _KEY_CHARS | frozenset("/:")
# The daemon's words for a tier that is not one of the contract's.
_TIER_RULES = {
    "durability": "durability {} is not one of ephemeral, persistent",
    "network": "network {} is not one of none, internal, egress",
    "isolation": "isolation {} is not one of none, container, vm (or null for the provider's own)",
}


class ExecResult(BaseModel):
    """The outcome of a completed non-interactive exec.

    Output that is not valid UTF-8 keeps every byte: its undecodable bytes
    are held as surrogate escapes, so ``stdout.encode("utf-8",
    "surrogateescape")`` gives back exactly what the exec wrote.
    """

    model_config = ConfigDict(frozen=True)

    exit_code: int
    stdout: str
    stderr: str


class SandboxStreamChunk(BaseModel):
    """One interleaved output frame from an interactive exec_start."""

    model_config = ConfigDict(frozen=True)

    stream: Literal["stdout", "stderr"]
    data: bytes


class SandboxStreamExit(BaseModel):
    """The interactive iterator's final item, carrying the exec's exit code."""

    model_config = ConfigDict(frozen=True)

    exit_code: int


def _printable(s: str) -> bool:
    return all(ord(c) >= 0x20 and ord(c) != 0x7F for c in s) and _utf8(s)


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _clip(s: str) -> str:
    return s[:64] + "..." if len(s.encode("utf-8", "surrogateescape")) > 64 else s


def valid_workspace_key(key: str) -> str | None:
    """The rule a workspace key breaks, or None: letters, digits, '.', '_'
    and '-', 1 to 128 bytes, not "." or ".."."""
    if not key or len(key.encode("utf-8", "surrogateescape")) > MAX_WORKSPACE_KEY:
        return f"workspace_key must be 1 to {MAX_WORKSPACE_KEY} bytes"
    if key in (".", ".."):
        return f"workspace_key {_q(key)} is reserved"
    if not set(key) <= _KEY_CHARS:
        return f"workspace_key {_q(_clip(key))}: only letters, digits, '.', '_' and '-' are allowed"
    return None


def valid_env_key(key: str) -> str | None:
    """The rule an environment variable name breaks, or None."""
    if not key:
        return "env: a variable name is empty"
    if len(key.encode("utf-8", "surrogateescape")) > MAX_ENV_KEY_LEN:
        return f"env: a variable name is longer than {MAX_ENV_KEY_LEN} bytes"
    if "=" in key or "\x00" in key:
        return f"env: variable name {_q(_clip(key))} contains '=' or NUL"
    return None


def _label_rule(key: str, value: str) -> str | None:
    if not key or len(key.encode("utf-8", "surrogateescape")) > MAX_LABEL_KEY_LEN:
        return f"label key {_q(_clip(key))} must be 1 to {MAX_LABEL_KEY_LEN} bytes"
    if not set(key) <= _LABEL_KEY_CHARS:
        return f"label key {_q(_clip(key))}: only letters, digits and . _ - / : are allowed"
    if len(value.encode("utf-8", "surrogateescape")) > MAX_LABEL_VALUE_LEN:
        return f"label {_q(key)}: value longer than {MAX_LABEL_VALUE_LEN} bytes"
    if not _printable(value):
        return f"label {_q(key)}: value must be printable UTF-8 text"
    return None


class SandboxSessionSpec(BaseModel):
    """The requested shape of one sandbox session.

    The CONSUMER declares the session it needs; the provider maps each field
    onto its runtime or REJECTS with SandboxSpecRejectedError what it cannot
    honour; it never silently downgrades a request. ``isolation`` None means
    the provider's own level; ``cpu`` and ``memory_mb`` None (or 0) mean no
    cap. Env values are secrets: they print, repr and dump as a mask.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str
    workspace_key: str = ""
    durability: SandboxDurability = "ephemeral"
    env: dict[str, SecretStr] = Field(default_factory=dict)
    network: SandboxNetwork = "none"
    isolation: SandboxIsolation | None = None
    cpu: float | None = None
    memory_mb: int | None = None
    ttl_seconds: int
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _as_rejection(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A field of the wrong type or value is the daemon's rejection of
        that field, not a pydantic error: one error type for a bad spec."""
        try:
            return handler(data)
        except ValidationError as e:
            first = e.errors()[0]
            loc = first.get("loc", ())
            field = str(loc[0]) if loc else "spec"
            if first.get("type") == "missing":
                rule = f"{field} is required"
            elif field in _TIER_RULES and isinstance(first.get("input"), str):
                rule = _TIER_RULES[field].format(_q(_clip(first["input"])))
            else:
                rule = f"{field}: {first.get('msg', 'invalid value')}"
            raise SandboxSpecRejectedError(rule, field=field) from None

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, v: Any) -> Any:
        # Plain strings are accepted and wrapped: the model holds SecretStr.
        return {} if v is None else v

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_none(cls, v: Any) -> Any:
        return {} if v is None else v

    @model_validator(mode="after")
    def _check(self) -> SandboxSessionSpec:
        rule = self.rule_broken()
        if rule is not None:
            raise SandboxSpecRejectedError(rule[1], field=rule[0])
        return self

    def rule_broken(self) -> tuple[str, str] | None:
        """The (field, rule) of the first field the spec's own shape breaks,
        in the daemon's order and words, or None."""
        if not self.image:
            return "image", "image is required"
        if len(self.image.encode("utf-8", "surrogateescape")) > MAX_IMAGE_LEN or not _printable(
            self.image
        ):
            return "image", f"image must be printable text of at most {MAX_IMAGE_LEN} bytes"
        if self.durability == "persistent" and not self.workspace_key:
            return "workspace_key", "a persistent session needs a workspace_key"
        if self.workspace_key:
            bad = valid_workspace_key(self.workspace_key)
            if bad:
                return "workspace_key", bad
        for key, secret in self.env.items():
            bad = valid_env_key(key)
            if bad:
                return "env", bad
            if "\x00" in secret.get_secret_value():
                return "env", f"env {_q(key)}: value contains a NUL byte"
        if self.cpu is not None and (self.cpu < 0 or math.isnan(self.cpu) or math.isinf(self.cpu)):
            return "cpu", "cpu must be a positive number of CPUs, or 0/null for no cap"
        if self.memory_mb is not None and self.memory_mb < 0:
            return "memory_mb", "memory_mb must be a positive number of MiB, or 0/null for no cap"
        if self.ttl_seconds <= 0:
            return "ttl_seconds", f"ttl_seconds must be > 0, got {self.ttl_seconds}"
        if self.ttl_seconds > _MAX_TTL_SECONDS:
            return "ttl_seconds", f"ttl_seconds {self.ttl_seconds} is too large"
        if len(self.labels) > MAX_LABELS:
            return "labels", f"at most {MAX_LABELS} labels, got {len(self.labels)}"
        for key, value in self.labels.items():
            bad = _label_rule(key, value)
            if bad:
                return "labels", bad
        return None


class SandboxSessionInfo(BaseModel):
    """The observable state of a live session, returned by info() /
    list_sessions(). It never carries the spec's env."""

    model_config = ConfigDict(frozen=True)

    id: str
    image: str
    workspace_key: str
    workspace_path: str
    durability: SandboxDurability
    created_at: datetime
    expires_at: datetime
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_none(cls, v: Any) -> Any:
        return {} if v is None else v


class SandboxWorkspaceInfo(BaseModel):
    """One persistent workspace (beyond the contract: the workspaces list).
    ``in_use_by`` is the id of the live session holding it, or ""."""

    model_config = ConfigDict(frozen=True)

    key: str
    size_bytes: int
    modified_at: datetime
    in_use_by: str = ""


SandboxPullStatus = Literal["resolved", "exists", "fetching", "done", "complete"]
"""The kind of a pull event: the reference resolved to a manifest
(``digest``), whose layers follow; the store holds ``layer`` already (not
fetched); ``done`` of ``total`` bytes of ``layer`` fetched (repeated);
``layer`` fetched, verified and unpacked; the image is in the store."""


class SandboxImageInfo(BaseModel):
    """An image the daemon holds (beyond the contract: the images of a
    provider that pulls them). ``name`` is the familiar form
    ("python:3.12-slim", "ghcr.io/o/r:tag"); ``id`` the digest of its
    config; ``digest`` the manifest digest it was pulled by ("" for an
    image imported from a file without one); ``size`` the bytes its layers
    take on disk, ``shared_size`` the part of it in layers other images use
    too."""

    model_config = ConfigDict(frozen=True)

    name: str
    id: str
    digest: str = ""
    platform: str
    size: int
    shared_size: int
    layers: int
    pulled: datetime


class SandboxPullProgress(BaseModel):
    """One event of a pull. ``layer`` is the digest of the layer the event
    is about ("" for the whole image); ``done`` and ``total`` its bytes
    fetched and its size, compressed (0 when not known); ``digest`` the
    manifest digest (on "resolved" and "complete")."""

    model_config = ConfigDict(frozen=True)

    ref: str
    status: SandboxPullStatus
    layer: str = ""
    done: int = 0
    total: int = 0
    digest: str = ""


class SandboxPruneResult(BaseModel):
    """What a prune removed: the layers no image used, and their bytes."""

    model_config = ConfigDict(frozen=True)

    layers: int
    bytes: int


__all__ = [
    "ExecResult",
    "SandboxDurability",
    "SandboxImageInfo",
    "SandboxIsolation",
    "SandboxNetwork",
    "SandboxPruneResult",
    "SandboxPullProgress",
    "SandboxPullStatus",
    "SandboxSessionInfo",
    "SandboxSessionSpec",
    "SandboxStreamChunk",
    "SandboxStreamExit",
    "SandboxWorkspaceInfo",
    "valid_env_key",
    "valid_workspace_key",
]
