"""Errors a background thread produced in place of an element, kept in a saved iterator position.

A ``prefetch`` thread or a parallel ``interleave`` worker that hits an error buffers it behind
the elements it made before, and the consumer raises it in that element's place. A position
saved meanwhile holds the error too, so that the restored iterator raises it at the same
point, as TensorFlow saves the status of each buffered element. The input that raised cannot
make it again (its pass has ended), so the error itself is saved: its type, arguments and
notes. Restored, it is an instance of the same type where that type can be imported and
built from its arguments, else a ``td.errors.UnknownError`` naming it; the traceback is not
kept.
"""

from __future__ import annotations

from typing import Any

from towerdist._src.data import state_codec
from towerdist._src.data.cursor import State
from towerdist._src.errors import UnknownError

__all__ = ["raise_saved_error", "restore_error", "save_error"]

_PLAIN = (str, int, float, bool, type(None))  # argument types an error is rebuilt from


def save_error(error: BaseException) -> dict[str, Any]:
    """``error`` as plain values for a saved position."""
    cls = type(error)
    plain = all(isinstance(arg, _PLAIN) for arg in error.args)
    return {
        "type": state_codec.type_name(cls),
        "args": list(error.args) if plain else [str(error)],
        "message": str(error),
        "notes": [note for note in getattr(error, "__notes__", ()) if isinstance(note, str)],
    }


def restore_error(saved: dict[str, Any]) -> BaseException:
    """The error ``save_error`` saved, rebuilt (see the module docstring)."""
    error = _rebuilt(saved["type"], saved["args"])
    if error is None:
        name = saved["type"].replace(":", ".")
        error = UnknownError(f"{name}: {saved['message']}")
    for note in saved["notes"]:
        error.add_note(note)
    error.add_note("Raised before the iterator's position was saved, and restored with it (without its traceback).")
    return error


def raise_saved_error(state: State) -> None:
    """Raises the error a pass saved in ``state.error`` (if any): a pass that delivered the elements
    it read before an input error, then was saved before raising it, raises it when restored."""
    saved = getattr(state, "error", None)
    if saved is not None:
        state.error = None
        raise restore_error(saved)


def _rebuilt(type_name: str, args: list[Any]) -> BaseException | None:
    value = state_codec.import_type(type_name)
    if not (isinstance(value, type) and issubclass(value, Exception)):
        return None  # (a KeyboardInterrupt or SystemExit a thread caught comes back as an UnknownError naming it)
    try:
        error: BaseException = value(*args)
    except Exception:  # an exception class whose constructor takes other arguments
        return None
    return error
