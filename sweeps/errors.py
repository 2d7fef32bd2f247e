"""User-fixable errors of the `speclab` commands: one line on stderr and exit status 2.

Its own module so the command modules (cli.py, bench.py, dashboard/) share it without
importing one another.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

USAGE_ERROR = 2


class CliError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the clear errors our own code raises on bad input into CliError."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError) as exc:
        raise CliError(str(exc)) from exc
