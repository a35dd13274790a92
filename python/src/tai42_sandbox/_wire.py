"""The daemon's wire format on the Python side: the error mapping (one
function each way, as ``api/errors.go`` has), the spec's and the result's
JSON forms, and the interactive exec's frame constants (``api/frames.go``)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any, Final, cast, get_args

from pydantic import SecretStr

from tai42_contract.sandbox import (
    ExecResult,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxFileNotFoundError,
    SandboxImageNotFoundError,
    SandboxImagePullError,
    SandboxOutputLimitError,
    SandboxSessionNotFoundError,
    SandboxSessionSpec,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SandboxUserNotFoundError,
    SandboxWorkspaceNotFoundError,
)
from tai42_contract.sandbox.errors import PullReason, RejectReason


class SandboxTransportError(SandboxError):
    """A failure of the API itself rather than of the sandbox: a refused
    token (``kind`` "unauthorized"), a malformed request ("bad_request"), a
    body over the daemon's limit ("too_large"), a daemon stopping
    ("shutting_down"), a bug ("internal"). ``kind`` is the wire kind; the
    text is the daemon's message, as the Go client prints it."""

    kind: str

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message, op="api")


# The contract's kinds, then the transport's own (api/errors.go).
KIND_SANDBOX: Final = "sandbox_error"
KIND_EXEC_TIMEOUT: Final = "exec_timeout"
KIND_FILE_NOT_FOUND: Final = "file_not_found"
KIND_SESSION_NOT_FOUND: Final = "session_not_found"
KIND_SPEC_REJECTED: Final = "spec_rejected"
KIND_UNAVAILABLE: Final = "unavailable"
KIND_OUTPUT_LIMIT: Final = "output_limit"
KIND_WORKSPACE_NOT_FOUND: Final = "workspace_not_found"
KIND_USER_NOT_FOUND: Final = "user_not_found"
KIND_IMAGE_NOT_FOUND: Final = "image_not_found"
KIND_IMAGE_PULL: Final = "image_pull"
TRANSPORT_KINDS: Final = (
    "bad_request",
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "too_large",
    "internal",
    "shutting_down",
)

# The HTTP status of each kind: the one table both directions use.
KIND_STATUS: Final[Mapping[str, int]] = {
    KIND_SANDBOX: 400,
    KIND_EXEC_TIMEOUT: 504,
    KIND_FILE_NOT_FOUND: 404,
    KIND_SESSION_NOT_FOUND: 404,
    KIND_SPEC_REJECTED: 422,
    KIND_UNAVAILABLE: 503,
    KIND_OUTPUT_LIMIT: 507,
    KIND_WORKSPACE_NOT_FOUND: 404,
    KIND_USER_NOT_FOUND: 400,
    KIND_IMAGE_NOT_FOUND: 404,
    KIND_IMAGE_PULL: 400,
    "bad_request": 400,
    "unauthorized": 401,
    "not_found": 404,
    "method_not_allowed": 405,
    "too_large": 413,
    "internal": 500,
    "shutting_down": 503,
}

_REASONS: Final = frozenset(get_args(RejectReason))

# One encoder for every JSON the client sends: json.dumps with a keyword
# argument builds a new JSONEncoder per call, a cost on every exec.
to_json: Final = json.JSONEncoder(ensure_ascii=False).encode


def from_json(raw: bytes) -> Any:
    """The daemon's JSON answer. It is UTF-8 (RFC 8259 asks no other of a
    JSON body), so it is decoded as such instead of json.loads sniffing
    bytes for UTF-16 and UTF-32; a body that is not UTF-8 raises
    ValueError like one that is not JSON."""
    return json.loads(raw.decode())


