"""The shard files of ``Dataset.save``: records of encoded elements (the format is in ``persistence``'s docstring)."""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from collections.abc import Iterator
from typing import IO, Any, Protocol, cast

import numpy as np

from towerdist._src import nest
from towerdist._src.data.spec import ElementSpec, TensorSpec, shapes_compatible
from towerdist._src.errors import DataLossError
from towerdist._src.type_aliases import TensorLike

__all__ = ["ShardPosition", "ShardWriter", "encode", "read_shard"]

_MAGIC = b"TDSHARD1"
_RECORD_HEAD = struct.Struct("<QI")  # payload length, payload CRC-32
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INT64_MAX = 2**63 - 1


# --- reading ------------------------------------------------------------------------------------


def encode(leaves: list[Any]) -> bytes:
    parts: list[bytes] = []
    for leaf in leaves:
        array = leaf
        parts.append(_U32.pack(array.ndim))
        parts.extend(_U64.pack(int(d)) for d in array.shape)
        if array.dtype == np.object_:
            for item in array.reshape(-1).tolist():
                parts.append(_U64.pack(len(item)))
                parts.append(item)
        else:
            parts.append(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
    return b"".join(parts)


class _Payload:
    """Reads the components of one record's payload."""

    def __init__(self, data: bytes, where: str) -> None:
        self._data = data
        self._offset = 0
        self._where = where

    def take(self, count: int) -> memoryview:
        end = self._offset + count
        if end > len(self._data):
            raise DataLossError(f"{self._where}: a record ends in the middle of a component.", path=self._where)
        view = memoryview(self._data)[self._offset : end]
        self._offset = end
        return view

    def component(self, spec: TensorSpec) -> TensorLike:
        (ndim,) = _U32.unpack(self.take(4))
        if ndim > 64 or (spec.shape is not None and ndim != len(spec.shape)):
            raise DataLossError(f"{self._where}: a component has rank {ndim}, its spec {spec!r}.", path=self._where)
        shape = tuple(_U64.unpack(self.take(8))[0] for _ in range(ndim))
        if any(d > _INT64_MAX for d in shape) or not shapes_compatible(spec.shape, shape):
            raise DataLossError(f"{self._where}: a component has shape {shape}, its spec {spec!r}.", path=self._where)
        count = math.prod(shape)  # a Python int: a corrupt shape must not wrap around
        strings = spec.dtype == np.object_
        # Check the size before allocating: a string takes at least its 8-byte length.
        least = count * (8 if strings else spec.dtype.itemsize)
        if least > len(self._data) - self._offset:
            raise DataLossError(
                f"{self._where}: a component of shape {shape} needs at least {least} bytes, its record has "
                f"{len(self._data) - self._offset} left.",
                path=self._where,
            )
        try:
            if strings:
                out = np.empty(count, dtype=object)
                for i in range(count):
                    (length,) = _U64.unpack(self.take(8))
                    out[i] = bytes(self.take(length))
                array = out.reshape(shape)
                array.flags.writeable = False
            else:
                little = spec.dtype.newbyteorder("<")
                array = np.frombuffer(self.take(count * little.itemsize), dtype=little).reshape(shape)
                if little != spec.dtype:
                    array = array.astype(spec.dtype)
                    array.flags.writeable = False
        except ValueError as error:  # a shape numpy cannot hold (e.g. (2**62, 0)): save() never writes one
            raise DataLossError(f"{self._where}: a component has shape {shape} ({error}).", path=self._where) from None
        return array[()] if ndim == 0 else array

    def finish(self) -> None:
        if self._offset != len(self._data):
            raise DataLossError(
                f"{self._where}: a record has {len(self._data) - self._offset} bytes too many.", path=self._where
            )


class _CrcReader:
    """A binary file that keeps the CRC-32 of the bytes read from it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.crc = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.crc = zlib.crc32(data, self.crc)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()


class _Readable(Protocol):
    """A binary stream read by size: a shard file (through its checksum) or its gzip stream."""

    def read(self, size: int, /) -> bytes: ...


def _read_exact(stream: _Readable, count: int, where: str) -> bytes:
    try:
        data: bytes = stream.read(count)
    except (EOFError, OSError, zlib.error) as error:  # gzip reports truncated or corrupt data so
        raise DataLossError(f"{where} is truncated or corrupt ({error}).", path=where) from None
    if len(data) != count:
        raise DataLossError(f"{where} is truncated: it ends in the middle of a record.", path=where)
    return data


class ShardPosition:
    """How far a pass over a shard file got: the records read, and the stream offset after them.

    The offset counts the bytes of the (decompressed) stream, the magic bytes included.
    """

    __slots__ = ("offset", "records")

    def __init__(self, records: int = 0, offset: int = 0) -> None:
        self.records = records
        self.offset = offset


_SKIP_CHUNK = 1 << 20


def read_shard(
    file: str,
    shard: dict[str, Any],
    saved: ElementSpec,
    compression: str | None,
    structure: nest.PyTreeSpec,
    position: ShardPosition | None = None,
) -> Iterator[Any]:
    """The elements of one shard file: decoded by the ``saved`` spec, built as ``structure``.

    With ``position``, reading starts there, and ``position`` follows the elements read:
    whenever an element is yielded it says where the next one starts. The bytes before it are
    read again (not decoded), so that the file's CRC-32 is still checked.
    """
    position = ShardPosition() if position is None else position
    specs, _ = nest.flatten(saved)
    try:
        raw = _CrcReader(open(file, "rb"))  # noqa: SIM115 - closed in finally, across yields
    except FileNotFoundError:
        raise DataLossError(
            f"Dataset.load(): the shard file {file} is gone. A later save() to the same path replaces the shard files "
            f"of the dataset that was loaded from it; call Dataset.load() again to read the new one.",
            path=file,
        ) from None
    except OSError as error:
        raise DataLossError(f"Dataset.load(): cannot open the shard file {file} ({error}).", path=file) from None
    stream: Any = gzip.GzipFile(fileobj=cast(Any, raw), mode="rb") if compression == "GZIP" else raw
    try:
        if _read_exact(stream, len(_MAGIC), file) != _MAGIC:
            raise DataLossError(f"{file} is not a towerdist dataset shard (wrong magic bytes).", path=file)
        skip = max(position.offset - len(_MAGIC), 0)
        while skip:
            skip -= len(_read_exact(stream, min(skip, _SKIP_CHUNK), file))
        offset = max(position.offset, len(_MAGIC))
        for records in range(position.records + 1, shard["elements"] + 1):
            length, crc = _RECORD_HEAD.unpack(_read_exact(stream, _RECORD_HEAD.size, file))
            # Deflate expands at most 1032-fold, so a longer record is a corrupt length field (and
            # must not be allocated).
            if length > (shard["bytes"] * 1032 if compression == "GZIP" else shard["bytes"]):
                raise DataLossError(f"{file} is corrupt: a record claims {length} bytes.", path=file)
            data = _read_exact(stream, length, file)
            if zlib.crc32(data) != crc:
                raise DataLossError(f"{file} is corrupt: a record fails its CRC-32 check.", path=file)
            payload = _Payload(data, file)
            element = structure.unflatten([payload.component(s) for s in specs])
            payload.finish()
            offset += _RECORD_HEAD.size + length
            position.records, position.offset = records, offset
            yield element
        try:
            rest = stream.read(1)
        except (EOFError, OSError, zlib.error) as error:
            raise DataLossError(f"{file} is truncated or corrupt ({error}).", path=file) from None
        if rest:
            raise DataLossError(f"{file} has data after its {shard['elements']} records.", path=file)
        if stream is not raw:
            raw.read()  # the rest of the compressed stream, for the CRC
        if raw.crc != shard["crc32"]:
            raise DataLossError(f"{file} is corrupt: its CRC-32 does not match the manifest.", path=file)
    finally:
        stream.close()
        raw.close()


# --- writing -----------------------------------------------------------------------------------


class ShardWriter:
    """Writes one shard file: the magic bytes, then one record per element."""

    def __init__(self, directory: str, name: str, compression: str | None) -> None:
        self.name = name
        self.path = os.path.join(directory, name)
        self._raw = open(self.path, "xb")  # noqa: SIM115 - closed by close()
        self._stream: IO[bytes] = (
            gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0) if compression == "GZIP" else self._raw  # type: ignore[assignment]
        )
        self._stream.write(_MAGIC)
        self.elements = 0

    def write(self, payload: bytes) -> None:
        self._stream.write(_RECORD_HEAD.pack(len(payload), zlib.crc32(payload)))
        self._stream.write(payload)
        self.elements += 1

    def close(self) -> tuple[int, int]:
        """Flushes the file to disk; returns its size and CRC-32."""
        if self._stream is not self._raw:
            self._stream.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        crc = 0
        with open(self.path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                crc = zlib.crc32(block, crc)
        return os.path.getsize(self.path), crc

    def abandon(self) -> None:
        try:
            if self._stream is not self._raw:
                self._stream.close()
            self._raw.close()
        finally:
            if os.path.exists(self.path):
                os.unlink(self.path)
