"""The suite's checks can fail: each mutant (a real host daemon with one bug,
see mutants.py) runs the clauses it names, and exactly those fail; the
control, the real daemon itself, passes every clause a mutant names; every
clause has a mutant, or a reason in PENDING why none can fail it here."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from tai42_contract.sandbox import Sandbox
from tai42_contract.sandbox.testing import Config, Factory, Options, clauses, run

from .conftest import daemon_factory, options_for
from .mutants import MUTANTS, PENDING, Mutant, UserRefused
from .wrappers import MSandbox, wrap


def daemon(binary: str, name: str) -> tuple[Factory, Options]:
    """The factory and options of a mutant's daemon (Mutant.daemon)."""
    if name == "host-no-user":
        base = Mutant("host-no-user", "", (), wrap(session=UserRefused))
        opts = dataclasses.replace(options_for("host"), user=None)
        return mutated(daemon_factory(binary, "host"), base), opts
    if name == "host-nobody":
        if os.geteuid() != 0:
            pytest.skip("running a daemon as nobody needs root")
        return daemon_factory(binary, "host", nobody=True), options_for("host", root=False)
    return daemon_factory(binary, name), options_for(name)


def mutated(factory: Factory, m: Mutant) -> Factory:
    """factory with m's bug."""

    @contextlib.asynccontextmanager
    async def make(cfg: Config) -> AsyncIterator[Sandbox]:
        async with factory(m.config(cfg) if m.config else cfg) as sb:
            if m.wrap is None:
                yield sb
                return
            w = m.wrap(sb, cfg)
            try:
                yield w
            finally:
                if isinstance(w, MSandbox):
                    await w.aclose()

    return make


@contextlib.contextmanager
def patched(m: Mutant) -> Iterator[None]:
    if m.patch is None:
        yield
        return
    with m.patch():
        yield


def test_every_clause_has_a_mutant() -> None:
    names = {c.name for c in clauses()}
    targets = {c for m in MUTANTS for c in m.clauses}
    assert not targets - names, f"mutants name clauses that do not exist: {targets - names}"
    assert not set(PENDING) - names, f"PENDING names no clause: {set(PENDING) - names}"
    assert not set(PENDING) & targets, (
        f"clauses both pending and targeted: {set(PENDING) & targets}"
    )
    assert names <= targets | set(PENDING), (
        f"clauses without a mutant: {names - targets - set(PENDING)}"
    )
    assert len({m.name for m in MUTANTS}) == len(MUTANTS), "two mutants share a name"


@pytest.mark.parametrize("name", sorted({m.daemon for m in MUTANTS}))
async def test_control(tai42_bin: str, name: str) -> None:
    """The real daemon passes every clause its mutants name: none is
    skipped, so each can tell a mutant from it."""
    targets = sorted({c for m in MUTANTS if m.daemon == name for c in m.clauses})
    factory, opts = daemon(tai42_bin, name)
    report = await run(factory, opts, clauses=targets)
    assert report.ok, str(report)
    skipped = [r for r in report.results if r.status == "skip" and not _loaded(r.name, r.reason)]
    assert not skipped, f"clauses a mutant names skip on the real daemon:\n{report}"


def _loaded(name: str, reason: str) -> bool:
    """Spec/CPUCapThrottles skips when the machine is too loaded for its
    uncapped control to show a cap (two shared cores): its mutant
    (fractional-cpu-rejected) fails it at create, whatever the load."""
    return name == "Spec/CPUCapThrottles" and "too loaded" in reason


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
async def test_mutant(m: Mutant, tai42_bin: str) -> None:
    real, opts = daemon(tai42_bin, m.daemon)
    with patched(m):
        report = await run(
            mutated(real, m), opts, clauses=list(m.clauses), concurrency=len(m.clauses)
        )
    assert set(report.failed) == set(m.clauses), (
        f"mutant {m.name} ({m.bug}): want exactly {sorted(m.clauses)} failing, "
        f"got {report.failed}:\n{report}"
    )