def status_of(kind: str) -> int:
    """The HTTP status of a kind (500 for one the table does not know)."""
    return KIND_STATUS.get(kind, 500)


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _float(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _strip(message: str, prefix: str) -> str:
    return message[len(prefix) :] if message.startswith(prefix) else message


def error_from_wire(e: Mapping[str, Any]) -> SandboxError:
    """The contract's error for the "error" object of an error body or
    frame: a contract kind becomes its own class with every field, a
    transport kind (or one this client does not know) a
    :class:`SandboxTransportError` carrying it."""
    kind = _str(e.get("kind"))
    message = _str(e.get("message"))
    op = _str(e.get("op"))
    if kind == KIND_EXEC_TIMEOUT:
        return SandboxExecTimeoutError(
            _float(e.get("timeout_seconds")),
            _int(e.get("stdout_len")),
            _int(e.get("stderr_len")),
            _str(e.get("note")),
        )
    if kind == KIND_OUTPUT_LIMIT:
        return SandboxOutputLimitError(
            _int(e.get("limit")), _int(e.get("stdout_len")), _int(e.get("stderr_len"))
        )
    if kind == KIND_FILE_NOT_FOUND:
        return SandboxFileNotFoundError(_str(e.get("path")))
    if kind == KIND_SESSION_NOT_FOUND:
        return SandboxSessionNotFoundError(_str(e.get("session_id")), _str(e.get("detail")))
    if kind == KIND_SPEC_REJECTED:
        return _rejection(e, message)
    if kind == KIND_UNAVAILABLE:
        reg = e.get("registered")
        names = [n for n in reg if isinstance(n, str)] if isinstance(reg, list) else []
        return SandboxUnavailableError(_str(e.get("name")), names)
    if kind == KIND_WORKSPACE_NOT_FOUND:
        return SandboxWorkspaceNotFoundError(_str(e.get("workspace_key")))
    if kind == KIND_USER_NOT_FOUND:
        return SandboxUserNotFoundError(_str(e.get("user")), _strip(message, "sandbox: exec: "))
    if kind == KIND_IMAGE_NOT_FOUND:
        return SandboxImageNotFoundError(_str(e.get("image")))
    if kind == KIND_IMAGE_PULL:
        return _pull_error(e, message)
    if kind == KIND_SANDBOX:
        prefix = f"sandbox: {op}: " if op else "sandbox: "
        return SandboxError(_strip(message, prefix), op=op)
    return SandboxTransportError(kind or "internal", message)


def _rejection(e: Mapping[str, Any], message: str) -> SandboxSpecRejectedError:
    field = _str(e.get("field"))
    raw = _str(e.get("reason"))
    reason: RejectReason = raw if raw in _REASONS else "invalid"  # type: ignore[assignment]
    # The rule is the message less the text the class puts before it, so
    # that the rebuilt error prints as the original did.
    empty = str(SandboxSpecRejectedError("", field=field, reason=reason))
    return SandboxSpecRejectedError(_strip(message, empty), field=field, reason=reason)


def _pull_error(e: Mapping[str, Any], message: str) -> SandboxImagePullError:
    ref = _str(e.get("ref"))
    # A reason from a newer daemon keeps its text: the message says it too.
    reason = cast(PullReason, _str(e.get("reason")))
    empty = str(SandboxImagePullError(ref, reason, ""))
    return SandboxImagePullError(ref, reason, _strip(message, empty))


def _lens(stdout_len: int, stderr_len: int) -> dict[str, Any]:
    return {"stdout_len": stdout_len, "stderr_len": stderr_len}


def error_to_wire(err: BaseException) -> dict[str, Any]:
    """The "error" object for err: the other direction of
    :func:`error_from_wire`. A contract kind keeps every field of its kind;
    any exception outside the family is kind "internal" with its text."""
    msg = str(err)
    d: dict[str, Any]
    if isinstance(err, SandboxTransportError):
        return {"kind": err.kind, "message": err.message}
    if isinstance(err, SandboxExecTimeoutError):
        d = {"kind": KIND_EXEC_TIMEOUT, "message": msg, "op": "exec"}
        d["timeout_seconds"] = err.timeout_seconds
        d |= _lens(err.stdout_len, err.stderr_len)
        if err.note:
            d["note"] = err.note
        return d
    if isinstance(err, SandboxOutputLimitError):
        d = {"kind": KIND_OUTPUT_LIMIT, "message": msg, "op": "exec", "limit": err.limit}
        return d | _lens(err.stdout_len, err.stderr_len)
    if isinstance(err, SandboxFileNotFoundError):
        return {"kind": KIND_FILE_NOT_FOUND, "message": msg, "op": "get_file", "path": err.path}
    if isinstance(err, SandboxSessionNotFoundError):
        d = {"kind": KIND_SESSION_NOT_FOUND, "message": msg, "session_id": err.session_id}
        if err.detail:
            d["detail"] = err.detail
        return d
    if isinstance(err, SandboxSpecRejectedError):
        return {
            "kind": KIND_SPEC_REJECTED,
            "message": msg,
            "op": "create_session",
            "field": err.field,
            "reason": err.reason,
        }
    if isinstance(err, SandboxUnavailableError):
        d = {"kind": KIND_UNAVAILABLE, "message": msg}
        if err.name:
            d["name"] = err.name
        if err.registered:
            d["registered"] = list(err.registered)
        return d
    if isinstance(err, SandboxWorkspaceNotFoundError):
        return {
            "kind": KIND_WORKSPACE_NOT_FOUND,
            "message": msg,
            "op": "remove_workspace",
            "workspace_key": err.workspace_key,
        }
    if isinstance(err, SandboxImageNotFoundError):
        return {
            "kind": KIND_IMAGE_NOT_FOUND,
            "message": msg,
            "op": "remove_image",
            "image": err.image,
        }
    if isinstance(err, SandboxImagePullError):
        return {
            "kind": KIND_IMAGE_PULL,
            "message": msg,
            "op": "pull_image",
            "ref": err.ref,
            "reason": err.reason,
        }
    if isinstance(err, SandboxUserNotFoundError):
        return {"kind": KIND_USER_NOT_FOUND, "message": msg, "op": "exec", "user": err.user}
    if isinstance(err, SandboxError):
        d = {"kind": KIND_SANDBOX, "message": msg}
        if err.op:
            d["op"] = err.op
        return d
    return {"kind": "internal", "message": msg}


def reveal(env: Mapping[str, SecretStr | str] | None) -> dict[str, str] | None:
    """An env of secrets as the plain map the wire carries (None for none)."""
    if not env:
        return None
    return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in env.items()}


