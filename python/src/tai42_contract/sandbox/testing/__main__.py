"""``python -m tai42_contract.sandbox.testing --clauses-md`` prints CLAUSES.md;
``--list`` the clause names, one a line."""

from __future__ import annotations

import argparse
import sys

from ._suite import clauses, clauses_markdown


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tai42_contract.sandbox.testing")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--clauses-md", action="store_true", help="print CLAUSES.md")
    g.add_argument("--list", action="store_true", help="print the clause names")
    args = p.parse_args(argv)
    if args.clauses_md:
        sys.stdout.write(clauses_markdown())
    else:
        sys.stdout.write("".join(c.name + "\n" for c in clauses()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
