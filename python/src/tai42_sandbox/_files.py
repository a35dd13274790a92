"""Files streamed both ways: an upload fed from an async iterable or a file
object without holding it whole, with the Tai42-Upload-Failed trailer when
the source fails midway, and a download read chunk by chunk."""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import aiohttp
from aiohttp import payload
from aiohttp.http_writer import StreamWriter

from tai42_contract.sandbox import SandboxError

from ._wire import TRAILER_UPLOAD_FAILED

if TYPE_CHECKING:
    from ._http import Transport

# How much of a file object one read takes, and the slice of a body of
# bytes one write sends.
READ_SIZE: Final = 1 << 20
WRITE_SIZE: Final = 256 << 10


@runtime_checkable
class BinaryReader(Protocol):
    """A binary file object (open(..., "rb"), io.BytesIO, a socket file)."""

    def read(self, n: int = -1, /) -> bytes: ...


@runtime_checkable
class AsyncBinaryReader(Protocol):
    """An object with an async read (aiofiles, an asyncio StreamReader)."""

    async def read(self, n: int = -1, /) -> bytes: ...


FileSource = AsyncIterable[bytes] | BinaryReader | AsyncBinaryReader


async def _chunks(source: FileSource) -> AsyncGenerator[bytes, None]:
    """The source as chunks of bytes, whichever form it has."""
    if isinstance(source, AsyncIterable):
        async for chunk in source:
            yield chunk
        return
    read = source.read
    while True:
        r = read(READ_SIZE)
        b = await r if inspect.isawaitable(r) else r
        if not b:
            return
        yield b


class SourceFailed(Exception):
    """The upload's source raised: the put was failed on the daemon."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(str(cause))


class UploadPayload(payload.Payload):
    """A chunked request body fed from a source. When the source raises,
    the body still ends normally, with the failure in the
    Tai42-Upload-Failed trailer: the daemon then fails the put, old content
    in place, before it answers, so the call returns with nothing half
    written. The source's error is kept in ``failed``."""

    failed: BaseException | None = None

    def __init__(self, source: FileSource) -> None:
        super().__init__(source, content_type="application/octet-stream")
        self._source = source

    @property
    def size(self) -> int | None:
        return None  # chunked

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("an upload stream cannot be decoded")

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        it = _chunks(self._source)
        try:
            while True:
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    return
                except Exception as e:
                    self.failed = e
                    break
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    self.failed = TypeError(f"the source yielded {type(chunk).__name__}, not bytes")
                    break
                if chunk:
                    await writer.write(chunk)
        finally:
            await it.aclose()
        if isinstance(writer, StreamWriter) and writer.chunked:
            # End the chunked body ourselves, with the trailer: the writer
            # then writes no last chunk of its own.
            writer.chunked = False
            await writer.write(
                b"0\r\n" + TRAILER_UPLOAD_FAILED.encode() + b": source failed\r\n\r\n"
            )
            return
        raise SourceFailed(self.failed)


class BytesBody(payload.Payload):
    """A body of bytes with its Content-Length, written in slices: one
    write of the whole would copy it three times on its way to the socket
    (aiohttp joins it with the headers, asyncio's transport slices off what
    the first send took, then buffers the rest), and a slice at a time
    goes straight to the socket."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, content_type="application/octet-stream")
        self._data = data

    @property
    def size(self) -> int:
        return len(self._data)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._data.decode(encoding, errors)

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        view = memoryview(self._data)
        end = len(view) if content_length is None else min(len(view), content_length)
        for off in range(0, end, WRITE_SIZE):
            await writer.write(view[off : min(off + WRITE_SIZE, end)])


class Tai42FileReader:
    """A download from the daemon, read as an async iterator of chunks (or
    with read()). ``size`` is the file's length, or None when the daemon did
    not say. Use it as ``async with session.open_file(path) as f``."""

    def __init__(self, transport: Transport, op: str, path: str, resp: aiohttp.ClientResponse):
        self._t = transport
        self._op = op
        self.path = path
        self._resp = resp
        self.size: int | None = resp.content_length

    def __aiter__(self) -> Tai42FileReader:
        return self

    async def __anext__(self) -> bytes:
        try:
            b = await self._resp.content.readany()
        except aiohttp.ClientError as e:
            raise self._broke(e) from None
        if not b:
            self._check_complete()
            raise StopAsyncIteration
        return b

    async def read(self, n: int = -1) -> bytes:
        """Up to n bytes (all that is left when n < 0); b"" at the end."""
        try:
            b = await self._resp.content.read(n)
        except aiohttp.ClientError as e:
            raise self._broke(e) from None
        if not b:
            self._check_complete()
        return b

    def _check_complete(self) -> None:
        # aiohttp ends a body cut short with an error or, for a body whose
        # length it knew, with a short read: either is a broken download.
        exc = self._resp.content.exception()
        if exc is not None:
            raise self._broke(exc)

    def _broke(self, e: BaseException) -> SandboxError:
        return SandboxError(
            f"the download of {self.path!r} from the daemon at {self._t.display} broke off: {e}",
            op=self._op,
        )

    async def aclose(self) -> None:
        self._resp.release()

    async def __aenter__(self) -> Tai42FileReader:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
