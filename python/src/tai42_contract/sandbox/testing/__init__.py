"""The conformance suite of the sandbox contract, for any Python provider.

A provider proves that its :class:`~tai42_contract.sandbox.Sandbox` keeps
the contract by running every clause of it against sandboxes it makes, as
Go providers do with ``sandboxtest.Run``::

    import contextlib
    from tai42_contract.sandbox.testing import Config, Options, run

    @contextlib.asynccontextmanager
    async def factory(cfg: Config):
        sb = MySandbox(policy=cfg.policy, reap_interval=cfg.reap_interval_seconds)
        try:
            yield sb
        finally:
            await sb.close()

    report = await run(factory, Options(image="host", isolation="none",
                                        networks=["none", "egress"], durable=True))
    assert report.ok, str(report)

or, under pytest, through :mod:`.pytest_plugin` (one test per clause).
Every clause runs on sandboxes of its own from the factory (an async context
manager per :class:`Config`), bounded by a deadline, with every session it
made destroyed at its end however it ends. A clause that does not apply to
the provider's :class:`Options` is skipped with the reason. CLAUSES.md,
beside this package's source, lists every clause with what it proves.

Sessions must offer a POSIX sh and the usual utilities (cat, echo, printf,
sleep, head, tail, tr, wc, ls, pwd, ln, mkfifo, chmod, id, kill, env) on
their PATH. While the suite runs it sets TAI42_SUITE_MARKER in its own
process's environment and checks that no exec sees it.

This package depends on the contract and the standard library only; pytest
is imported by the plugin module alone.
"""

from ._suite import (
    CLAUSE_TIMEOUT,
    EXACT,
    PERMISSIVE,
    Clause,
    ClauseResult,
    Config,
    ConfigRefused,
    Factory,
    Options,
    Report,
    UserOptions,
    clauses,
    clauses_markdown,
    run,
    run_clause,
    select,
)

__all__ = [
    "CLAUSE_TIMEOUT",
    "EXACT",
    "PERMISSIVE",
    "Clause",
    "ClauseResult",
    "Config",
    "ConfigRefused",
    "Factory",
    "Options",
    "Report",
    "UserOptions",
    "clauses",
    "clauses_markdown",
    "run",
    "run_clause",
    "select",
]
