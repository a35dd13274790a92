"""Contract/...: what a caller observes of the contract package itself (the
models, the error family, the rank functions, the registry facet), read
through the module paths the contract text names, so that a package that
drifts from the text fails here."""

from __future__ import annotations

import itertools
import secrets
import typing
from datetime import datetime

from pydantic import BaseModel, SecretStr

from ... import errors as E
from ... import models as M
from ... import policy as P
from ... import registry as R
from ...base import Sandbox
from .._helpers import attempt, no_secret, secret_value, want_kind
from .._suite import ISOLATIONS, NETWORKS, Check, clause

# The attributes the contract text gives each model, with their types.
_MODELS: dict[str, dict[str, object]] = {
    "ExecResult": {"exit_code": int, "stdout": str, "stderr": str},
    "SandboxSessionSpec": {
        "image": str,
        "workspace_key": str,
        "durability": M.SandboxDurability,
        "env": dict[str, SecretStr],
        "network": M.SandboxNetwork,
        "isolation": typing.Optional[M.SandboxIsolation],  # noqa: UP045 (compared as typing makes it)
        "cpu": typing.Optional[float],  # noqa: UP045
        "memory_mb": typing.Optional[int],  # noqa: UP045
        "ttl_seconds": int,
        "labels": dict[str, str],
    },
    "SandboxSessionInfo": {
        "id": str,
        "image": str,
        "workspace_key": str,
        "workspace_path": str,
        "durability": M.SandboxDurability,
        "created_at": datetime,
        "expires_at": datetime,
        "labels": dict[str, str],
    },
    "SandboxStreamChunk": {"stream": typing.Literal["stdout", "stderr"], "data": bytes},
    "SandboxStreamExit": {"exit_code": int},
}

_POLICY: dict[str, object] = {
    "egress": M.SandboxNetwork,
    "isolation": M.SandboxIsolation,
    "scrub_transcript": bool,
    "durable": bool,
}

_LITERALS: dict[str, tuple[str, ...]] = {
    "SandboxDurability": ("ephemeral", "persistent"),
    "SandboxIsolation": ISOLATIONS,
    "SandboxNetwork": NETWORKS,
}


def _want_fields(c: Check, where: str, model: object, want: dict[str, object]) -> None:
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        c.error(f"{where} is {model!r}, not a pydantic model")
        return
    got = {name: f.annotation for name, f in model.model_fields.items()}
    if set(got) != set(want):
        c.error(f"{where} has the attributes {sorted(got)}; the contract gives {sorted(want)}")
    for name, typ in want.items():
        if name in got and got[name] != typ:
            c.error(f"{where}.{name} is typed {got[name]!r}; the contract types it {typ!r}")


@clause("Contract/Models")
async def models(c: Check) -> None:
    """The models carry exactly the attributes the contract text gives them, with its types
    (ExecResult, SandboxSessionSpec, SandboxSessionInfo, SandboxStreamChunk,
    SandboxStreamExit, SandboxPolicy), and the tier literals hold exactly the contract's
    values."""
    for name, want in _MODELS.items():
        _want_fields(c, f"tai42_contract.sandbox.models.{name}", getattr(M, name, None), want)
    _want_fields(c, "tai42_contract.sandbox.policy.SandboxPolicy", P.SandboxPolicy, _POLICY)
    for name, values in _LITERALS.items():
        got = typing.get_args(getattr(M, name, None))
        if got != values:
            c.error(
                f"tai42_contract.sandbox.models.{name} holds {got}; the contract gives {values}"
            )


