"""The suite's machinery: Options, Config, the clause registry, the Check a
clause runs with, and :func:`run`.

A clause is an ``async def`` taking a :class:`Check`, registered under its
name ("Group/Clause") with :func:`clause`; its docstring says what it proves
(CLAUSES.md is made from them). A clause reports through its Check as a Go
test does through ``testing.T``: :meth:`Check.error` records a failure and
goes on, :meth:`Check.fatal` records one and ends the clause,
:meth:`Check.skip` ends it as not applicable. Every sandbox and session it
makes is torn down when it ends, however it ends, and the whole clause is
bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import time
import traceback
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NoReturn, TypeVar

from ..base import Sandbox, SandboxSession
from ..models import (
    SandboxIsolation,
    SandboxNetwork,
    SandboxSessionSpec,
)
from ..policy import SandboxPolicy

T = TypeVar("T")

# How long a clause may take, all its calls together; how long its teardown
# may take after that.
CLAUSE_TIMEOUT = 60.0
CLEANUP_TIMEOUT = 30.0

# The tiers in the contract's order, weakest first. The suite ranks by these
# lists, never by the contract's own rank functions, so that ranks swapped
# there are caught (Contract/PolicyRanks) rather than mirrored.
ISOLATIONS: tuple[SandboxIsolation, ...] = ("none", "container", "vm")
NETWORKS: tuple[SandboxNetwork, ...] = ("none", "internal", "egress")


def strength(isolation: str) -> int:
    """The rank of an isolation in the contract's order."""
    return ISOLATIONS.index(isolation)


def openness(network: str) -> int:
    """The rank of a network in the contract's order."""
    return NETWORKS.index(network)


def _discard(line: str) -> None:
    del line


@dataclass(frozen=True)
class Config:
    """What the suite asks of the factory for one fresh sandbox.

    ``policy`` is the policy the sandbox enforces. ``reap_interval_seconds``
    is the background reaper's cadence, None for the provider's default: the
    suite asks for a long one (an hour) where reap results must be exact and
    a short one (0.1 s) to test the reaper. ``log`` receives every line the
    provider logs, at every level (debug included), when the factory can
    route them (:attr:`Options.logs`): the suite reads them for secrets.
    """

    policy: SandboxPolicy
    reap_interval_seconds: float | None = None
    log: Callable[[str], None] = field(default=_discard, compare=False, repr=False)


Factory = Callable[[Config], AbstractAsyncContextManager[Sandbox]]
"""Makes a fresh, independent sandbox for a Config: an async context manager
whose ``__aenter__`` gives the sandbox and whose ``__aexit__`` closes it and
removes whatever it made. The suite enters it inside the clause's event
loop, once per sandbox a clause needs, and always exits it. A provider that
refuses to be made with a policy no session could ever meet (an isolation
floor above its own level) raises :class:`ConfigRefused` from
``__aenter__``."""


class ConfigRefused(Exception):
    """Raised by a factory whose provider refuses the Config itself, as
    ``tai42 serve`` refuses an isolation floor above its provider's level:
    every session would be rejected. The suite accepts it for such a policy
    only; for any other Config it is a failure."""


@dataclass(frozen=True)
class UserOptions:
    """A user the provider's image knows (in its /etc/passwd) and the
    provider can run an exec as: its name, its passwd entry's uid and gid,
    and its home; for most images nobody, 65534, 65534, /nonexistent."""

    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class Options:
    """What the provider under test documents that it honours.

    ``image`` an image it honours ("host"); ``isolation`` its own level;
    ``networks`` the tiers it honours (every other must be rejected as
    unenforceable); ``durable``: it has durable storage, so persistent
    sessions work (else they must be rejected as unenforceable); ``caps``:
    cpu and memory_mb are enforced (else rejected as unenforceable).

    ``absolute_outside_workspace_refused`` is true for providers whose
    sessions share the host's filesystem (isolation none): an absolute path
    outside workspace_path is refused, and the suite also checks the host
    side (the suite must then run on the provider's host).
    ``kill_stops_leftovers``: kill after the command exited also ends the
    processes it left running, as the provider documents. ``logs``: the
    factory routes the provider's log lines to :attr:`Config.log`.

    ``user`` is a user the image knows, for the exec-as-user extension
    (an exec's ``user=`` keyword, beyond the contract's signature): set, the
    User clauses run execs as it (by name, uid and uid:gid); None, a
    provider whose exec takes ``user`` must refuse it with a SandboxError,
    never ignore it. A provider whose exec has no ``user`` keyword skips the
    User clauses.
    """

    image: str
    isolation: SandboxIsolation
    networks: Sequence[SandboxNetwork]
    durable: bool = False
    caps: bool = False
    absolute_outside_workspace_refused: bool = False
    kill_stops_leftovers: bool = False
    logs: bool = False
    user: UserOptions | None = None

    def validate(self) -> None:
        """Raise ValueError for options no provider can have."""
        if not self.image:
            raise ValueError("Options.image must name an image the provider honours")
        if self.isolation not in ISOLATIONS:
            raise ValueError(
                f"Options.isolation {self.isolation!r} is not one of none, container, vm"
            )
        if not self.networks:
            raise ValueError("Options.networks must list the tiers the provider honours")
        for n in self.networks:
            if n not in NETWORKS:
                raise ValueError(f"Options.networks holds {n!r}, not one of none, internal, egress")


