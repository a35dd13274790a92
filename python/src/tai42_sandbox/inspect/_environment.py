"""The tai42 sandbox environment of Inspect AI.

Lifecycle: ``task_init`` checks the config and that the daemon answers and
accepts the session spec (one session created and destroyed), so a wrong
image or a missing daemon fails the eval at once, not every sample.
``sample_init`` creates one session per sample, labelled with the run, the
task, the sample, the epoch and an id of its own made before the create;
``sample_cleanup`` destroys it, interrupted or not, shielded from
cancellation. A create the sample was cancelled in, whose answer never
came, is found by that id and destroyed there and then. ``task_cleanup``
destroys whatever of this run is left (with ``--no-sandbox-cleanup`` it
lists it instead), and ``inspect sandbox cleanup tai42 [ID]`` destroys
every session this integration made, or one. A session whose eval died
with its process ends ``ttl_seconds`` after its last use.

Errors are Inspect's: TimeoutError (an exec past its timeout),
OutputLimitExceededError (an exec's stream or a file read past Inspect's
limits, with the exec killed at the limit), FileNotFoundError,
IsADirectoryError and PermissionError (told apart, where the daemon's error
has no kind for them, by a probe run in the session after the failure),
UnicodeDecodeError (a text read of a file that is not UTF-8), and
SandboxUnavailableError when the session is gone (expired, destroyed, or
its daemon stopping). A daemon that cannot be reached is the client's
SandboxError saying so. An exec as a user the session does not know
is a failed result (exit 126) naming the user, as with docker. Exec output
that is not UTF-8 is decoded with replacement characters.
"""

from __future__ import annotations

import errno
import logging
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, overload

import anyio
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    sandboxenv,
)
from pydantic import BaseModel
from typing_extensions import override

from tai42_contract.sandbox.errors import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxSessionNotFoundError,
    SandboxUserNotFoundError,
)
from tai42_contract.sandbox.models import SandboxSessionInfo
from tai42_sandbox import SandboxTransportError, Tai42Sandbox, Tai42Session

from ._config import CONFIG_FILES, LABEL_PREFIX, Tai42SandboxConfig, load_config
from ._exec import (
    EXEC_PROBE,
    FILE_PROBE,
    PINNED_PATH,
    OutputOverLimit,
    TimedOut,
    probe,
    run_streamed,
)

logger = logging.getLogger(__name__)

LABEL_RUN = LABEL_PREFIX + "run"
LABEL_TASK = LABEL_PREFIX + "task"
LABEL_SAMPLE = LABEL_PREFIX + "sample"
LABEL_EPOCH = LABEL_PREFIX + "epoch"
LABEL_ENVIRONMENT = LABEL_PREFIX + "environment"

# Bound on each teardown call (a destroy, a list, a close), shielded from
# the cancellation that may have caused it.
CLEANUP_TIMEOUT = 60.0

# A session is touched at most this often (or each quarter of a shorter
# ttl): often enough that it outlives its last use by about its ttl.
TOUCH_EVERY = 60.0

_MAX_LABEL_VALUE = 1024


