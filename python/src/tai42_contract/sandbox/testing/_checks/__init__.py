"""The clauses, one module per area; importing this package registers them
all, in the order the modules list them."""

from . import contract, execs, files, sandbox, spec, stream, user  # noqa: F401
