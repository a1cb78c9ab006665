"""Progress of a long benchmark on stderr: a tqdm bar if tqdm is installed, else a plain line.

The table goes to stdout and the progress to stderr, so ``towerdist bench ... > table.txt``
keeps the table clean. ``--progress auto`` (the default) shows progress only when stderr is
a terminal; ``on`` forces it (one line per step when stderr is not a terminal), ``off``
hides it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, TextIO

__all__ = ["Progress", "resolve_progress"]


def resolve_progress(mode: str, stream: TextIO | None = None) -> bool:
    """Whether to show progress for ``--progress mode`` (``auto``: only on a terminal)."""
    if mode == "auto":
        stream = stream or sys.stderr
        return bool(getattr(stream, "isatty", lambda: False)())
    return mode == "on"


class Progress:
    """Counts ``total`` steps on stderr while table rows are printed to stdout.

    Args:
      total: how many steps the run has.
      description: what is running (shown before the count).
      enabled: False shows nothing (``write`` still prints rows).
    """

    def __init__(self, total: int, description: str, enabled: bool) -> None:
        self._total = total
        self._done = 0
        self._description = description
        self._enabled = enabled
        self._bar: Any = None
        self._terminal = bool(getattr(sys.stderr, "isatty", lambda: False)())
        if enabled and self._terminal:  # tqdm redraws in place: only on a terminal
            try:
                # Optional, and untyped: imported by name so that its absence (and its missing
                # stubs) cost nothing.
                tqdm = importlib.import_module("tqdm").tqdm
            except ImportError:
                self._bar = None
            else:
                self._bar = tqdm(total=total, desc=description, file=sys.stderr, leave=False, unit="step")

    def step(self, what: str) -> None:
        """Records that one more step (``what``, e.g. ``"4 KiB"``) is done."""
        self._done += 1
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)
            return
        line = f"{self._description}: {self._done}/{self._total} ({what})"
        if self._terminal:
            sys.stderr.write(f"\r{line}\x1b[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def write(self, line: str) -> None:
        """Prints ``line`` to stdout without breaking the progress display."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            if self._enabled and self._terminal:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
            print(line, flush=True)

    def close(self) -> None:
        """Removes the progress display."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._enabled and self._terminal:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