@clause("Contract/Errors")
async def errors(c: Check) -> None:
    """Every error the contract names is a SandboxError (an Exception), at the module path
    the text gives, carrying the attributes the text names: SandboxExecTimeoutError its
    timeout_seconds and output lengths, SandboxFileNotFoundError its path,
    SandboxSessionNotFoundError its session_id."""
    base = getattr(E, "SandboxError", None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        c.fatal(f"tai42_contract.sandbox.errors.SandboxError is {base!r}, not an Exception class")
    names = (
        "SandboxExecTimeoutError",
        "SandboxFileNotFoundError",
        "SandboxSessionNotFoundError",
        "SandboxSpecRejectedError",
        "SandboxUnavailableError",
    )
    for name in names:
        cls = getattr(E, name, None)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            c.error(f"tai42_contract.sandbox.errors.{name} is {cls!r}, not a SandboxError")
    te = E.SandboxExecTimeoutError(1.5, 7, 2)
    if (te.timeout_seconds, te.stdout_len, te.stderr_len) != (1.5, 7, 2):
        c.error(
            f"SandboxExecTimeoutError(1.5, 7, 2) carries timeout_seconds {te.timeout_seconds!r},"
            f" stdout_len {te.stdout_len!r}, stderr_len {te.stderr_len!r}"
        )
    if not isinstance(te, base):
        c.error("a SandboxExecTimeoutError is not a SandboxError")
    nf = E.SandboxFileNotFoundError("dir/missing.txt")
    if nf.path != "dir/missing.txt" or "dir/missing.txt" not in str(nf):
        c.error(
            f"SandboxFileNotFoundError('dir/missing.txt'): path {nf.path!r}, message "
            f"{str(nf)!r}; want the path carried and named"
        )
    sn = E.SandboxSessionNotFoundError("sb-suite")
    if sn.session_id != "sb-suite" or "sb-suite" not in str(sn):
        c.error(
            f"SandboxSessionNotFoundError('sb-suite'): session_id {sn.session_id!r}, message "
            f"{str(sn)!r}; want the id carried and named"
        )


@clause("Contract/PolicyRanks")
async def policy_ranks(c: Check) -> None:
    """isolation_strength ranks none < container < vm and network_openness ranks
    none < internal < egress: the ranks the policy's floor and ceiling are compared by."""
    for fn_name, order in (("isolation_strength", ISOLATIONS), ("network_openness", NETWORKS)):
        fn = getattr(P, fn_name)
        ranks = [fn(tier) for tier in order]
        if not all(isinstance(r, int) for r in ranks) or any(
            a >= b for a, b in itertools.pairwise(ranks)
        ):
            c.error(
                f"tai42_contract.sandbox.policy.{fn_name} ranks {list(order)} as {ranks}; want "
                "integers increasing in that order"
            )


@clause("Contract/SpecEnvMasked")
async def spec_env_masked(c: Check) -> None:
    """A spec's env values are SecretStr: str, repr, model_dump and model_dump_json of the spec
    show a mask, never the value, which get_secret_value still gives; the rejection of a
    malformed spec carrying env shows none either."""
    value = secret_value("spec")
    spec = M.SandboxSessionSpec(image="img", ttl_seconds=60, env={"TAI42_S": value})
    no_secret(c, "a SandboxSessionSpec", spec, value)
    got = spec.env.get("TAI42_S")
    if not isinstance(got, SecretStr) or got.get_secret_value() != value:
        c.error(f"spec.env['TAI42_S'] is {got!r}; want a SecretStr of the value given")
    for fields in (
        {"image": "", "ttl_seconds": 60, "env": {"TAI42_S": value}},
        {"image": "img", "ttl_seconds": 60, "env": {"TAI42=S": value}},
        {"image": "img", "ttl_seconds": 0, "env": {"TAI42_S": value}},
    ):
        _, err = await _construct(fields)
        if want_kind(c, err, E.SandboxSpecRejectedError, f"SandboxSessionSpec({fields})"):
            no_secret(c, "the rejection of a malformed spec", err, value)


async def _construct(fields: dict[str, object]) -> tuple[object, Exception | None]:
    async def make() -> object:
        return M.SandboxSessionSpec(**fields)

    return await attempt(make())


@clause("Contract/RegistryFacet")
async def registry_facet(c: Check) -> None:
    """require_sandbox is the one acquisition chokepoint: with no provider registered (or not
    the one named) it raises SandboxUnavailableError, a SandboxError; the provider
    registered under a name (a sandbox, or a factory registered with @register_sandbox,
    made once) is what it returns."""
    reg = R.SandboxRegistry()
    _, err = await attempt(_call(reg.require))
    want_kind(c, err, E.SandboxUnavailableError, "require() of an empty registry")
    sb = await c.sandbox()
    reg.register("suite", sb)
    got, err = await attempt(_call(reg.require, "suite"))
    if got is not sb:
        c.error(f"require('suite') returned {got!r} ({err!r}); want the sandbox registered")
    _, err = await attempt(_call(reg.require, "tai42-no-such-provider"))
    want_kind(c, err, E.SandboxUnavailableError, "require() of a name not registered")

    name = "tai42-suite-" + secrets.token_hex(4)
    R.register_sandbox(sb, name=name)
    try:
        got, err = await attempt(_call(R.require_sandbox, name))
        if got is not sb:
            c.error(f"require_sandbox({name!r}) returned {got!r} ({err!r}); want the sandbox")
    finally:
        R.unregister_sandbox(name)
    _, err = await attempt(_call(R.require_sandbox, name))
    want_kind(c, err, E.SandboxUnavailableError, "require_sandbox() of an unregistered name")
    # The decorator form registers a factory, made into the sandbox on first use.
    made: list[object] = []

    def make() -> Sandbox:
        made.append(sb)
        return sb

    R.register_sandbox(name=name)(make)
    try:
        first, err = await attempt(_call(R.require_sandbox, name))
        again, _ = await attempt(_call(R.require_sandbox, name))
        if first is not sb or again is not sb or len(made) != 1:
            c.error(
                f"require_sandbox of a factory registered with @register_sandbox(name=...) "
                f"returned {first!r}, then {again!r} ({err!r}), the factory called "
                f"{len(made)} times; want the sandbox it makes, made once"
            )
    finally:
        R.unregister_sandbox(name)


async def _call(fn: typing.Callable[..., object], *args: object) -> object:
    return fn(*args)