PERMISSIVE = SandboxPolicy(egress="egress", isolation="none", scrub_transcript=False, durable=True)
"""The policy of every clause but the policy-rule ones."""

EXACT = Config(policy=PERMISSIVE, reap_interval_seconds=3600.0)
"""The config of clauses that need exact reap results: no background
reaper interferes."""

ClauseFunc = Callable[["Check"], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Clause:
    """One clause: its name, "Group/Clause", what it proves, and its check."""

    name: str
    doc: str
    func: ClauseFunc

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]


GROUPS: tuple[str, ...] = (
    "Contract",
    "Sandbox",
    "Spec",
    "Session",
    "Durability",
    "Exec",
    "ExecStart",
    "Cancel",
    "Files",
    "User",
)
"""The groups, in the order the suite runs and lists them."""

_registry: dict[str, Clause] = {}


def clause(name: str) -> Callable[[ClauseFunc], ClauseFunc]:
    """Register the decorated check as the clause ``name``; its docstring
    (required) is what the clause proves."""
    group, sep, rest = name.partition("/")
    if not sep or not rest or "/" in rest or group not in GROUPS:
        raise ValueError(f"clause name {name!r} is not Group/Clause of a known group")

    def deco(func: ClauseFunc) -> ClauseFunc:
        doc = " ".join((func.__doc__ or "").split())
        if not doc:
            raise ValueError(f"clause {name}: its check has no docstring saying what it proves")
        if name in _registry:
            raise ValueError(f"clause {name} is registered twice")
        _registry[name] = Clause(name, doc, func)
        return func

    return deco


def clauses() -> list[Clause]:
    """Every clause, grouped in GROUPS order, each group in the order its
    clauses were registered."""
    from . import _checks  # noqa: F401  (registers the clauses)

    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(_registry.values(), key=lambda c: order[c.group])


def select(patterns: Iterable[str] | str | None) -> list[Clause]:
    """The clauses whose names match one of patterns (fnmatch, "Exec/*");
    all for None. A pattern matching no clause is a ValueError."""
    every = clauses()
    if patterns is None:
        return every
    if isinstance(patterns, str):
        patterns = [patterns]
    chosen: set[str] = set()
    for p in patterns:
        hits = {c.name for c in every if fnmatch.fnmatchcase(c.name, p)}
        if not hits:
            raise ValueError(f"no clause matches {p!r}")
        chosen |= hits
    return [c for c in every if c.name in chosen]


class _Fatal(Exception):
    """Ends a clause after Check.fatal."""


class _Skip(Exception):
    """Ends a clause after Check.skip."""


Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class ClauseResult:
    """How one clause went: "pass", "fail" (``messages`` say why) or "skip"
    (``messages`` hold the reason)."""

    name: str
    status: Status
    messages: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def reason(self) -> str:
        return "\n".join(self.messages)


@dataclass(frozen=True)
class Report:
    """The result of every clause run, in the order run."""

    results: tuple[ClauseResult, ...]

    def _names(self, status: Status) -> list[str]:
        return [r.name for r in self.results if r.status == status]

    @property
    def passed(self) -> list[str]:
        return self._names("pass")

    @property
    def failed(self) -> list[str]:
        return self._names("fail")

    @property
    def skipped(self) -> list[str]:
        return self._names("skip")

    @property
    def ok(self) -> bool:
        """No clause failed."""
        return not self.failed

    def result(self, name: str) -> ClauseResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def __str__(self) -> str:
        lines = []
        for r in self.results:
            lines.append(f"{r.status.upper():4} {r.name} ({r.seconds:.1f}s)")
            lines.extend("     " + m.replace("\n", "\n     ") for m in r.messages)
        lines.append(
            f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.skipped)} skipped"
        )
        return "\n".join(lines)


