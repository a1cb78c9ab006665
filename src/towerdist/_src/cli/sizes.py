"""Buffer sizes on the command line: ``4K``, ``1K,64K,4M`` and ``1K:64M`` (``START:STOP[:FACTOR]``)."""

from __future__ import annotations

import math

__all__ = ["MAX_SIZE", "format_size", "parse_size", "parse_sizes"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

MAX_SIZE = 16 << 30
"""The largest size accepted (16 GiB per replica): the benchmark holds several buffers of it per replica."""


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional binary unit (``512``, ``4K``, ``64M``, ``1G``, ``4KiB``).

    Raises:
      ValueError: ``text`` is not a whole, positive, finite number of bytes up to ``MAX_SIZE``.
    """
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = cleaned[-1:] if cleaned[-1:] in ("K", "M", "G") else ""
    number = cleaned[: len(cleaned) - len(unit)]
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(
            f"a size is a number with an optional unit K, M or G (powers of 1024). Got {text!r}."
        ) from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ValueError(f"a size must be a whole, positive number of bytes. Got {text!r}.")
    if value > MAX_SIZE:
        raise ValueError(f"a size must be at most 16G (16 GiB per replica). Got {text!r}.")
    return int(value)


def parse_sizes(text: str, itemsize: int = 1) -> list[int]:
    """The sizes in ``text``, in bytes, ascending and without repeats.

    ``text`` is a comma-separated list of sizes or ranges. A range ``START:STOP`` holds the
    powers of 2 times ``START`` up to ``STOP`` (as nccl-tests' ``-b START -e STOP -f 2``);
    ``START:STOP:FACTOR`` steps by ``FACTOR`` instead (``1K:64M:4`` is 1K, 4K, 16K, ... 64M).

    Args:
      text: e.g. ``"1K:64M"``, ``"1K:64M:4"`` or ``"1K,4K,1M"``.
      itemsize: every size must be a whole number of elements of this many bytes.

    Raises:
      ValueError: a part is malformed or above ``MAX_SIZE``, a range runs backwards or has a
        factor below 2, or a size is not a multiple of ``itemsize``.
    """
    sizes: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            raise ValueError(f"--sizes has an empty entry. Got {text!r}; write e.g. 1K,4K or 1K:64M.")
        bounds = part.split(":")
        if len(bounds) == 1:
            sizes.add(parse_size(part))
            continue
        if len(bounds) > 3:
            raise ValueError(f"a size range is START:STOP or START:STOP:FACTOR. Got {part!r}.")
        start, stop = parse_size(bounds[0]), parse_size(bounds[1])
        factor_text = bounds[2].strip() if len(bounds) == 3 else "2"
        if not factor_text.isdigit() or int(factor_text) < 2:
            raise ValueError(f"a size range's FACTOR must be a whole number >= 2. Got {part!r}.")
        if stop < start:
            raise ValueError(f"a size range must run upwards (START <= STOP). Got {part!r}.")
        size = start
        while size <= stop:
            sizes.add(size)
            size *= int(factor_text)
    odd = sorted(s for s in sizes if s % itemsize)
    if odd:
        raise ValueError(
            f"every size must be a whole number of {itemsize}-byte elements. Got {', '.join(map(str, odd))} bytes "
            f"(from --sizes {text!r})."
        )
    return sorted(sizes)


def format_size(nbytes: int) -> str:
    """``nbytes`` for people: ``"4 KiB"``, ``"64 MiB"``, ``"12 B"``."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"