@sandboxenv(name="tai42")
class Tai42SandboxEnvironment(SandboxEnvironment):
    """One sample environment: a session of the tai42 daemon.

    Made by ``sample_init``; use it as ``sandbox()`` in a solver or tool
    (``sandbox().as_type(Tai42SandboxEnvironment)`` for this class).
    ``session_id`` is its session's id (as ``tai42 ls`` shows it).
    """

    def __init__(self, client: Tai42Sandbox, session: Tai42Session, config: Tai42SandboxConfig):
        super().__init__()
        self._client = client
        self._session = session
        self._config = config
        self._touched = time.monotonic()
        self._closed = False

    @property
    def session_id(self) -> str:
        return self._session.id

    @property
    def session(self) -> Tai42Session:
        """The client's session, for what Inspect's face lacks (an
        interactive exec_start, info()). Its destroy is sample_cleanup's."""
        return self._session

    # ----- the provider's face -------------------------------------------

    @override
    @classmethod
    def config_files(cls) -> list[str]:
        return list(CONFIG_FILES)

    @override
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return Tai42SandboxConfig.model_validate(config)

    @override
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        cfg = load_config(config)
        async with _connected(cfg) as client:
            # The spec the samples will use, tried once: an image the
            # daemon lacks or a policy it refuses fails here, by name.
            env_id = uuid.uuid4().hex
            session = await _create(client, cfg, _labels(task_name, None, None, env_id))
            await _destroy(client, session.id)

    @override
    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        cfg = load_config(config)
        sample_id, epoch = _sample()
        if sample_id is None:
            sample_id = metadata.get("__sample_id__")
        labels = _labels(task_name, sample_id, epoch, uuid.uuid4().hex)
        client = _client(cfg)
        try:
            await client.connect()
            session = await _create(client, cfg, labels)
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
                await _aclose(client)
            raise
        return {"default": cls(client, session, cfg)}

    @override
    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        # Interrupted or not: a session left for task_cleanup would hold its
        # resources while the rest of the eval runs.
        for environment in environments.values():
            await environment.as_type(Tai42SandboxEnvironment).close()

    @override
    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        cfg = load_config(config)
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
            async with _connected(cfg) as client:
                left = [
                    s for s in await client.list_sessions() if s.labels.get(LABEL_RUN) == _run_id()
                ]
                if not cleanup:
                    _report_kept(left)
                    return
                for s in left:
                    await _destroy(client, s.id)

    @override
    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        async with _connected(Tai42SandboxConfig()) as client:
            if id is not None:
                info = await _session_info(client, id)
                if LABEL_RUN not in info.labels:
                    raise ValueError(
                        f"tai42 session {id} was not made by Inspect (it has no {LABEL_RUN} "
                        f"label): destroy it with 'tai42 rm {id}' if you mean to"
                    )
                await _destroy(client, id)
                print(f"destroyed tai42 session {id}")
                return
            for s in await client.list_sessions():
                if LABEL_RUN in s.labels:
                    await _destroy(client, s.id)
                    print(f"destroyed tai42 session {s.id} ({_describe(s)})")

    @override
    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        command = ["tai42", "shell", *(["--user", user] if user else []), self.session_id]
        prefix = f"TAI42_URL={shlex.quote(self._config.url)} " if self._config.url else ""
        return SandboxConnection(type="tai42", command=prefix + shlex.join(command))

    @override
    def default_polling_interval(self) -> float:
        return 0.2

    async def close(self) -> None:
        """Destroy the session and close the client: idempotent, shielded
        from cancellation, bounded by CLEANUP_TIMEOUT. A session the daemon
        could not destroy is logged by id (its ttl still ends it)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT) as scope:
            try:
                await _destroy(self._client, self.session_id)
            except SandboxError as e:
                logger.warning("tai42 session %s was not destroyed: %s", self.session_id, e)
            finally:
                await _aclose(self._client)
        if scope.cancelled_caught:
            logger.warning(
                "tai42 session %s: destroy did not finish in %gs", self.session_id, CLEANUP_TIMEOUT
            )

    # ----- exec ------------------------------------------------------------

    @override
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        # timeout_retry is for a provider whose transport can hang (docker's
        # CLI); the daemon enforces the timeout itself, and a timed-out
        # command is not run again. concurrency throttles local processes.
        seconds = float(timeout) if timeout is not None else self._config.default_exec_timeout()
        stdin = input.encode("utf-8") if isinstance(input, str) else input
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        await self._keep_alive(seconds)
        try:
            r = await run_streamed(
                self._session,
                cmd,
                stdin=stdin,
                cwd=cwd,
                env=env,
                user=user,
                timeout_seconds=seconds,
                limit=limit,
            )
        except SandboxUserNotFoundError as e:
            # As docker's exec does: a result the caller (the model) reads.
            return ExecResult(False, 126, "", f"{e}\n")
        except TimedOut as e:
            # truncated_output is the attribute Inspect reads partial output from
            timeout_error = TimeoutError(f"Command timed out after {seconds:g} seconds")
            timeout_error.truncated_output = _text(e.stdout) + _text(e.stderr)  # type: ignore[attr-defined]
            raise timeout_error from e.error
        except OutputOverLimit as e:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=_text(e.stdout) + _text(e.stderr),
            ) from None
        except SandboxError as e:
            if _gone(e):
                raise self._unavailable(e) from e
            raise
        if r.exit_code == 126 and cmd and await self._not_executable(cmd[0], cwd, env, user):
            raise PermissionError(errno.EACCES, "Permission denied executing the command", cmd[0])
        return ExecResult(r.exit_code == 0, r.exit_code, _text(r.stdout), _text(r.stderr))

    async def _not_executable(
        self, command: str, cwd: str | None, env: dict[str, str] | None, user: str | None
    ) -> bool:
        # Resolved as the exec resolved it: same user, directory and PATH.
        found = await probe(self._session, EXEC_PROBE, [command], cwd=cwd, env=env, user=user)
        return found == "denied"

    # ----- files -------------------------------------------------------------

    @override
    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        await self._keep_alive()
        try:
            await self._session.put_file(file, data)
        except SandboxError as e:
            raise await self._file_error(file, "write", e) from e

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    @override
    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        await self._keep_alive()
        data = bytearray()
        try:
            async with self._session.open_file(file) as chunks:
                async for chunk in chunks:
                    data += chunk
                    if len(data) > limit:
                        raise OutputLimitExceededError(
                            limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
                            # the content may be large, and binary
                            truncated_output=None,
                        )
        except SandboxFileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from None
        except SandboxError as e:
            raise await self._file_error(file, "read", e) from e
        # newline="" as Inspect asks: bytes decode as they are, \r\n kept
        return bytes(data).decode("utf-8") if text else bytes(data)

    async def _file_error(
        self, file: str, access: Literal["read", "write"], error: SandboxError
    ) -> Exception:
        """The error Inspect expects for a failed read or write of file,
        by what a probe finds there; else the daemon's own error."""
        if _gone(error):
            return self._unavailable(error)
        if isinstance(error, SandboxTransportError):
            return error  # the request itself failed: nothing to find in the session
        found = await probe(self._session, FILE_PROBE, [file, access], env={"PATH": PINNED_PATH})
        if found == "directory":
            return IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if found == "denied":
            return PermissionError(errno.EACCES, "Permission denied", file)
        return error

    # ----- the session's life ----------------------------------------------

    async def _keep_alive(self, needed: float = 0.0) -> None:
        """Touch the session when its last touch is TOUCH_EVERY old (or a
        quarter of a shorter ttl), or when what is left of its life is
        shorter than ``needed`` (an exec's timeout): it then lives
        ttl_seconds past its last use, less that much, and through every
        exec whose timeout is within its ttl."""
        ttl = self._config.ttl_seconds
        every = min(TOUCH_EVERY, ttl / 4)
        started = time.monotonic()
        since = started - self._touched
        if since < every and ttl - since >= needed:
            return
        try:
            await self._session.touch()
        except SandboxError as e:
            if _gone(e):
                raise self._unavailable(e) from e
            raise
        self._touched = started

    def _unavailable(self, error: SandboxError) -> SandboxUnavailableError:
        if isinstance(error, SandboxSessionNotFoundError):
            why = "is gone (it expired, or was destroyed)"
        else:
            why = "is gone: its daemon is stopping"
        return SandboxUnavailableError(f"tai42 session {self.session_id} {why}: {error}")


