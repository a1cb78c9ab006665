"""Where reduction inputs come from and where results go: destinations, validation, mirroring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from towerdist._src import array_ops, backend
from towerdist._src import device as device_lib
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import API, unworded
from towerdist._src.indexed_slices import IndexedSlices, check_reducible
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues, Mirrored, PerReplica

__all__ = ["ResolvedDevices", "as_per_replica", "check_pairs", "mirror", "resolve_destinations", "validate_components"]


class ResolvedDevices(tuple):  # type: ignore[type-arg]
    """Destination devices already resolved by a strategy (a tuple of ``DeviceSpec``).

    Not to be confused with ``type_aliases.Destinations``, what users may pass as destinations.
    """


def resolve_destinations(destinations: object) -> tuple[DeviceSpec, ...]:
    """The devices named by ``destinations``.

    Accepts a device string, a ``DeviceSpec``, a distributed value or variable (its
    devices), or an array (its device; numpy arrays live on the host, ``/cpu:0``).

    Raises:
      ValueError: ``destinations`` is empty or of another kind.
    """
    if isinstance(destinations, ResolvedDevices):
        return tuple(destinations)
    if isinstance(destinations, str):
        if not destinations:
            raise ValueError("destinations can not be empty: got the empty string; pass a device such as 'CPU:0'.")
        return (device_lib.parse(destinations),)
    if isinstance(destinations, DeviceSpec):
        return (destinations,)
    if isinstance(destinations, DistributedValues) or hasattr(destinations, "_devices"):
        devices = getattr(destinations, "_devices", None)
        if not devices:
            raise ValueError(
                f"destinations can not be empty: {type(destinations).__name__} {destinations!r} does not "
                f"record its devices; pass a device string or a value created by a strategy."
            )
        return tuple(devices)
    if isinstance(destinations, IndexedSlices):  # TF takes one as destinations: the device of its values
        return resolve_destinations(destinations.values)
    if backend.is_array(destinations):
        cupy_device = getattr(destinations, "device", None)
        if backend.for_array(destinations).name == "cupy" and cupy_device is not None:
            return (DeviceSpec(device_type="GPU", device_index=int(cupy_device.id)),)
        return (device_lib.HOST,)
    raise ValueError(
        "destinations must be one of a `DistributedValues` object, a variable, an array or a device "
        f"string. Got destinations={destinations!r} of type {type(destinations).__name__}."
    )


def as_per_replica(value: TensorLike) -> DistributedValues:
    """``value`` itself if distributed, else a one-component ``PerReplica``."""
    if isinstance(value, DistributedValues):
        return value
    return PerReplica((value,))


def check_pairs(value_destination_pairs: Sequence[Any]) -> list[tuple[DistributedValues, tuple[DeviceSpec, ...]]]:
    """``(value, destinations)`` pairs checked as ``batch_reduce`` takes them, values validated.

    A plain value counts as one component; destinations are resolved. A component mismatch
    names the value's index (see :func:`validate_components`); the caller's API names itself.

    Raises:
      ValueError: an element is not a pair.
      InvalidArgumentError: a value's components differ in shape or dtype.
    """
    pairs: list[tuple[DistributedValues, tuple[DeviceSpec, ...]]] = []
    for k, pair in enumerate(value_destination_pairs):
        if not isinstance(pair, tuple):
            raise ValueError(f"Each element of `value_destination_pairs` should be a tuple. Got element {k}: {pair!r}.")
        if len(pair) != 2:
            raise ValueError(
                f"Each element of `value_destination_pairs` should be a tuple of size 2. Got element "
                f"{k} of size {len(pair)}."
            )
        value = as_per_replica(pair[0])
        validate_components(value, f" (value {k})")
        pairs.append((value, resolve_destinations(pair[1])))
    return pairs


def validate_components(value: DistributedValues, which: str = "") -> list[Any]:
    """The components of ``value`` as arrays, after checking they can be combined.

    ``which`` tells the value apart in a batch (``" (value 3)"``); the messages follow the
    API's name with it, and the public method the user called puts its name in front.
    ``IndexedSlices`` components are returned as they are, once checked to be slices of
    one dense shape and dtype (``indexed_slices.check_reducible``).

    Raises (:func:`unworded`):
      ValueError: ``value`` has no components.
      InvalidArgumentError: components differ in shape or dtype; the message names the
        replicas and their shapes/dtypes.
    """
    components = value.values
    if not components:
        raise unworded(ValueError(f"{API}{which}: `per_replica_value` must be non-empty."))
    if any(isinstance(c, IndexedSlices) for c in components):
        if not all(isinstance(c, IndexedSlices) for c in components):
            kinds = ", ".join(f"replica {r}: {type(c).__name__}" for r, c in enumerate(components))
            raise unworded(
                InvalidArgumentError(
                    f"Reducing across replicas needs every replica's value to be of one kind ({API}{which}): some "
                    f"replicas gave an IndexedSlices and others a dense value ({kinds}). Convert the dense ones "
                    f"with td.IndexedSlices(...) or densify all with td.convert_to_tensor()."
                )
            )
        try:
            check_reducible(components, f"{API}{which}")
        except InvalidArgumentError as error:
            raise unworded(error) from None
        return list(components)
    arrays = [array_ops.as_array(c) for c in components]
    first = arrays[0]
    for replica_id, array in enumerate(arrays[1:], start=1):
        if array.shape != first.shape or array.dtype != first.dtype:
            raise unworded(
                InvalidArgumentError(
                    f"Reducing across replicas needs every replica's value to have the same shape and dtype "
                    f"({API}{which}), but replica 0 "
                    f"has shape {tuple(first.shape)} and dtype {first.dtype} while replica {replica_id} has "
                    f"shape {tuple(array.shape)} and dtype {array.dtype}. To combine values of different "
                    f"lengths use strategy.reduce(..., axis=0) or all_gather(); otherwise make the shapes "
                    f"agree.",
                    replicas=(0, replica_id),
                    shapes=(tuple(first.shape), tuple(array.shape)),
                )
            )
    kind = first.dtype.kind
    if kind not in "iufc":
        raise unworded(
            InvalidArgumentError(
                f"Reducing across replicas needs numeric values ({API}{which}). Got dtype {first.dtype}; cast to "
                f"a numeric dtype first.",
                replicas=tuple(range(len(arrays))),
            )
        )
    return arrays


def mirror(arrays: Sequence[Any], destinations: Sequence[DeviceSpec]) -> TensorLike:
    """Wraps ``arrays[k]`` (intended for ``destinations[k]``) as the result of a reduction.

    Arrays already on their destination are used as they are. Host arrays that look at
    one buffer and go to several CPU destinations are shared zero-copy: each destination
    gets its own read-only object. One destination gives the bare array; several give a
    ``Mirrored``.
    """
    if len(destinations) == 1:
        target = destinations[0]
        return backend.for_device(target).to_device(arrays[0], target)
    host = backend.host()
    components: list[Any] = [None] * len(destinations)
    by_buffer: dict[int, list[int]] = {}
    for k, (array, target) in enumerate(zip(arrays, destinations)):
        impl = backend.for_device(target)
        components[k] = impl.to_device(array, target)
        if impl is host:
            by_buffer.setdefault(host.buffer_id(components[k]), []).append(k)
    for indices in by_buffer.values():
        for k, shared in zip(indices, host.share([components[k] for k in indices])):
            components[k] = shared
    return Mirrored(components, destinations)
