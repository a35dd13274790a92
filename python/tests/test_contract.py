"""The contract package: spec validation mirrors the daemon's (the same bad
spec, posted raw, is refused with the same field and reason), policy ranks,
the registry, secret masking, and the errors' attributes and texts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr

from tai42_contract.sandbox import (
    Sandbox,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxFileNotFoundError,
    SandboxPolicy,
    SandboxRegistry,
    SandboxSessionNotFoundError,
    SandboxSessionSpec,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    isolation_strength,
    network_openness,
)
from tai42_contract.sandbox.errors import go_duration
from tai42_sandbox import Tai42Sandbox

BASE: dict[str, Any] = {
    "image": "host",
    "durability": "ephemeral",
    "network": "none",
    "isolation": None,
    "cpu": None,
    "memory_mb": None,
    "ttl_seconds": 60,
}

# (case, the fields that differ from BASE, the field refused)
BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("empty image", {"image": ""}, "image"),
    ("image with a newline", {"image": "ho\nst"}, "image"),
    ("image too long", {"image": "x" * 513}, "image"),
    ("unknown durability", {"durability": "forever"}, "durability"),
    ("unknown network", {"network": "wide"}, "network"),
    ("unknown isolation", {"isolation": "strong"}, "isolation"),
    ("persistent without a key", {"durability": "persistent"}, "workspace_key"),
    ("reserved key", {"workspace_key": ".."}, "workspace_key"),
    ("reserved key .", {"workspace_key": "."}, "workspace_key"),
    ("key with a slash", {"workspace_key": "a/b"}, "workspace_key"),
    ("key too long", {"workspace_key": "k" * 129}, "workspace_key"),
    ("env name with =", {"env": {"A=B": "x"}}, "env"),
    ("empty env name", {"env": {"": "x"}}, "env"),
    ("env value with NUL", {"env": {"K": "a\u0000b"}}, "env"),
    ("negative cpu", {"cpu": -1}, "cpu"),
    ("negative memory", {"memory_mb": -5}, "memory_mb"),
    ("zero ttl", {"ttl_seconds": 0}, "ttl_seconds"),
    ("negative ttl", {"ttl_seconds": -3}, "ttl_seconds"),
    ("huge ttl", {"ttl_seconds": 2**62}, "ttl_seconds"),
    ("too many labels", {"labels": {f"k{i}": "v" for i in range(65)}}, "labels"),
    ("bad label key", {"labels": {"bad key!": "v"}}, "labels"),
    ("long label value", {"labels": {"k": "x" * 1025}}, "labels"),
    ("label value with a tab", {"labels": {"k": "a\tb"}}, "labels"),
]


@pytest.mark.parametrize(("case", "change", "field"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
async def test_spec_validation_mirrors_the_daemon(
    sandbox: Tai42Sandbox, case: str, change: dict[str, Any], field: str
) -> None:
    body = {**BASE, **change}
    with pytest.raises(SandboxSpecRejectedError) as py:
        SandboxSessionSpec.model_validate(body)
    # The same JSON, posted raw past the Python check.
    with pytest.raises(SandboxSpecRejectedError) as daemon:
        await sandbox._t.call("create_session", "POST", "/v1/sessions", body)
    assert (py.value.field, py.value.reason) == (field, "invalid"), case
    assert (daemon.value.field, daemon.value.reason) == (field, "invalid"), case
    assert py.value.rule == daemon.value.rule, case
    assert str(py.value) == str(daemon.value), case


def test_valid_spec_defaults() -> None:
    s = SandboxSessionSpec(image="host", ttl_seconds=5)
    assert (s.durability, s.network, s.isolation, s.env, s.labels) == (
        "ephemeral",
        "none",
        None,
        {},
        {},
    )
    with pytest.raises(SandboxSpecRejectedError) as e:
        SandboxSessionSpec(image="host")  # type: ignore[call-arg]
    assert (e.value.field, e.value.rule) == ("ttl_seconds", "ttl_seconds is required")
    with pytest.raises(SandboxSpecRejectedError) as e:
        SandboxSessionSpec(image="host", ttl_seconds=5, nope=1)  # type: ignore[call-arg]
    assert e.value.field == "nope"


def test_env_values_are_masked() -> None:
    s = SandboxSessionSpec(image="host", ttl_seconds=5, env={"TOKEN": "hunter2-secret"})
    assert isinstance(s.env["TOKEN"], SecretStr)
    assert s.env["TOKEN"].get_secret_value() == "hunter2-secret"
    for text in (repr(s), str(s), s.model_dump_json(), json.dumps(s.model_dump(), default=str)):
        assert "hunter2" not in text
    with pytest.raises(SandboxSpecRejectedError) as e:
        SandboxSessionSpec(image="host", ttl_seconds=5, env={"K": "hunter2\x00"})
    assert "hunter2" not in str(e.value)


def test_policy_ranks() -> None:
    assert [isolation_strength(i) for i in ("none", "container", "vm")] == [0, 1, 2]
    assert [network_openness(n) for n in ("none", "internal", "egress")] == [0, 1, 2]
    with pytest.raises(ValueError, match="isolation"):
        isolation_strength("strong")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="network"):
        network_openness("wide")  # type: ignore[arg-type]
    p = SandboxPolicy(
        egress="internal", isolation="container", scrub_transcript=True, durable=False
    )
    assert network_openness("none") <= network_openness(p.egress) < network_openness("egress")


class _Fake(Sandbox):
    exec_default_timeout_seconds = 1.0
    reap_interval_seconds = 1.0

    async def create_session(self, spec: SandboxSessionSpec) -> Any:
        raise NotImplementedError

    async def get_session(self, session_id: str) -> Any:
        raise SandboxSessionNotFoundError(session_id)

    async def list_sessions(self) -> list[Any]:
        return []

    async def destroy_session(self, session_id: str) -> None:
        return None

    async def reap(self) -> list[str]:
        return []


def test_registry() -> None:
    r = SandboxRegistry()
    with pytest.raises(SandboxUnavailableError) as e:
        r.require()
    assert str(e.value) == "sandbox: no sandbox provider is registered"
    made: list[int] = []

    def factory() -> Sandbox:
        made.append(1)
        return _Fake()

    r.register("fake", factory)
    assert made == []  # made on first use
    sb = r.require()
    assert r.require("fake") is sb
    assert made == [1]
    with pytest.raises(ValueError, match="already registered"):
        r.register("fake", _Fake())
    with pytest.raises(SandboxUnavailableError) as e:
        r.require("other")
    assert (e.value.name, e.value.registered) == ("other", ("fake",))
    assert "registered: fake" in str(e.value)
    assert r.unregister("fake")
    assert not r.unregister("fake")
    assert r.names() == []


def test_error_attributes_and_texts() -> None:
    to = SandboxExecTimeoutError(2, 10, 3, "note here")
    assert (to.timeout_seconds, to.stdout_len, to.stderr_len, to.note, to.op) == (
        2,
        10,
        3,
        "note here",
        "exec",
    )
    assert str(to) == (
        "sandbox: exec timed out after 2s and was killed (partial output: stdout 10 bytes, "
        "stderr 3 bytes); note here"
    )
    fnf = SandboxFileNotFoundError("a b")
    assert str(fnf) == 'sandbox: get_file "a b": no such file in the workspace'
    assert fnf.path == "a b"
    snf = SandboxSessionNotFoundError("sb-1", "expired")
    assert str(snf) == 'sandbox: no live session "sb-1": expired'
    rej = SandboxSpecRejectedError("too open", field="network", reason="policy")
    assert str(rej) == "sandbox: spec rejected (network: violates the operator policy): too open"
    base = SandboxError("it broke", op="put_file")
    assert (str(base), base.op, base.message) == (
        "sandbox: put_file: it broke",
        "put_file",
        "it broke",
    )
    for e in (to, fnf, snf, rej, SandboxUnavailableError()):
        assert isinstance(e, SandboxError)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.3, "300ms"),
        (2, "2s"),
        (1.5, "1.5s"),
        (120, "2m0s"),
        (3601.5, "1h0m1.5s"),
        (5e-07, "500ns"),
        (1e-06, "1\u00b5s"),
        (0.0015, "1.5ms"),
        (9223372036, "2562047h47m16s"),
    ],
)
def test_timeout_reads_as_go_prints_it(seconds: float, text: str) -> None:
    # The pairs are what Go's time.Duration(seconds * 1e9).String() prints.
    assert go_duration(seconds) == text
    assert f"after {text} and was killed" in str(SandboxExecTimeoutError(seconds, 0, 0))