def _gone(error: SandboxError) -> bool:
    """Whether error says the session cannot run anything any more: Inspect's
    SandboxUnavailableError ("the sandbox is not running")."""
    if isinstance(error, SandboxSessionNotFoundError):
        return True
    return isinstance(error, SandboxTransportError) and error.kind == "shutting_down"


# ----- helpers --------------------------------------------------------------


def _client(cfg: Tai42SandboxConfig) -> Tai42Sandbox:
    token = cfg.token.get_secret_value() if cfg.token is not None else None
    return Tai42Sandbox(url=cfg.url, token=token)


@asynccontextmanager
async def _connected(cfg: Tai42SandboxConfig) -> AsyncIterator[Tai42Sandbox]:
    client = _client(cfg)
    try:
        await client.connect()
        yield client
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
            await _aclose(client)


async def _aclose(client: Tai42Sandbox) -> None:
    try:
        await client.aclose()
    except Exception as e:  # closing never hides the error that led here
        logger.warning("closing the tai42 client: %s", e)


async def _create(
    client: Tai42Sandbox, cfg: Tai42SandboxConfig, labels: dict[str, str]
) -> Tai42Session:
    """A session of cfg's spec with labels. A create cut short (cancelled,
    or its answer lost) may still have made the session: it is found by its
    environment label, which no other session has, and destroyed."""
    try:
        return await client.create_session(cfg.session_spec(labels))
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
            await _destroy_labelled(client, LABEL_ENVIRONMENT, labels[LABEL_ENVIRONMENT])
        raise


