"""Failures raised deep in the library and worded by the public method the user called.

An internal check does not know which public API it serves: ``padded_batch`` and
``padded_batch_to_bucket`` share the padding checks, ``Strategy.reduce`` and
``StrategyExtended.reduce_to`` share the destination checks. So it does not take the
API's name as an argument. It raises the error of TensorFlow's type with a message that
starts where the name would go, marked by :func:`unworded`::

    raise unworded(TypeError(f"takes an integer batch_size. Got batch_size={value!r}."))

and the public method puts its own name in front on the way out, with :func:`worded_at`
around its body (or, on a hot path, :func:`name_api` in an ``except`` clause, which costs
nothing until an error is raised)::

    def padded_batch(self, batch_size, ...):
        with worded_at("Dataset.padded_batch()"):
            ...

The user reads ``Dataset.padded_batch() takes an integer batch_size. Got ...``. The
error keeps its class, traceback and attributes; an error that is already worded (or was
never marked) passes through untouched, so the innermost public method names itself
when one public method calls another.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from towerdist._src.errors import ContextError, OpError

__all__ = ["API", "name_api", "unworded", "worded_at"]

_UNWORDED = "_towerdist_unworded"

# Where the API's name goes in a message that names it in the middle rather than in front:
# ``unworded(ValueError(f"Reducing across replicas needs numeric values ({API}). Got ..."))``.
API = "{api}"

E = TypeVar("E", bound=BaseException)


def unworded(error: E, separator: str = " ") -> E:
    """Marks ``error`` to be named by the public method that was called, and returns it.

    Its message must read on after the API's name and ``separator`` (``"takes an integer
    count. ..."``; with ``separator=": "``, ``"the gradient of v has shape ..."``), or hold
    :data:`API` where the name goes (``f"Reducing ... values ({API}). Got ..."``).
    """
    setattr(error, _UNWORDED, separator)
    return error


def name_api(error: BaseException, api: str) -> None:
    """Puts ``api`` in front of ``error``'s message if it is :func:`unworded` (in place).

    Call it in an ``except`` clause of a public method, then re-raise with a bare ``raise``.
    A worded error is left as it is.
    """
    separator = getattr(error, _UNWORDED, None)
    if not separator:
        return
    setattr(error, _UNWORDED, None)
    if isinstance(error, OpError):
        error._message = _worded(error._message, api, separator)
        error.args = (error._message,)
    elif error.args and isinstance(error.args[0], str):
        error.args = (_worded(error.args[0], api, separator), *error.args[1:])
    else:
        error.args = (api, *error.args)
    if isinstance(error, ContextError) and error.api is None:
        error.api = api


def _worded(message: str, api: str, separator: str) -> str:
    return message.replace(API, api) if API in message else f"{api}{separator}{message}"


@contextmanager
def worded_at(api: str) -> Iterator[None]:
    """Names ``api`` in every :func:`unworded` error raised in the block.

    Example::

        with worded_at("Dataset.shuffle()"):
            size = padding.int_argument(buffer_size, "buffer_size")
    """
    try:
        yield
    except BaseException as error:
        name_api(error, api)
        raise
