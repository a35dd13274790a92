"""The wire error mapping both ways, for every kind, checked against
api/errors.go's table; the result's and the spec's JSON forms."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from tai42_contract.sandbox import (
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
from tai42_sandbox import SandboxTransportError, error_from_wire, error_to_wire
from tai42_sandbox._wire import (
    KIND_STATUS,
    TRANSPORT_KINDS,
    result_from_wire,
    spec_to_wire,
    status_of,
)

ERRORS_GO = Path(__file__).resolve().parents[2] / "api" / "errors.go"

# One error of every kind, with every field of its kind set.
EXAMPLES: list[SandboxError] = [
    SandboxError("cannot read: permission denied", op="get_file"),
    SandboxError("no op here"),
    SandboxExecTimeoutError(1.5, 3, 2),
    SandboxExecTimeoutError(0.3, 10, 0, "a process the command started held the output"),
    SandboxFileNotFoundError("dir/a.txt"),
    SandboxSessionNotFoundError("sb-1"),
    SandboxSessionNotFoundError("sb-2", "it expired"),
    SandboxSpecRejectedError(
        "network egress is looser than the ceiling", field="network", reason="policy"
    ),
    SandboxSpecRejectedError("image is required", field="image"),
    SandboxSpecRejectedError("held by sb-3", field="workspace_key", reason="conflict"),
    SandboxSpecRejectedError("no vm here", field="isolation", reason="unenforceable"),
    SandboxUnavailableError(),
    SandboxUnavailableError("k8s", ["host", "container"]),
    SandboxOutputLimitError(1024, 1025, 7),
    SandboxWorkspaceNotFoundError("notes"),
    SandboxUserNotFoundError("ghost"),
    SandboxImageNotFoundError("ghcr.io/o/r:tag"),
    SandboxImagePullError(
        "127.0.0.1:5000/r@sha256:0d", "not_found", "MANIFEST_UNKNOWN: no such tag"
    ),
    SandboxImagePullError("Not A Ref", "invalid_reference", "could not parse reference: Not A Ref"),
    *(SandboxTransportError(k, f"a {k} failure") for k in TRANSPORT_KINDS),
]


def _fields(e: BaseException) -> dict[str, object]:
    return {k: v for k, v in vars(e).items() if not k.startswith("_")}


@pytest.mark.parametrize("err", EXAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip(err: SandboxError) -> None:
    wire = error_to_wire(err)
    back = error_from_wire(wire)
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert _fields(back) == _fields(err)
    assert error_to_wire(back) == wire


def test_every_kind_has_an_example_and_a_status() -> None:
    kinds = {error_to_wire(e)["kind"] for e in EXAMPLES}
    assert kinds == set(KIND_STATUS)


def _go_table() -> dict[str, int]:
    """KindStatus of api/errors.go, read from the source."""
    src = ERRORS_GO.read_text()
    consts = dict(re.findall(r'\b(Kind\w+)\s+Kind = "(\w+)"', src))
    table = re.search(r"var KindStatus = map\[Kind\]int\{(.*?)\n\}", src, re.S)
    assert table is not None
    statuses = {
        "StatusBadRequest": 400, "StatusGatewayTimeout": 504, "StatusNotFound": 404,
        "StatusUnprocessableEntity": 422, "StatusServiceUnavailable": 503,
        "StatusInsufficientStorage": 507, "StatusUnauthorized": 401,
        "StatusMethodNotAllowed": 405, "StatusRequestEntityTooLarge": 413,
        "StatusInternalServerError": 500,
    }  # fmt: skip
    out = {}
    for name, status in re.findall(r"(Kind\w+):\s+http\.(\w+),", table.group(1)):
        out[consts[name]] = statuses[status]
    return out


def test_kinds_and_statuses_are_the_daemons() -> None:
    go = _go_table()
    assert go, "no kind read from api/errors.go"
    for kind, status in go.items():
        assert KIND_STATUS.get(kind) == status, kind
    # Kinds only Python knows are extensions the daemon may not have yet.
    assert set(KIND_STATUS) - set(go) <= {"user_not_found"}


def test_transport_kinds_carry_kind_and_message() -> None:
    e = error_from_wire({"kind": "unauthorized", "message": "the bearer token is not valid"})
    assert isinstance(e, SandboxTransportError)
    assert (e.kind, e.op, e.message) == ("unauthorized", "api", "the bearer token is not valid")
    assert str(e) == "sandbox: api: the bearer token is not valid"
    unknown = error_from_wire({"kind": "brand_new", "message": "m"})
    assert isinstance(unknown, SandboxTransportError)
    assert unknown.kind == "brand_new"
    empty = error_from_wire({})
    assert isinstance(empty, SandboxTransportError)
    assert empty.kind == "internal"
    assert status_of("brand_new") == 500


def test_daemon_bodies() -> None:
    """Bodies as the daemon sends them (captured from a real one)."""
    to = error_from_wire({
        "kind": "exec_timeout", "op": "exec", "timeout_seconds": 0.3, "stdout_len": 4,
        "stderr_len": 1,
        "message": "sandbox: exec timed out after 300ms and was killed (partial output: ...)",
    })  # fmt: skip
    assert isinstance(to, SandboxExecTimeoutError)
    assert (to.timeout_seconds, to.stdout_len, to.stderr_len) == (0.3, 4, 1)
    rej = error_from_wire({
        "kind": "spec_rejected", "op": "create_session", "field": "durability",
        "reason": "invalid",
        "message": 'sandbox: spec rejected (durability: invalid): durability "" is not one of '
        "ephemeral, persistent",
    })  # fmt: skip
    assert isinstance(rej, SandboxSpecRejectedError)
    assert (rej.field, rej.reason) == ("durability", "invalid")
    assert rej.rule == 'durability "" is not one of ephemeral, persistent'
    se = error_from_wire({
        "kind": "sandbox_error", "op": "get_file",
        "message": 'sandbox: get_file: "." is a directory, not a file',
    })  # fmt: skip
    assert type(se) is SandboxError
    assert (se.op, se.message) == ("get_file", '"." is a directory, not a file')
    assert str(se) == 'sandbox: get_file: "." is a directory, not a file'
    fnf = error_from_wire(
        {
            "kind": "file_not_found",
            "op": "get_file",
            "path": "nope",
            "message": 'sandbox: get_file "nope": no such file in the workspace',
        }
    )
    assert isinstance(fnf, SandboxFileNotFoundError)
    assert fnf.path == "nope"
    assert str(fnf) == 'sandbox: get_file "nope": no such file in the workspace'


def test_outside_the_family_is_internal() -> None:
    assert error_to_wire(ValueError("boom")) == {"kind": "internal", "message": "boom"}


def test_result_from_wire_keeps_every_byte() -> None:
    raw = b"ok\xff\xfe"
    r = result_from_wire(
        {
            "exit_code": 2,
            "stdout": "",
            "stderr": "e",
            "stdout_base64": base64.b64encode(raw).decode(),
        }
    )
    assert r.exit_code == 2
    assert r.stderr == "e"
    assert r.stdout.encode("utf-8", "surrogateescape") == raw
    with pytest.raises(ValueError, match=r"base64|Incorrect|Invalid"):
        result_from_wire({"exit_code": 0, "stdout_base64": "%%%"})


def test_spec_to_wire() -> None:
    spec = SandboxSessionSpec(
        image="host",
        ttl_seconds=60,
        env={"K": SecretStr("s3cr3t-value")},
        labels={"a": "b"},
        cpu=0,
        memory_mb=0,
    )
    w = spec_to_wire(spec)
    assert w == {
        "image": "host",
        "durability": "ephemeral",
        "network": "none",
        "isolation": None,
        "cpu": None,
        "memory_mb": None,
        "ttl_seconds": 60,
        "env": {"K": "s3cr3t-value"},
        "labels": {"a": "b"},
    }
    assert "s3cr3t" not in repr(spec)
    assert "s3cr3t" not in str(spec.env)
