"""Spec/...: what create_session accepts and what it rejects, and the
spec's network and caps enforced."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from ... import errors as E
from ...models import SandboxSessionSpec
from ...policy import SandboxPolicy
from .._helpers import EXEC_TIMEOUT, attempt, run, sh_argv, want_kind, want_rejected
from .._suite import (
    ISOLATIONS,
    NETWORKS,
    PERMISSIVE,
    Check,
    Config,
    ConfigRefused,
    clause,
    openness,
    strength,
)
from .sandbox import persistent, want_listed


def _policy(
    egress: str = "egress", isolation: str = "none", durable: bool = True, scrub: bool = False
) -> SandboxPolicy:
    return SandboxPolicy(
        egress=egress,
        isolation=isolation,
        durable=durable,
        scrub_transcript=scrub,
    )


@dataclass
class _Case:
    name: str
    policy: SandboxPolicy
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # "" for a spec that must be accepted
    field: str = ""


async def _run_cases(c: Check, cases: list[_Case]) -> None:
    """Create each case's session on a fresh sandbox of its policy; a
    rejected one must leave no session behind."""
    for case in cases:
        what = f"create_session with {case.name} under {case.policy!r}"
        async with c.scope():
            try:
                sb = await c.sandbox(Config(policy=case.policy))
            except ConfigRefused as e:
                if strength(case.policy.isolation) <= strength(c.opts.isolation):
                    raise
                # A floor above the provider's own level: refusing to be
                # made at all rejects every session, as the rule wants.
                c.log(f"{what}: the provider refuses the policy itself ({e})")
                continue
            sess, err = await attempt(sb.create_session(c.spec(**case.changes)))
            if sess is not None:
                c.destroy_at_end(sb, sess.id)
            if not case.reason:
                if err is not None:
                    c.error(f"{what}: {err!r}; want it accepted")
                continue
            want_rejected(c, err, case.reason, case.field, what)
            await want_listed(c, sb)


_INVALID: list[tuple[str, str, dict[str, Any]]] = [
    ("image=''", "image", {"image": ""}),
    ("ttl_seconds=0", "ttl_seconds", {"ttl_seconds": 0}),
    ("ttl_seconds=-5", "ttl_seconds", {"ttl_seconds": -5}),
    ("cpu=-1", "cpu", {"cpu": -1.0}),
    ("memory_mb=-1", "memory_mb", {"memory_mb": -1}),
    ("durability=forever", "durability", {"durability": "forever"}),
    ("network=wide", "network", {"network": "wide"}),
    ("isolation=chroot", "isolation", {"isolation": "chroot"}),
    (
        "persistent without a workspace_key",
        "workspace_key",
        {"durability": "persistent", "workspace_key": ""},
    ),
    ("a label key with a space", "labels", {"labels": {"has space": "x"}}),
    ("an env key with '='", "env", {"env": {"A=B": SecretStr("v")}}),
]


@clause("Spec/Invalid")
async def invalid(c: Check) -> None:
    """A malformed spec is rejected as invalid (a SandboxSpecRejectedError naming the field),
    by the model when it is made and by create_session when it is handed one unvalidated
    (model_construct); none makes a session."""
    sb = await c.sandbox()
    for name, fld, changes in _INVALID:
        fields = c.spec_fields(**changes)

        async def make(f: dict[str, Any] = fields) -> SandboxSessionSpec:
            return SandboxSessionSpec(**f)

        _, err = await attempt(make())
        want_rejected(c, err, "invalid", fld, f"SandboxSessionSpec with {name}")
        sess, err = await attempt(sb.create_session(SandboxSessionSpec.model_construct(**fields)))
        if sess is not None:
            c.destroy_at_end(sb, sess.id)
        want_rejected(c, err, "invalid", fld, f"create_session of an unvalidated spec with {name}")
    await want_listed(c, sb)


@clause("Spec/Policy")
async def policy_rules(c: Check) -> None:
    """A spec that breaks the operator policy is rejected as a policy violation, its message
    saying so: a network looser than the egress ceiling, an isolation below the floor (the
    provider's own level, isolation unset, included), persistent while durable is off."""
    cases: list[_Case] = []
    for floor in ISOLATIONS:
        pol = _policy(isolation=floor)
        for iso in ISOLATIONS:
            if strength(iso) < strength(floor):
                cases.append(
                    _Case(
                        f"isolation={iso} below the floor {floor}",
                        pol,
                        {"isolation": iso},
                        "policy",
                        "isolation",
                    )
                )
        if strength(c.opts.isolation) < strength(floor):
            cases.append(
                _Case(
                    f"isolation unset (own {c.opts.isolation}) below the floor {floor}",
                    pol,
                    {},
                    "policy",
                    "isolation",
                )
            )
    for ceiling in NETWORKS:
        pol = _policy(egress=ceiling)
        for n in NETWORKS:
            if openness(n) > openness(ceiling):
                cases.append(
                    _Case(
                        f"network={n} above the ceiling {ceiling}",
                        pol,
                        {"network": n},
                        "policy",
                        "network",
                    )
                )
    cases.append(
        _Case(
            "persistent while durable is off",
            _policy(durable=False),
            persistent(),
            "policy",
            "durability",
        )
    )
    await _run_cases(c, cases)


@clause("Spec/Unenforceable")
async def unenforceable(c: Check) -> None:
    """What the provider cannot enforce it rejects as unenforceable, never downgrading: an
    unknown image, a network tier it does not honour, a stronger isolation than its own, caps
    it does not enforce, persistence without durable storage."""

    def case(name: str, fld: str, changes: dict[str, Any]) -> _Case:
        return _Case(name, PERMISSIVE, changes, "unenforceable", fld)

    cases = [case("image=tai42-no-such-image", "image", {"image": "tai42-no-such-image"})]
    for n in NETWORKS:
        if n not in c.opts.networks:
            cases.append(case(f"network={n}", "network", {"network": n}))
    for iso in ISOLATIONS:
        if strength(iso) > strength(c.opts.isolation):
            cases.append(case(f"isolation={iso}", "isolation", {"isolation": iso}))
    if not c.opts.caps:
        cases.append(case("cpu=1", "cpu", {"cpu": 1.0}))
        cases.append(case("memory_mb=64", "memory_mb", {"memory_mb": 64}))
    if not c.opts.durable:
        cases.append(case("persistent", "durability", persistent()))
    await _run_cases(c, cases)


@clause("Spec/Accepted")
async def accepted(c: Check) -> None:
    """What the provider honours within the policy is accepted: each honoured network (at the
    ceiling too), the provider's own isolation named or left unset at a floor it meets;
    scrub_transcript is no create-time gate."""
    cases = [
        _Case(f"network={n} at the ceiling", _policy(egress=n), {"network": n})
        for n in c.opts.networks
    ]
    at_floor = _policy(isolation=c.opts.isolation, durable=False)
    cases += [
        _Case("isolation unset at its own floor", at_floor),
        _Case(
            f"isolation={c.opts.isolation} at the floor", at_floor, {"isolation": c.opts.isolation}
        ),
        _Case("scrub_transcript on", _policy(scrub=True)),
    ]
    await _run_cases(c, cases)


@clause("Spec/NetworkNone")
async def network_none(c: Check) -> None:
    """A session on network none sees loopback only."""
    if "none" not in c.opts.networks:
        c.skip("the provider does not honour network none")
    _, sess = await c.fresh(network="none")
    # /proc/net/dev shows the reader's own network namespace.
    res = await run(c, sess, ["cat", "/proc/net/dev"])
    if res.exit_code == 0:
        names = [ln.split(":", 1)[0].strip() for ln in res.stdout.splitlines() if ":" in ln]
    else:
        res = await run(c, sess, ["ls", "/sys/class/net"])
        if res.exit_code != 0:
            c.skip("neither /proc/net/dev nor /sys/class/net is readable in the session")
        names = res.stdout.split()
    if any(n != "lo" for n in names):
        c.error(f"a session on network none sees the interfaces {names}; want loopback only")


def _alloc(n: int) -> list[str]:
    """A shell holding n bytes in memory, then printing n."""
    return sh_argv(f"x=$(head -c {n} /dev/zero | tr '\\0' a); echo ${{#x}}")


def _need_caps(c: Check) -> None:
    if not c.opts.caps:
        c.skip("Options.caps is false: the provider enforces no caps")


@clause("Spec/MemoryCap")
async def memory_cap(c: Check) -> None:
    """A memory cap is enforced: a command allocating far past it does not succeed."""
    _need_caps(c)
    _, sess = await c.fresh(memory_mb=64)
    res = await run(c, sess, _alloc(1_000_000))
    if res.exit_code != 0 or res.stdout != "1000000\n":
        c.fatal(f"holding 1 MB under a 64 MiB cap: {res!r}; want exit 0 and 1000000")
    res2, err = await attempt(sess.exec(_alloc(200_000_000), timeout_seconds=30))
    if err is None and res2 is not None and res2.exit_code == 0:
        c.error(f"a command holding 200 MB under memory_mb 64 succeeded ({res2.stdout!r})")
    elif err is not None:
        want_kind(c, err, E.SandboxError, "an exec past its memory cap")


@clause("Spec/CPUCap")
async def cpu_cap(c: Check) -> None:
    """A fractional CPU cap is accepted and commands run under it."""
    _need_caps(c)
    _, sess = await c.fresh(cpu=0.5)
    res = await run(c, sess, ["echo", "ok"])
    if (res.exit_code, res.stdout) != (0, "ok\n"):
        c.error(f"exec(echo ok) under cpu 0.5 = {res!r}; want exit 0 and 'ok'")


_SPIN = (
    "read u _ </proc/uptime; n=${u%.*}${u#*.}; e=$((n+TICKS))\n"
    'while [ "$n" -lt "$e" ]; do\n'
    "\ti=0; while [ $i -lt 200 ]; do i=$((i+1)); done\n"
    "\tread u _ </proc/uptime; n=${u%.*}${u#*.}\n"
    "done\n"
    "read -r st </proc/$$/stat; set -- ${st#*) }; echo $((${12}+${13}))"
)


def _spin(wall: int) -> list[str]:
    """A shell keeping a CPU busy for wall seconds (read from /proc/uptime,
    in hundredths), then printing the CPU time it got, in clock ticks (100 a
    second)."""
    return sh_argv(_SPIN.replace("TICKS", str(wall * 100)))


@clause("Spec/CPUCapThrottles")
async def cpu_cap_throttles(c: Check) -> None:
    """A CPU cap is applied, not only accepted: a command spinning for 1 s of wall time under
    cpu 0.1 gets at most a quarter of a second of CPU, while the same command in an uncapped
    session alongside, the control, gets more than twice as much (skipped when, five times,
    the machine is too loaded for the control to show it). The cap is small so that a loaded
    machine still leaves the control enough to show it."""
    _need_caps(c)
    sb, capped = await c.fresh(cpu=0.1)
    control = await c.session(sb)

    async def ticks(s: Any) -> int:
        res = await run(c, s, _spin(1), timeout=EXEC_TIMEOUT)
        if res.exit_code != 0:
            c.fatal(f"spinning for 1 s: exit code {res.exit_code}, stderr {res.stderr!r}")
        return int(res.stdout.strip())

    rounds = 5
    for rnd in range(1, rounds + 1):
        got, ctl = await asyncio.gather(ticks(capped), ticks(control))
        if got > 25:
            c.fatal(
                f"a command spinning for 1 s under cpu 0.1 got {got / 100:.2f} s of CPU "
                f"(uncapped alongside: {ctl / 100:.2f} s); want at most 0.25 s"
            )
        if ctl > 25 and ctl > 2 * got:
            return
        if rnd == rounds:
            c.skip(
                f"the uncapped control got only {ctl / 100:.2f} s of CPU in 1 s (capped: "
                f"{got / 100:.2f} s), {rounds} times: the machine is too loaded to tell a cap"
            )
