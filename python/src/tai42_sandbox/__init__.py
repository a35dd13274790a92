"""The client of the tai42 daemon: a provider of the sandbox contract.

:class:`Tai42Sandbox` implements :class:`tai42_contract.sandbox.Sandbox`
over the daemon's HTTP API (``http://``, ``https://`` or ``unix:/path``);
:class:`Tai42SandboxSync` is the same client for code without an event loop
(scripts, notebooks).
"""

from ._exec import Tai42ExecHandle
from ._files import Tai42FileReader
from ._wire import SandboxTransportError, error_from_wire, error_to_wire
from .client import Tai42Sandbox, Tai42Session
from .sync import Tai42ExecHandleSync, Tai42FileReaderSync, Tai42SandboxSync, Tai42SessionSync

__all__ = [
    "SandboxTransportError",
    "Tai42ExecHandle",
    "Tai42ExecHandleSync",
    "Tai42FileReader",
    "Tai42FileReaderSync",
    "Tai42Sandbox",
    "Tai42SandboxSync",
    "Tai42Session",
    "Tai42SessionSync",
    "error_from_wire",
    "error_to_wire",
]
