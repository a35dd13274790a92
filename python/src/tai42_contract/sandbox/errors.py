"""The sandbox error family.

Every failure a sandbox reports is a :class:`SandboxError`; the kinds the
contract names are its subclasses, each carrying the attributes the contract
text gives it. The texts print as the Go family's do, so a message reads the
same whichever side of the daemon raised it. No error ever carries an env
value or exec output: a timeout carries the output's lengths only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

RejectReason = Literal["invalid", "policy", "unenforceable", "conflict"]
"""Why a spec was rejected: malformed, against the operator policy, beyond
what the provider can enforce, or in conflict with a live session."""

PullReason = Literal[
    "invalid_reference",
    "not_found",
    "unauthorized",
    "no_platform",
    "invalid_image",
    "unreachable",
    "storage",
]
"""Why a pull failed: the reference is not one (nothing was asked of a
registry); the registry has no such repository, tag or digest; it refused
the credentials (or asked for some and none were configured); the image has
no manifest for the platform asked; what it sent is not a usable image (a
digest that does not match, a hostile layer, too large); it could not be
reached, or stalled; the store could not keep it (a full disk)."""


def _q(s: str) -> str:
    """s quoted as the Go family's %q quotes it, near enough to read alike."""
    return json.dumps(s, ensure_ascii=False)


