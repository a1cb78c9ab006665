"""``CommandError``: a failure the ``towerdist`` command reports in one message (exit status 1)."""

from __future__ import annotations

__all__ = ["CommandError"]


class CommandError(RuntimeError):
    """A failure of a ``towerdist`` subcommand: ``main`` prints the message and returns 1.

    Usage errors (unknown options, malformed values) are argparse's and exit with 2.
    """