async def _destroy_labelled(client: Tai42Sandbox, key: str, value: str) -> None:
    try:
        for s in await client.list_sessions():
            if s.labels.get(key) == value:
                await _destroy(client, s.id)
    except SandboxError as e:
        logger.warning("tai42: looking for a session labelled %s=%s: %s", key, value, e)


async def _destroy(client: Tai42Sandbox, session_id: str) -> None:
    with suppress(SandboxSessionNotFoundError):
        await client.destroy_session(session_id)


async def _session_info(client: Tai42Sandbox, session_id: str) -> SandboxSessionInfo:
    return await (await client.get_session(session_id)).info()


def _labels(task_name: str, sample_id: object, epoch: int | None, env_id: str) -> dict[str, str]:
    labels = {LABEL_RUN: _run_id(), LABEL_TASK: _label_value(task_name), LABEL_ENVIRONMENT: env_id}
    if sample_id is not None:
        labels[LABEL_SAMPLE] = _label_value(str(sample_id))
    if epoch is not None:
        labels[LABEL_EPOCH] = str(epoch)
    return labels


def _label_value(value: str) -> str:
    """value as a label holds it: printable, at most 1024 bytes."""
    clean = "".join(c if c.isprintable() else "?" for c in value)
    data = clean.encode("utf-8", "replace")[:_MAX_LABEL_VALUE]
    return data.decode("utf-8", "ignore")


def _sample() -> tuple[object, int | None]:
    """The running sample's id and epoch, when Inspect runs one."""
    from inspect_ai.log._samples import sample_active

    active = sample_active()
    if active is None:
        return None, None
    return active.sample.id, active.epoch


class _Run:
    """The id of one Inspect run (a batch of tasks), on its sandbox
    lifecycle scope where Inspect has one, else one per process."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex


_process_run = _Run()


def _run_id() -> str:
    state: Callable[[], Any] | None
    try:
        from inspect_ai.util._sandbox.lifecycle import sandbox_lifecycle_state as state
    except ImportError:  # an Inspect without lifecycle scopes
        state = None
    scope = state() if state is not None else None
    return str(scope.get(_Run).id) if scope is not None else _process_run.id


def _report_kept(sessions: list[SandboxSessionInfo]) -> None:
    for s in sessions:
        print(f"kept tai42 session {s.id} ({_describe(s)}): tai42 shell {s.id}")
    if sessions:
        print("destroy them with: inspect sandbox cleanup tai42 [ID]")


def _describe(s: SandboxSessionInfo) -> str:
    parts = [f"image {s.image}"]
    for key, name in ((LABEL_TASK, "task"), (LABEL_SAMPLE, "sample"), (LABEL_EPOCH, "epoch")):
        if key in s.labels:
            parts.append(f"{name} {s.labels[key]}")
    return ", ".join(parts)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
