"""Notes on the exceptions of a step: what a replica raised, said even when the exception resists."""

from __future__ import annotations

__all__ = ["add_note", "describe_error"]


def describe_error(error: BaseException) -> str:
    """``Type(message)`` of an exception, even when its ``__str__`` raises."""
    try:
        text = str(error)
    except Exception:  # a user exception whose __str__ is broken must not replace the original error
        text = f"<{type(error).__name__}.__str__ raised>"
    return f"{type(error).__name__}({text})"


def add_note(error: BaseException, note: str) -> None:
    """Adds ``note`` to ``error`` (PEP 678); an exception refusing notes is left as it is."""
    try:
        if hasattr(error, "add_note"):
            error.add_note(note)
        else:  # Python 3.10: keep the note where 3.11+ tooling looks for it
            error.__notes__ = [*getattr(error, "__notes__", []), note]
    except Exception:  # noqa: S110 - the original error matters more than its note
        pass