def spec_to_wire(spec: SandboxSessionSpec) -> dict[str, Any]:
    """The JSON body of POST /v1/sessions: env values in clear (they travel
    in the request body only), 0 caps as null, as api.SpecFrom sends them."""
    d: dict[str, Any] = {
        "image": spec.image,
        "durability": spec.durability,
        "network": spec.network,
        "isolation": spec.isolation,
        "cpu": spec.cpu or None,
        "memory_mb": spec.memory_mb or None,
        "ttl_seconds": spec.ttl_seconds,
    }
    if spec.workspace_key:
        d["workspace_key"] = spec.workspace_key
    env = reveal(spec.env)
    if env:
        d["env"] = env
    if spec.labels:
        d["labels"] = dict(spec.labels)
    return d


def _output(d: Mapping[str, Any], name: str) -> str:
    b64 = d.get(name + "_base64")
    if isinstance(b64, str):
        # Not UTF-8: every byte kept, as surrogate escapes (ExecResult's doc).
        return base64.b64decode(b64, validate=True).decode("utf-8", "surrogateescape")
    return _str(d.get(name))


def result_from_wire(d: Mapping[str, Any]) -> ExecResult:
    """The contract's result of an exec's JSON answer."""
    return ExecResult(
        exit_code=_int(d.get("exit_code")), stdout=_output(d, "stdout"), stderr=_output(d, "stderr")
    )


def valid_timeout(op: str, timeout_seconds: Any, default: float | None = None) -> float:
    """timeout_seconds as a float, or the SandboxError the daemon would give
    for it, before any request."""
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
        raise SandboxError(
            f"timeout_seconds must be a number of seconds, got {type(timeout_seconds).__name__}",
            op=op,
        )
    t = float(timeout_seconds)
    if math.isnan(t) or math.isinf(t) or abs(t) > MAX_TIMEOUT_SECONDS:
        raise SandboxError(
            f"timeout_seconds {t:g} is out of range: it must be > 0 and at most "
            f"{MAX_TIMEOUT_WHOLE} (about 292 years)",
            op=op,
        )
    if t <= 0:
        hint = f"; the daemon's default is {default:g}s" if default else ""
        raise SandboxError(f"a timeout is required and must be > 0 (got {t:g}s){hint}", op=op)
    return t


def valid_bytes(op: str, what: str, data: Any) -> bytes:
    """data as bytes, or a SandboxError saying what was passed instead."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    hint = " (encode text first, e.g. text.encode())" if isinstance(data, str) else ""
    raise SandboxError(f"{what} must be bytes, got {type(data).__name__}{hint}", op=op)


MAX_TIMEOUT_SECONDS: Final = (2**63 - 1) / 1e9
MAX_TIMEOUT_WHOLE: Final = (2**63 - 1) // 10**9

# The interactive exec's frames (api/frames.go).
EXEC_SUBPROTOCOL: Final = "tai42.exec.v1"
TAG_STDIN: Final = 0x00
TAG_STDOUT: Final = 0x01
TAG_STDERR: Final = 0x02
MAX_STDIN_FRAME: Final = 1 << 20
MAX_JSON_BODY: Final = 64 << 20
NDJSON: Final = "application/x-ndjson"
TRAILER_UPLOAD_FAILED: Final = "Tai42-Upload-Failed"