def go_duration(seconds: float) -> str:
    """seconds written as Go's time.Duration prints it ("300ms", "1.5s",
    "2m0s"), so a timeout reads the same from either side of the daemon."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _trim(ns, size) + unit
    h, rest = divmod(ns, 3600 * 10**9)
    m, rest = divmod(rest, 60 * 10**9)
    text = _trim(rest, 10**9) + "s"
    if h or m:
        text = f"{m}m" + text
    if h:
        text = f"{h}h" + text
    return sign + text


def _trim(n: int, size: int) -> str:
    whole, frac = divmod(n, size)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


class SandboxError(Exception):
    """Base for every sandbox failure.

    It is also the error itself for failures with no kind of their own (an
    I/O or permission error, an unreadable non-file, a refused path, a call
    on a finished exec). ``op`` names the operation that failed ("exec",
    "get_file", ...) or is empty; ``message`` says what went wrong.
    """

    op: str
    message: str

    def __init__(self, message: str, *, op: str = "") -> None:
        self.op = op
        self.message = message
        super().__init__(self._text())

    def _text(self) -> str:
        prefix = f"sandbox: {self.op}: " if self.op else "sandbox: "
        return prefix + self.message


class SandboxExecTimeoutError(SandboxError):
    """An exec / exec_start exceeded its timeout_seconds and was killed.

    It carries the partial output's LENGTHS, never its content (output may
    hold secrets read from env). When the exec's output ended with the kill
    they count every byte the exec produced; when a process the command
    started still held the output after the kill they count the output
    received up to the stop, and ``note`` says so.
    """

    timeout_seconds: float
    stdout_len: int
    stderr_len: int
    note: str

    def __init__(
        self, timeout_seconds: float, stdout_len: int, stderr_len: int, note: str = ""
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.stdout_len = stdout_len
        self.stderr_len = stderr_len
        self.note = note
        text = (
            f"exec timed out after {go_duration(timeout_seconds)} and was killed "
            f"(partial output: stdout {stdout_len} bytes, stderr {stderr_len} bytes)"
        )
        if note:
            text += "; " + note
        super().__init__(text, op="exec")

    def _text(self) -> str:
        return "sandbox: " + self.message


class SandboxFileNotFoundError(SandboxError):
    """No file exists at the requested path in the session's workspace.

    get_file raises it ONLY when nothing exists at ``path``; every other read
    failure is the base :class:`SandboxError` with the real message.
    """

    path: str

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"get_file {_q(path)}: no such file in the workspace", op="get_file")

    def _text(self) -> str:
        return "sandbox: " + self.message


class SandboxSessionNotFoundError(SandboxError):
    """No live session has the requested id: it never existed, was destroyed,
    or has expired. ``detail`` says more when there is more to say."""

    session_id: str
    detail: str

    def __init__(self, session_id: str, detail: str = "") -> None:
        self.session_id = session_id
        self.detail = detail
        text = f"no live session {_q(session_id)}"
        if detail:
            text += ": " + detail
        super().__init__(text)


_WHY: dict[str, str] = {
    "policy": "violates the operator policy",
    "unenforceable": "the provider cannot enforce it",
    "conflict": "conflicts with a live session",
}


class SandboxSpecRejectedError(SandboxError):
    """A SandboxSessionSpec cannot be honoured, and was not downgraded.

    ONE error for two causes the message distinguishes: the provider cannot
    enforce the spec (``reason`` "unenforceable"), or the spec violates the
    operator policy (``reason`` "policy"). A malformed spec has reason
    "invalid"; a persistent workspace_key a live session holds, "conflict".
    ``field`` names the spec field; ``rule`` is the rule the spec broke.
    """

    field: str
    reason: RejectReason
    rule: str

    def __init__(self, rule: str, *, field: str, reason: RejectReason = "invalid") -> None:
        self.field = field
        self.reason = reason
        self.rule = rule
        why = _WHY.get(reason, "invalid")
        super().__init__(f"spec rejected ({field}: {why}): {rule}", op="create_session")

    def _text(self) -> str:
        return "sandbox: " + self.message


class SandboxUnavailableError(SandboxError):
    """No sandbox provider is registered (or not the one asked for).

    Raised by the facet's :func:`require_sandbox` acquisition chokepoint, so
    every consumer catches this ONE type when no provider backs the seam.
    """

    name: str
    registered: tuple[str, ...]

    def __init__(self, name: str = "", registered: Sequence[str] = ()) -> None:
        self.name = name
        self.registered = tuple(registered)
        if not name:
            text = "no sandbox provider is registered"
        elif not self.registered:
            text = f"no sandbox provider {_q(name)} is registered (none is)"
        else:
            text = (
                f"no sandbox provider {_q(name)} is registered "
                f"(registered: {', '.join(self.registered)})"
            )
        super().__init__(text, op="require")

    def _text(self) -> str:
        return "sandbox: " + self.message


# Beyond the contract's own kinds: what the Go family adds, so that a
# caller can tell these apart without reading a message.


class SandboxOutputLimitError(SandboxError):
    """An exec's output exceeded what the provider holds in memory; the exec
    was killed. Output is never silently truncated; the error carries the
    lengths received, never the content. Stream large output with exec_start."""

    limit: int
    stdout_len: int
    stderr_len: int

    def __init__(self, limit: int, stdout_len: int, stderr_len: int) -> None:
        self.limit = limit
        self.stdout_len = stdout_len
        self.stderr_len = stderr_len
        super().__init__(
            f"exec output exceeded the limit of {limit} bytes per stream and the exec was "
            f"killed (stdout {stdout_len} bytes, stderr {stderr_len} bytes); "
            "use exec_start to stream large output",
            op="exec",
        )

    def _text(self) -> str:
        return "sandbox: " + self.message


class SandboxWorkspaceNotFoundError(SandboxError):
    """No persistent workspace has the key."""

    workspace_key: str

    def __init__(self, workspace_key: str) -> None:
        self.workspace_key = workspace_key
        super().__init__(f"no persistent workspace {_q(workspace_key)}", op="remove_workspace")

    def _text(self) -> str:
        return "sandbox: " + self.message


class SandboxUserNotFoundError(SandboxError):
    """An exec asked to run as a user the session does not know (not in the
    session's own /etc/passwd or /etc/group)."""

    user: str

    def __init__(self, user: str, message: str = "") -> None:
        self.user = user
        super().__init__(message or f"user {_q(user)} is not known in the session", op="exec")


class SandboxImageNotFoundError(SandboxError):
    """The daemon holds no image of the name (beyond the contract: the
    images of a provider that pulls them)."""

    image: str

    def __init__(self, image: str) -> None:
        self.image = image
        super().__init__(f"no image {_q(image)} in the store", op="remove_image")

    def _text(self) -> str:
        return "sandbox: " + self.message


class SandboxImagePullError(SandboxError):
    """The image ``ref`` could not be pulled. ``reason`` says why (one of
    :data:`PullReason`: "invalid_reference" for a reference that is not
    one) and ``detail`` what the registry (or the store) answered; it never
    holds a credential."""

    ref: str
    reason: PullReason
    detail: str

    def __init__(self, ref: str, reason: PullReason, detail: str) -> None:
        self.ref = ref
        self.reason = reason
        self.detail = detail
        super().__init__(f"pulling image {_q(ref)} ({reason}): {detail}", op="pull_image")

    def _text(self) -> str:
        return "sandbox: " + self.message


__all__ = [
    "PullReason",
    "RejectReason",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxFileNotFoundError",
    "SandboxImageNotFoundError",
    "SandboxImagePullError",
    "SandboxOutputLimitError",
    "SandboxSessionNotFoundError",
    "SandboxSpecRejectedError",
    "SandboxUnavailableError",
    "SandboxUserNotFoundError",
    "SandboxWorkspaceNotFoundError",
]
