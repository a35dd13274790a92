"""The interactive exec over the daemon's WebSocket: one reader task per
handle, an output queue bounded in bytes between it and ``output``, and
stdin, close_stdin and kill frames each awaited by id until the daemon acks
them (the Go client's client/exec.go, in asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import aiohttp

from tai42_contract.sandbox import (
    SandboxError,
    SandboxExecHandle,
    SandboxSessionNotFoundError,
    SandboxStreamChunk,
    SandboxStreamExit,
)

from ._wire import (
    KIND_EXEC_TIMEOUT,
    MAX_STDIN_FRAME,
    TAG_STDERR,
    TAG_STDIN,
    TAG_STDOUT,
    error_from_wire,
    valid_bytes,
)

if TYPE_CHECKING:
    from ._http import Transport

# The output a handle queues before its reader stops reading from the
# daemon (back-pressure), as the Go client's StreamBuffer.
STREAM_BUFFER: Final = 4 << 20
# The bound while a stdin or close_stdin ack is awaited: it holds all the
# output the daemon can have sent ahead of an ack (the Go client's ackBound
# says why 32 MiB), so that the ack of an exec that has exited arrives with
# nobody reading.
ACK_BOUND: Final = 8 * STREAM_BUFFER
# A reader waiting at its bound this long checks, every GONE_EVERY, whether
# the session still exists: a session destroyed elsewhere frees the handle.
GONE_AFTER: Final = 2.0
GONE_EVERY: Final = 2.0
GONE_TIMEOUT: Final = 5.0
# The largest frame read from the daemon.
MAX_FRAME: Final = 16 << 20

_ENDED: Final = object()  # an ack future's result once the stream has ended


@dataclass
class _Term:
    """How the stream ended: an exit frame, an error frame, or the
    connection lost (or broken by a malformed frame) before either."""

    exit: int | None = None
    api_err: dict[str, Any] | None = None
    err_exit: int | None = None
    lost: SandboxError | None = None


def _clip(s: str, n: int = 200) -> str:
    return s[:n] + "..." if len(s) > n else s


class _Output:
    """The handle's ``output``: an async iterator of chunks, then one
    SandboxStreamExit; an error end is raised, and raised again."""

    def __init__(self, h: Tai42ExecHandle) -> None:
        self._h = h

    def __aiter__(self) -> _Output:
        return self

    async def __anext__(self) -> SandboxStreamChunk | SandboxStreamExit:
        return await self._h._next()


class Tai42ExecHandle(SandboxExecHandle):
    """A live interactive exec on the daemon (see SandboxExecHandle).

    write_stdin, close_stdin and kill are safe from any task of the loop,
    concurrently with iterating ``output`` (which is for one reader at a
    time). One write_stdin is sent in frames of at most 1 MiB, each acked
    before the next, all of one call contiguous. kill waits for the daemon's
    ack; once it has returned, ``output`` yields what was received before
    and ends with the exec's exit, never a timeout. A stream lost before its
    end (a daemon that died) ends with a SandboxError saying the outcome is
    unknown. The connection and the reader task are freed as soon as the
    stream's last frame has arrived, read or not.
    """

    output: AsyncIterator[SandboxStreamChunk | SandboxStreamExit]

    def __init__(
        self,
        transport: Transport,
        session_id: str,
        ws: aiohttp.ClientWebSocketResponse[bool],
        on_end: Callable[[Tai42ExecHandle], None],
        session_gone: Callable[[], Awaitable[bool]],
    ) -> None:
        self._t = transport
        self._sid = session_id
        self._ws = ws
        self._on_end = on_end
        self._session_gone = session_gone
        self._items: deque[SandboxStreamChunk] = deque()
        self._queued = 0
        self._pending: dict[int, tuple[asyncio.Future[Any], bool]] = {}
        self._stdin_acks = 0
        self._next_id = 1
        self._ended = False
        self._term = _Term()
        self._term_sent = False
        self._sticky: SandboxError | None = None
        self._kills = 0
        self._kill_ok = False
        self._killed = False
        self._gone = False
        self._kill_call: asyncio.Future[SandboxError | None] | None = None
        self._space = asyncio.Event()
        self._notify = asyncio.Event()
        self._done = asyncio.Event()
        self._stdin_lock = asyncio.Lock()
        self._stdin_closed = False
        self._unacked: asyncio.Future[Any] | None = None
        self._bg: set[asyncio.Task[None]] = set()
        self.output = _Output(self)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def __repr__(self) -> str:
        state = "ended" if self._ended else "running"
        return f"<Tai42ExecHandle session={self._sid} {state}>"

    # The reader task.

    async def _read(self) -> None:
        try:
            term = await self._read_frames()
        except asyncio.CancelledError:
            term = _Term(lost=self._lost_error("the client was closed"))
        except Exception as e:  # never leave the handle hanging on a bug
            term = _Term(lost=SandboxError(f"the exec stream failed: {e!r}", op="exec_start"))
        try:
            # After the last frame the daemon closes: answer its close. A
            # lost stream is dropped at once.
            if term.lost is None:
                await asyncio.shield(self._ws.close())
            else:
                self._abort()
        except (asyncio.CancelledError, Exception):
            self._abort()
        self._end(term)

    def _abort(self) -> None:
        # The transport's close ends the connection at once, where
        # ws.close() would wait for the peer's close frame.
        conn = self._ws._response.connection
        if conn is not None:
            conn.close()
        self._ws._response.close()

    def _end(self, term: _Term) -> None:
        self._ended, self._term = True, term
        pending, self._pending, self._stdin_acks = self._pending, {}, 0
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_result(_ENDED)
        self._done.set()
        self._notify.set()
        self._space.set()
        self._on_end(self)

    async def _read_frames(self) -> _Term:
        ws = self._ws
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                b: bytes = msg.data
                if not b or b[0] not in (TAG_STDOUT, TAG_STDERR):
                    return _Term(
                        lost=self._malformed("a binary frame that is neither stdout nor stderr")
                    )
                if len(b) > 1:
                    # model_construct: the frame is already checked.
                    await self._push(
                        SandboxStreamChunk.model_construct(
                            stream="stdout" if b[0] == TAG_STDOUT else "stderr", data=b[1:]
                        )
                    )
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                return _Term(lost=self._lost(msg))
            try:
                f = json.loads(msg.data)
                typ = f["type"]
            except (ValueError, KeyError, TypeError):
                return _Term(lost=self._malformed("a text frame that is not a JSON frame"))
            if typ == "ack":
                self._ack(f.get("id"), f.get("error"))
            elif typ == "exit":
                code = f.get("exit_code")
                if not isinstance(code, int):
                    return _Term(lost=self._malformed("an exit frame without exit_code"))
                return _Term(exit=code)
            elif typ == "error":
                e = f.get("error")
                if not isinstance(e, dict):
                    e = {
                        "kind": "sandbox_error",
                        "op": "exec_start",
                        "message": "the daemon ended the stream with an error it did not describe",
                    }
                code = f.get("exit_code")
                return _Term(api_err=e, err_exit=code if isinstance(code, int) else None)
            else:
                return _Term(lost=self._malformed(f"a {_clip(str(typ))!r} frame"))

    def _lost_error(self, why: str) -> SandboxError:
        return SandboxError(
            f"the exec stream from the daemon at {self._t.display} was lost before the exec's "
            f"end; its outcome is unknown (a daemon that restarts ends the execs that were "
            f"running) ({why})",
            op="exec_start",
        )

    def _lost(self, msg: Any) -> SandboxError:
        if msg.type == aiohttp.WSMsgType.CLOSE:
            why = f"the daemon closed it with status {msg.data}"
            if msg.extra:
                why += ": " + _clip(str(msg.extra))
        elif msg.type == aiohttp.WSMsgType.ERROR:
            why = str(msg.data) or type(msg.data).__name__
        else:
            why = "the connection closed"
        return self._lost_error(why)

    def _malformed(self, what: str) -> SandboxError:
        return SandboxError(
            f"the daemon at {self._t.display} sent {what}; the exec stream was dropped",
            op="exec_start",
        )

    def _full(self) -> bool:
        if self._kills > 0 or self._kill_ok or self._gone:
            return False
        if self._stdin_acks > 0:
            return self._queued >= ACK_BOUND
        return self._queued >= STREAM_BUFFER

    async def _push(self, chunk: SandboxStreamChunk) -> None:
        if self._full():
            await self._wait_room()
        self._items.append(chunk)
        self._queued += len(chunk.data)
        self._notify.set()

    async def _wait_room(self) -> None:
        """Waits until the queue is no longer full. Past GONE_AFTER it asks
        the daemon every GONE_EVERY whether the session still exists: a
        session destroyed elsewhere (another client, a reap) lifts the
        bound, so that the reader reads the stream's end and frees the
        handle while nobody reads."""
        wait = GONE_AFTER
        while self._full():
            self._space.clear()
            try:
                await asyncio.wait_for(self._space.wait(), wait)
                continue
            except asyncio.TimeoutError:
                pass
            wait = GONE_EVERY
            if await self._session_gone():
                self.unbound()

    def _ack(self, fid: Any, err: Any) -> None:
        if not isinstance(fid, int):
            return
        r = self._take(fid)
        if r is not None and not r.done():
            r.set_result(err if isinstance(err, dict) else None)

    def _take(self, fid: int) -> asyncio.Future[Any] | None:
        r = self._pending.pop(fid, None)
        if r is None:
            return None
        if not r[1]:
            self._stdin_acks -= 1
        return r[0]

    def _register(self, kill: bool) -> tuple[int, asyncio.Future[Any]] | None:
        """Reserves a frame id (from 1) and the future its ack resolves, for
        a stdin or close_stdin frame, or a kill; None once the stream has
        ended. While the ack is awaited the bound moves (see _full)."""
        if self._ended:
            return None
        fid = self._next_id
        self._next_id += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[fid] = (fut, kill)
        if not kill:
            self._stdin_acks += 1
        self._space.set()
        return fid, fut

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _send_control(self, typ: str, fid: int) -> bool:
        """Sends a text frame; False when the connection is going."""
        try:
            await self._ws.send_str(json.dumps({"type": typ, "id": fid}))
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            return False
        return True

    # output

    async def _next(self) -> SandboxStreamChunk | SandboxStreamExit:
        while True:
            if self._items:
                c = self._items.popleft()
                self._queued -= len(c.data)
                self._space.set()
                return c
            if self._ended:
                return self._end_item()
            self._notify.clear()
            await self._notify.wait()

    def _end_item(self) -> SandboxStreamExit:
        if self._sticky is not None:
            raise self._sticky
        if self._term_sent:
            raise StopAsyncIteration
        t = self._term
        if t.exit is not None:
            self._term_sent = True
            return SandboxStreamExit(exit_code=t.exit)
        if t.api_err is not None:
            if t.api_err.get("kind") == KIND_EXEC_TIMEOUT and self._killed:
                # kill returned before this timeout was delivered: the
                # stream reports the exec's exit status instead.
                if t.err_exit is not None:
                    self._term_sent = True
                    return SandboxStreamExit(exit_code=t.err_exit)
                self._sticky = SandboxError(
                    "the exec was killed, but its exit status could not be read because "
                    "the provider's timeout fired first",
                    op="exec_start",
                )
            else:
                self._sticky = error_from_wire(t.api_err)
            raise self._sticky
        self._sticky = t.lost or self._lost_error("no end was received")
        raise self._sticky

    # stdin

    def _ended_error(self, op: str) -> SandboxError:
        if self._killed:
            return SandboxError("the exec was killed; its stdin is closed", op=op)
        return SandboxError("the exec has ended; its stdin is closed", op=op)

    async def _settle(self) -> None:
        """Waits for the ack of a frame a cancelled call left unacked, so
        that at most one stdin frame is ever on its way. The caller holds
        the stdin lock."""
        if self._unacked is not None:
            await self._unacked
            self._unacked = None

    async def write_stdin(self, data: bytes) -> None:
        """Delivers data to the exec's stdin intact and in order, in frames
        of at most 1 MiB, each acked before the next. A failure the daemon
        reports (the exec closed its stdin) is raised as the contract's
        error; once the exec has ended (or was killed) a SandboxError. A
        call cancelled with its data cut in two closes stdin, so that no
        later write follows a torn one."""
        op = "write_stdin"
        data = valid_bytes(op, "stdin data", data)
        if self._ended:
            raise self._ended_error(op)
        async with self._stdin_lock:
            if self._stdin_closed:
                raise SandboxError("stdin is closed", op=op)
            await self._settle()
            view = memoryview(data)
            off = 0
            while off < len(data):
                end = min(off + MAX_STDIN_FRAME, len(data))
                reg = self._register(kill=False)
                if reg is None:
                    raise self._ended_error(op)
                fid, fut = reg
                frame = bytes((TAG_STDIN,)) + fid.to_bytes(8, "big") + view[off:end]
                try:
                    await self._ws.send_bytes(frame)
                except asyncio.CancelledError:
                    self._cancelled(fut, end, len(data))
                    raise
                except (ConnectionError, aiohttp.ClientError, RuntimeError):
                    # A failed write means the connection is going: its end
                    # (the exec's, or the connection lost) follows.
                    self._take(fid)
                    await self._done.wait()
                    raise self._ended_error(op) from None
                try:
                    r = await fut
                except asyncio.CancelledError:
                    self._cancelled(fut, end, len(data))
                    raise
                if r is _ENDED:
                    raise self._ended_error(op)
                if r is not None:
                    raise error_from_wire(r)
                off = end

    def _cancelled(self, fut: asyncio.Future[Any], end: int, total: int) -> None:
        """A write_stdin cancelled with a frame on its way: its ack is left
        for the next call to wait for, and stdin is closed when the call's
        data is torn."""
        self._unacked = fut
        if end < total and not self._stdin_closed and not self._ended:
            self._stdin_closed = True
            fid = self._next_id
            self._next_id += 1
            # Nobody waits for this close's ack; _stdin_closed already
            # refuses every later write.
            self._spawn(self._send_close_quietly(fid))

    async def _send_close_quietly(self, fid: int) -> None:
        await self._send_control("close_stdin", fid)

    async def close_stdin(self) -> None:
        """Signals end-of-input and waits for the daemon's ack. Idempotent;
        a no-op once the exec has ended."""
        if self._ended:
            return
        async with self._stdin_lock:
            if self._stdin_closed or self._ended:
                return
            await self._settle()
            reg = self._register(kill=False)
            if reg is None:
                return
            fid, fut = reg
            self._stdin_closed = True
            if not await self._send_control("close_stdin", fid):
                self._take(fid)
                return
            r = await fut
            if isinstance(r, dict):
                raise error_from_wire(r)

    # kill

    async def kill(self) -> None:
        """Terminates the exec: sends a kill frame and waits for the daemon's
        ack, or the stream's end. Concurrent and repeated calls share one
        request; one the daemon failed is retried by the next call. Never
        raises once the exec has ended."""
        if self._ended or self._kill_ok:
            self._killed = True
            return
        k = self._kill_call
        if k is None or (k.done() and k.result() is not None):
            k = asyncio.get_running_loop().create_future()
            self._kill_call = k
            self._kills += 1
            reg = self._register(kill=True)
            assert reg is not None  # the stream has not ended
            self._spawn(self._run_kill(k, *reg))
        self._space.set()  # the bound is lifted: the reader reads on to the ack
        try:
            err = await asyncio.shield(k)
        finally:
            self._killed = True
        if err is not None:
            raise err

    async def _run_kill(
        self, k: asyncio.Future[SandboxError | None], fid: int, fut: asyncio.Future[Any]
    ) -> None:
        err: SandboxError | None = None
        if await self._send_control("kill", fid):
            r = await fut  # resolved with _ENDED when the stream ends
            if isinstance(r, dict):
                err = error_from_wire(r)
        else:
            await self._done.wait()
        if self._ended:
            err = None  # the stream ended: the exec is over
        self._take(fid)
        self._kills -= 1
        if err is None:
            self._kill_ok = True
        k.set_result(err)
        self._space.set()

    async def aclose(self) -> None:
        """Drops the stream (the daemon then kills the exec) and waits for
        the reader task and the frames on their way; used by the client's
        close."""
        if not self._reader.done():
            self._reader.cancel()
        await asyncio.gather(self._reader, *self._bg, return_exceptions=True)

    def unbound(self) -> None:
        """Lifts the queue's bound for good: the session was destroyed, so
        what is left of the stream is finite."""
        self._gone = True
        self._space.set()

    @property
    def session_id(self) -> str:
        return self._sid


async def session_gone_checker(
    transport: Transport, session_id: str, destroy: Callable[[], Awaitable[None]]
) -> bool:
    """Whether the daemon says the session does not exist (bounded by
    GONE_TIMEOUT; any other answer, or none, is not gone). A gone session is
    destroyed, which tears down at once an expired one the daemon has not
    reaped yet (a no-op on one destroyed), so that its output is finite."""
    from ._http import session_path

    try:
        await asyncio.wait_for(
            transport.call("get_session", "GET", session_path(session_id)), GONE_TIMEOUT
        )
    except SandboxSessionNotFoundError:
        with contextlib.suppress(SandboxError, asyncio.TimeoutError):
            await asyncio.wait_for(destroy(), GONE_TIMEOUT)
        return True
    except (SandboxError, asyncio.TimeoutError):
        return False
    return False