class Check:
    """What a clause runs with: the provider's factory and options, the
    failures recorded so far, and the teardown of what the clause made."""

    def __init__(self, name: str, factory: Factory, options: Options) -> None:
        self.name = name
        self.opts = options
        self._factory = factory
        self.messages: list[str] = []
        self.failed = False
        self.logs: list[str] = []
        self._stacks: list[AsyncExitStack] = [AsyncExitStack()]
        self._tasks: set[asyncio.Task[Any]] = set()

    # Reporting.

    def error(self, msg: str) -> None:
        """Record a failure and go on."""
        self.failed = True
        self.messages.append(msg)

    def fatal(self, msg: str) -> NoReturn:
        """Record a failure and end the clause."""
        self.error(msg)
        raise _Fatal(msg)

    def skip(self, reason: str) -> NoReturn:
        """End the clause as not applicable to this provider."""
        raise _Skip(reason)

    def log(self, msg: str) -> None:
        """Note something that is no failure (shown with the result)."""
        self.messages.append("note: " + msg)

    def _log_line(self, line: str) -> None:
        self.logs.append(line)

    # Teardown.

    def defer(self, func: Callable[[], Awaitable[Any]]) -> None:
        """Run func when the innermost scope (the clause, or a scope())
        ends, bounded, its failures recorded."""

        async def bounded() -> None:
            try:
                await asyncio.wait_for(func(), CLEANUP_TIMEOUT)
            except asyncio.TimeoutError:
                self.error(f"a teardown step ({func!r}) did not return within {CLEANUP_TIMEOUT}s")

        self._stacks[-1].push_async_callback(bounded)

    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[None]:
        """A nested teardown scope: what is made inside is torn down at its
        end, not the clause's."""
        stack = AsyncExitStack()
        self._stacks.append(stack)
        try:
            yield
        finally:
            self._stacks.pop()
            await stack.aclose()

    def task(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start coro as a task that is cancelled, if still running, when
        the clause ends."""
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # Sandboxes and sessions.

    async def sandbox(self, cfg: Config | None = None) -> Sandbox:
        """A fresh sandbox from the factory (the permissive policy by
        default), closed when the scope ends."""
        cfg = replace(cfg or Config(policy=PERMISSIVE), log=self._log_line)
        cm = self._factory(cfg)
        stack = self._stacks[-1]
        try:
            sb = await stack.enter_async_context(cm)
        except (_Fatal, _Skip, ConfigRefused):
            raise
        except Exception as e:
            self.fatal(f"the factory could not make a sandbox for {cfg}: {e!r}")
        if not isinstance(sb, Sandbox):
            self.fatal(f"the factory made {sb!r}, not a tai42_contract Sandbox")
        return sb

    def spec(self, **changes: Any) -> SandboxSessionSpec:
        """The suite's default spec (an ephemeral session of the provider's
        image on its tightest honoured network, ttl 600 s), changed."""
        return SandboxSessionSpec(**self.spec_fields(**changes))

    def spec_fields(self, **changes: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "image": self.opts.image,
            "durability": "ephemeral",
            "network": min(self.opts.networks, key=openness),
            "ttl_seconds": 600,
            "labels": {"suite": "tai42-contract"},
        }
        fields.update(changes)
        return fields

    async def session(self, sb: Sandbox, **changes: Any) -> SandboxSession:
        """A session of the default spec changed, destroyed when the scope
        ends."""
        try:
            sess = await sb.create_session(self.spec(**changes))
        except Exception as e:
            self.fatal(f"create_session: {e!r}")
        if not isinstance(sess, SandboxSession):
            self.fatal(f"create_session returned {sess!r}, not a SandboxSession")
        if not isinstance(sess.id, str) or not sess.id:
            self.fatal(f"create_session returned a session with the id {sess.id!r}")
        self.destroy_at_end(sb, sess.id)
        return sess

    def destroy_at_end(self, sb: Sandbox, session_id: str) -> None:
        """Destroy the session when the scope ends; destroy_session is
        idempotent, so an error there is a failure."""

        async def destroy() -> None:
            try:
                await sb.destroy_session(session_id)
            except Exception as e:
                self.error(
                    f"destroy_session({session_id!r}) at the end of the clause: {e!r}; "
                    "destroy_session is idempotent and tears a session down"
                )

        self.defer(destroy)

    async def fresh(self, **changes: Any) -> tuple[Sandbox, SandboxSession]:
        """A fresh sandbox with the permissive policy and one session."""
        sb = await self.sandbox()
        return sb, await self.session(sb, **changes)

    @property
    def host_fs(self) -> bool:
        """Sessions share the host's filesystem: the suite may look there."""
        return self.opts.absolute_outside_workspace_refused

    def need_host_fs(self) -> None:
        if not self.host_fs:
            self.skip(
                "Options.absolute_outside_workspace_refused is false: sessions do not share "
                "the host's filesystem"
            )

    def need_durable(self) -> None:
        if not self.opts.durable:
            self.skip("Options.durable is false: the provider has no durable storage")

    async def _teardown(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        while self._stacks:
            stack = self._stacks.pop()
            try:
                await stack.aclose()
            except Exception as e:
                self.error(f"tearing the clause down: {e!r}")


def _trace(limit: int = 12) -> str:
    return "".join(traceback.format_exc(limit=-limit))


# The variable set in this process while the suite runs; no exec may see
# it: an exec's environment is the session's and the exec's, never the
# host's. A provider started meanwhile (a daemon the factory starts)
# inherits it.
MARKER_VAR = "TAI42_SUITE_MARKER"
_marker_users = 0


@contextlib.contextmanager
def _marked() -> Iterator[None]:
    global _marker_users
    if _marker_users == 0:
        os.environ[MARKER_VAR] = "host-environment-leaked"
    _marker_users += 1
    try:
        yield
    finally:
        _marker_users -= 1
        if _marker_users == 0:
            os.environ.pop(MARKER_VAR, None)


async def run_clause(
    c: Clause, factory: Factory, options: Options, *, timeout: float = CLAUSE_TIMEOUT
) -> ClauseResult:
    """Run one clause on sandboxes from factory, bounded by timeout."""
    options.validate()
    check = Check(c.name, factory, options)
    skipped: list[str] = []
    expired = False
    begin = time.monotonic()

    async def body() -> None:
        nonlocal expired
        try:
            await c.func(check)
        except _Fatal:
            pass
        except _Skip as s:
            skipped.append(str(s))
        except ConfigRefused as e:
            check.error(f"the factory refused a Config the provider can meet: {e}")
        except asyncio.CancelledError:
            if not expired:
                raise
            # The suite's own deadline: the task goes on to its teardown,
            # no longer being cancelled (Python 3.11+ counts cancels).
            me = asyncio.current_task()
            if me is not None and hasattr(me, "uncancel"):
                me.uncancel()
            check.error(
                f"the clause did not finish within {timeout:g}s; it was waiting here:\n{_trace()}"
            )
        except Exception as e:
            check.error(f"the clause raised {type(e).__name__}: {e}\n{_trace()}")
        finally:
            await check._teardown()

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    with _marked():
        task = asyncio.ensure_future(body())
        timer = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            await task
        finally:
            timer.cancel()
    took = time.monotonic() - begin
    if check.failed:
        return ClauseResult(c.name, "fail", tuple(check.messages), took)
    if skipped:
        return ClauseResult(c.name, "skip", tuple(skipped), took)
    return ClauseResult(c.name, "pass", tuple(check.messages), took)


async def run(
    factory: Factory,
    options: Options,
    *,
    clauses: Iterable[str] | str | None = None,
    concurrency: int = 1,
    clause_timeout: float = CLAUSE_TIMEOUT,
) -> Report:
    """Run the conformance suite against the sandboxes factory makes.

    Every clause runs on sandboxes of its own from the factory, bounded by
    clause_timeout, with everything it made torn down at its end.
    ``clauses`` selects by name or fnmatch pattern ("Exec/*"); None runs
    all. ``concurrency`` clauses run at once (the factory must then make
    independent sandboxes concurrently). The Report says how each went; run
    raises only for bad arguments.
    """
    options.validate()
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    chosen = select(clauses)
    sem = asyncio.Semaphore(concurrency)

    async def one(c: Clause) -> ClauseResult:
        async with sem:
            return await run_clause(c, factory, options, timeout=clause_timeout)

    with _marked():
        results = await asyncio.gather(*(one(c) for c in chosen))
    return Report(tuple(results))


def clauses_markdown() -> str:
    """CLAUSES.md: every clause with what it proves."""
    out = [
        "# The clauses of the Python conformance suite",
        "",
        "Every clause `tai42_contract.sandbox.testing.run` runs (and the pytest plugin makes "
        "a test of), by the name that selects it, and what it proves.",
        "Made from the clauses' docstrings by "
        "`python -m tai42_contract.sandbox.testing --clauses-md`; a test fails when it is "
        "out of date.",
    ]
    group = ""
    for c in clauses():
        if c.group != group:
            group = c.group
            out += ["", f"## {group}", "", "| Clause | What it proves |", "|---|---|"]
        out.append(f"| `{c.name}` | {c.doc.replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"
