"""``td.Variable``: mutable state with TensorFlow's variable API, holding numpy or cupy arrays.

``td.Variable(...)`` creates the right kind of variable for the current context (see
``creation.py``): a plain :class:`ResourceVariable` outside any strategy, a distributed
variable inside a multi-replica strategy's scope. Every kind subclasses :class:`Variable`,
so ``isinstance(v, td.Variable)`` holds for all of them.

**Reads are snapshots.** A variable holds one array that is never written in place: every
write builds a new array and swaps it in. An array handed out by ``value()``,
``read_value()``, ``np.asarray(v)`` or arithmetic therefore never changes when the
variable is assigned later. Reads hand out that array read-only (numpy arrays; cupy has no
read-only flag, so do not write into arrays read from a GPU variable); ``numpy()`` returns a
writable host copy, as TensorFlow's does.

**Writes return the variable.** ``assign``/``assign_add``/``assign_sub`` return an
:class:`UnreadVariable` of the variable written (None with ``read_value=False``), as
TensorFlow 2 does: it reads the variable when used, so ``v.assign_add(1.0).numpy()`` and
chained writes work. (A distributed variable written in cross-replica context returns its
components' new values instead, as TensorFlow's do: see ``distributed_variable.py``.)
"""

from __future__ import annotations

import copy
import operator
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from towerdist._src import backend, context, nest, update_fence
from towerdist._src.array_ops import constant, from_python
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import API, unworded, worded_at
from towerdist._src.operators import ArrayOperators, binary
from towerdist._src.type_aliases import DTypeLike, Nest, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, PerReplica
from towerdist._src.variable_enums import VariableAggregation, VariableSynchronization
from towerdist._src.variables import scatter, sliced
from towerdist._src.variables.scatter import Scatter
from towerdist._src.variables.sliced import SliceAssign, describe_write
from towerdist._src.variables.update_buffers import UpdateBuffers

if TYPE_CHECKING:
    from towerdist._src.indexed_slices import IndexedSlices
    from towerdist._src.strategies.strategy import Strategy

__all__ = [
    "ResourceVariable", "UnreadVariable", "Variable", "VariableRef", "WriteOp", "WriteResult", "adopt_shared", "to_array",
    "unread",
]  # fmt: skip

# A write of the write protocol: a method name below, a sliced assign or a scatter.
WriteOp = str | SliceAssign | Scatter

# What a write returns: the variable read when used (an UnreadVariable), None with
# read_value=False, or, for a distributed variable written in cross-replica context (or with
# aggregation in replica context), its components' new values (a Mirrored, as TensorFlow's
# grouped update returns). It stays Any, as TensorLike does: code chains writes and reads the
# result without asking which it got (``v.assign(x).numpy()``), as in TensorFlow.
WriteResult: TypeAlias = Any

# The write operations every variable supports, by method name.
ASSIGN = "assign"
ASSIGN_ADD = "assign_add"
ASSIGN_SUB = "assign_sub"


class _VariableMeta(type):
    """Makes ``td.Variable(...)`` a factory: it returns the kind of variable the context needs."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Variable:
            # creation.py builds on this module, so it can only be imported here.
            from towerdist._src.variables.creation import create_variable  # noqa: PLC0415  (creation imports this module)

            return create_variable(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class Variable(ArrayOperators, metaclass=_VariableMeta):
    """A mutable array (``tf.Variable``).

    ``td.Variable(initial_value, trainable=None, *, name=None, dtype=None, shape=None,
    synchronization=VariableSynchronization.AUTO, aggregation=VariableAggregation.NONE,
    validate_shape=True, caching_device=None, constraint=None)``

    Outside a strategy it is a plain variable on the current device (``td.device``). In a
    ``MirroredStrategy`` scope it is a ``MirroredVariable`` (or a ``SyncOnReadVariable``
    with ``synchronization=ON_READ``) with one copy per replica; see ``docs/variables.md``.
    Arguments after ``trainable`` are keyword-only: TensorFlow's positional order differs
    from the order its documentation lists them in, so towerdist accepts neither.

    Args:
      initial_value: an array, a Python value, or a callable returning one (called once).
      trainable: whether optimizers should train it; default True (False for ON_READ).
      name: the name, ``"Variable"`` by default; ``v.name`` adds TensorFlow's ``":0"``.
      dtype: convert the initial value to this dtype. Python floats default to float32
        and Python ints to int32, as in TensorFlow.
      shape: the shape later assignments must have; ``None`` entries accept any size.
        Default: the initial value's shape.
      synchronization: ``td.VariableSynchronization``; when copies are synchronised
        (None means AUTO, as in TensorFlow).
      aggregation: ``td.VariableAggregation``; how replica-context writes are combined
        (None means NONE, as in TensorFlow).
      validate_shape: False lets assignments change the shape.
      caching_device: accepted and ignored (TensorFlow graph-mode option).
      constraint: a callable kept as ``v.constraint`` for optimizers to apply.

    Example:
      >>> v = td.Variable(1.0)
      >>> v.assign_add(2.0)
      <tf.Variable 'UnreadVariable' shape=() dtype=float32, numpy=3.0>
      >>> v
      <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=3.0>
      >>> w = td.Variable([1.0, 2.0, 3.0])
      >>> _ = w[1:].assign([5.0, 6.0])
      >>> w.numpy()
      array([1., 5., 6.], dtype=float32)
    """

    # --- what every kind of variable provides ---------------------------------------------

    @property
    def name(self) -> str:
        """The name with TensorFlow's output suffix, e.g. ``'Variable:0'``."""
        raise NotImplementedError

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype (a numpy dtype, equal to ``td.float32`` etc.)."""
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the current value, as a tuple."""
        raise NotImplementedError

    @property
    def device(self) -> str:
        """The canonical name of the device the value read here lives on."""
        raise NotImplementedError

    @property
    def trainable(self) -> bool:
        """Whether optimizers should train this variable."""
        raise NotImplementedError

    @property
    def synchronization(self) -> VariableSynchronization:
        """When the copies of a distributed variable are synchronised."""
        raise NotImplementedError

    @property
    def aggregation(self) -> VariableAggregation:
        """How writes made in replica context are combined."""
        raise NotImplementedError

    @property
    def distribute_strategy(self) -> Strategy:
        """The strategy whose scope created the variable (the default strategy outside one)."""
        raise NotImplementedError

    @property
    def constraint(self) -> Callable[[Any], Any] | None:
        """The constraint given at creation, or None."""
        raise NotImplementedError

    def value(self) -> TensorLike:
        """The current value as an array (a snapshot: later writes do not change it)."""
        raise NotImplementedError

    def assign(self, value: TensorLike, use_locking: bool = False, name: str | None = None, read_value: bool = True) -> WriteResult:
        """Sets the value to ``value`` (same shape; converted to the variable's dtype).

        Returns the variable, read when used (an :class:`UnreadVariable`, as in TensorFlow
        2: ``v.assign(x).numpy()``, ``v.assign(x).assign_add(y)``) when ``read_value`` is
        True, else None. A distributed variable written in cross-replica context, or with
        aggregation in replica context, returns the new values instead (see
        ``docs/variables.md``). ``use_locking`` and ``name`` are accepted for TensorFlow
        compatibility (writes are always atomic).
        """
        return self._write(ASSIGN, value, read_value)

    def assign_add(
        self, delta: TensorLike, use_locking: bool = False, name: str | None = None, read_value: bool = True
    ) -> WriteResult:
        """Adds ``delta`` (same shape as the variable); returns what :meth:`assign` returns."""
        return self._write(ASSIGN_ADD, delta, read_value)

    def assign_sub(
        self, delta: TensorLike, use_locking: bool = False, name: str | None = None, read_value: bool = True
    ) -> WriteResult:
        """Subtracts ``delta`` (same shape as the variable); returns what :meth:`assign` returns."""
        return self._write(ASSIGN_SUB, delta, read_value)

    def _write(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        """Applies the write ``op`` (``"assign"``, ``"assign_add"``, ``"assign_sub"``, a sliced assign or a scatter)."""
        raise NotImplementedError

    # --- scatter updates and sparse reads (rules in scatter.py) ------------------------------

    def scatter_add(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Adds ``sparse_delta.values`` to the rows ``sparse_delta.indices`` (a repeated index adds every row).

        ``sparse_delta`` is a ``td.IndexedSlices`` whose values have shape ``indices.shape +
        variable.shape[1:]``. Returns what :meth:`assign` returns. Every index is checked
        first: an index out of range raises and nothing is written. ``use_locking`` and
        ``name`` are accepted for TensorFlow compatibility.

        Raises:
          TypeError: ``sparse_delta`` is not an ``IndexedSlices``.
          InvalidArgumentError: an index is out of range, or the values have the wrong shape.
        """
        return self._scatter("scatter_add", sparse_delta)

    def scatter_sub(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Subtracts ``sparse_delta.values`` from its rows; as :meth:`scatter_add`."""
        return self._scatter("scatter_sub", sparse_delta)

    def scatter_mul(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Multiplies the rows ``sparse_delta.indices`` by ``sparse_delta.values``; as :meth:`scatter_add`."""
        return self._scatter("scatter_mul", sparse_delta)

    def scatter_div(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Divides the rows by ``sparse_delta.values`` (integers: truncated, a zero divisor raises); as :meth:`scatter_add`."""
        return self._scatter("scatter_div", sparse_delta)

    def scatter_min(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Sets each row to its minimum with ``sparse_delta.values``; as :meth:`scatter_add`."""
        return self._scatter("scatter_min", sparse_delta)

    def scatter_max(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Sets each row to its maximum with ``sparse_delta.values``; as :meth:`scatter_add`."""
        return self._scatter("scatter_max", sparse_delta)

    def scatter_update(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Sets the rows ``sparse_delta.indices`` to ``sparse_delta.values``; a repeated index takes its last row."""
        return self._scatter("scatter_update", sparse_delta)

    def batch_scatter_update(self, sparse_delta: IndexedSlices, use_locking: bool = False, name: str | None = None) -> WriteResult:
        """Sets ``v[b..., indices[b..., i]]`` to ``values[b..., i]`` for each batch ``b...`` (the indices' leading dimensions).

        A repeated index takes its last row; otherwise as :meth:`scatter_update`.
        """
        return self._scatter(scatter.BATCH, sparse_delta)

    def scatter_nd_add(self, indices: TensorLike, updates: TensorLike, name: str | None = None) -> WriteResult:
        """Adds ``updates`` at ``indices``, whose last axis addresses the first dimensions (``tf.scatter_nd_add``).

        ``updates`` has shape ``indices.shape[:-1] + variable.shape[K:]`` for indices of
        shape ``[..., K]``; a repeated index adds every update. Returns what :meth:`assign`
        returns; an index out of range raises and nothing is written.
        """
        return self._scatter_nd("scatter_nd_add", indices, updates)

    def scatter_nd_sub(self, indices: TensorLike, updates: TensorLike, name: str | None = None) -> WriteResult:
        """Subtracts ``updates`` at ``indices``; as :meth:`scatter_nd_add`."""
        return self._scatter_nd("scatter_nd_sub", indices, updates)

    def scatter_nd_update(self, indices: TensorLike, updates: TensorLike, name: str | None = None) -> WriteResult:
        """Sets the elements or slices at ``indices`` to ``updates``; a repeated index takes its last update."""
        return self._scatter_nd("scatter_nd_update", indices, updates)

    def sparse_read(self, indices: TensorLike, name: str | None = None) -> TensorLike:
        """The rows ``indices`` of the value (``value()[indices]``, a new array), as ``tf.gather`` reads them.

        Raises:
          InvalidArgumentError: an index is out of range.
        """
        with worded_at(self._api("sparse_read")):
            return scatter.sparse_read(self.value(), indices, self.name)

    def gather_nd(self, indices: TensorLike, name: str | None = None) -> TensorLike:
        """The elements or slices the last axis of ``indices`` addresses (``tf.gather_nd`` of the value).

        Raises:
          InvalidArgumentError: an index is out of range.
        """
        with worded_at(self._api("gather_nd")):
            return scatter.gather_nd(self.value(), indices, self.name)

    def _api(self, method: str) -> str:
        """The public call named in errors, e.g. ``"Variable.scatter_add()"``."""
        return f"Variable.{method}()"

    def _scatter(self, method: str, sparse_delta: IndexedSlices) -> WriteResult:
        with worded_at(self._api(method)):
            self._check_scatter(method)
            scatter.require_slices(sparse_delta, context.replica_context_in_run() is None)
            return self._write(Scatter(method), sparse_delta, True)

    def _scatter_nd(self, method: str, indices: TensorLike, updates: TensorLike) -> WriteResult:
        with worded_at(self._api(method)):
            self._check_scatter(method)
            return self._write(Scatter(method, indices), updates, True)

    def _check_scatter(self, method: str) -> None:
        """Raises if this kind of variable refuses the scatter ``method`` (every kind but plain variables may)."""

    def __getitem__(self, key: object) -> TensorLike:
        """The elements ``key`` selects, read now (a snapshot); on the host, with ``assign``.

        ``v[1:].assign([5.0, 6.0])`` writes those elements (see ``sliced.py``).
        """
        if isinstance(key, ArrayOperators):
            key = key._operand()
        return sliced.slice_of(self, key, ArrayOperators.__getitem__(self, key))

    # --- shared behaviour -----------------------------------------------------------------

    def read_value(self) -> TensorLike:
        """The current value as an array (the same as ``value()``)."""
        return self.value()

    def numpy(self) -> Any:
        """A writable host copy of the current value (a numpy scalar for a scalar variable)."""
        copy = _host_copy(self.value())
        return copy[()] if copy.ndim == 0 else copy

    def get_shape(self) -> tuple[int, ...]:
        """The shape (TensorFlow's alias of ``shape``)."""
        return self.shape

    def is_initialized(self) -> bool:
        """Always True: variables are initialised when created."""
        return True

    def ref(self) -> VariableRef:
        """A hashable reference to this variable, for use as a dict key or in a set."""
        return VariableRef(self)

    def experimental_ref(self) -> VariableRef:
        """The old name of :meth:`ref`."""
        return self.ref()

    def _towerdist_value(self) -> TensorLike:
        # The conversion protocol of td.convert_to_tensor (array_ops.py).
        return self.value()

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        value = self.value()
        if not backend.host().owns(value):
            value = _host_copy(value)
        if copy:
            return np.array(value, dtype=dtype, copy=True)
        if copy is False:
            return np.asarray(value, dtype=dtype, copy=False)
        return np.asarray(value, dtype=dtype)

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __bool__(self) -> bool:
        return bool(self._scalar("bool"))

    def _scalar(self, kind: str) -> Any:
        value = self.value()
        if value.ndim != 0:
            raise TypeError(
                f"{kind}() needs a scalar variable, but {self.name} has shape {tuple(value.shape)}; "
                f"index it or reduce it first."
            )
        return value.item()

    def __hash__(self) -> int:
        raise TypeError(
            f"Variable is unhashable (== compares values element-wise). Instead, use variable.ref() as "
            f"the key. (Variable: {self.name})"
        )

    def _operand(self) -> TensorLike:
        return self.value()

    # Element-wise, as TensorFlow's variables (hence unhashable, above).
    __eq__ = binary(operator.eq)[0]
    __ne__ = binary(operator.ne)[0]


class VariableRef:
    """A hashable reference to a variable (``v.ref()``); ``deref()`` gives the variable back."""

    __slots__ = ("_variable",)

    def __init__(self, variable: Variable) -> None:
        self._variable = variable

    def deref(self) -> Variable:
        """The variable this reference points to."""
        return self._variable

    def __hash__(self) -> int:
        return id(self._variable)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VariableRef) and other._variable is self._variable

    def __repr__(self) -> str:
        return f"<Reference wrapping {self._variable!r}>"


def format_variable(name: str, value: TensorLike) -> str:
    """TensorFlow's text of a single-device variable: ``<tf.Variable 'v:0' shape=() ...>``."""
    host = value if backend.host().owns(value) else _host_copy(value)
    host = np.asarray(host)
    text = str(host[()]) if host.ndim == 0 else repr(host)  # 0-d: numpy's scalar text, e.g. 1.0
    if "\n" in text:
        text = "\n" + text
    return f"<tf.Variable '{name}' shape={tuple(host.shape)} dtype={host.dtype.name}, numpy={text}>"


def _host_copy(value: TensorLike) -> np.ndarray:
    if backend.host().owns(value):
        return np.array(value, copy=True)
    copied: np.ndarray = backend.host().to_device(value, None)  # a cupy array: copied to the host
    return copied


_SPARE_MIN_BYTES = 1 << 16  # smaller buffers come from malloc's arenas, already mapped: nothing to save


class ResourceVariable(Variable):
    """A variable on one device (TensorFlow's ``ResourceVariable``).

    Created by ``td.Variable(...)`` outside multi-replica strategies, and as each
    component of a distributed variable. Do not construct it directly.
    """

    def __init__(
        self,
        array: TensorLike,
        *,
        name: str,
        device: DeviceSpec,
        trainable: bool,
        synchronization: VariableSynchronization,
        aggregation: VariableAggregation,
        shape: tuple[int | None, ...] | None,
        constraint: Callable[[Any], Any] | None,
        strategy: Strategy | None,
    ) -> None:
        # ``array`` must be a private buffer on ``device``: the variable adopts it.
        self._impl = backend.for_device(device)
        self._array = self._impl.freeze(array)
        self._name = name
        self._device = device
        self._devices = (device,)
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._declared_shape = shape
        self._constraint = constraint
        # Serialises read-modify-write updates; reads take no lock (the array is swapped whole).
        self._write_lock = threading.Lock()
        self._distribute_strategy = strategy
        # Set to a weakref of the distributed variable this is a component of, if any.
        self._distributed_container: Any = None
        # Large host values: the buffer the previous value was in, reused by the next write
        # when no snapshot still looks at it (a fresh multi-MiB buffer costs page faults on
        # top of the arithmetic: a 16 MiB assign_add took 2-3x the all-reduce it contains).
        self._buffers: UpdateBuffers | None = None

    @property
    def name(self) -> str:
        return f"{self._name}:0"

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(self._array.dtype)
        return dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def device(self) -> str:
        return self._device.name

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        return self._aggregation

    @property
    def distribute_strategy(self) -> Strategy:
        if self._distribute_strategy is not None:
            return self._distribute_strategy
        return context.default_strategy()

    @property
    def constraint(self) -> Callable[[Any], Any] | None:
        return self._constraint

    def value(self) -> TensorLike:
        # A new read-only object per read, as each TensorFlow read is a new tensor: reads by
        # different replicas are different objects (so ``run`` regroups them per replica).
        if update_fence.up:  # this replica may have handed over an update of this variable, not applied yet
            update_fence.wait(self)
        return self._impl.freeze(self._array)

    # --- the write protocol (distributed variables write components through it) ------------

    def _write(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        if update_fence.up:
            update_fence.wait(self)
        with self._write_lock:
            self._store(self._prepare(op, value))
        if not read_value:
            return None
        return unread(self)

    def _prepare(self, op: WriteOp, value: TensorLike) -> TensorLike:
        """The array ``op(value)`` would store, computed without changing the variable.

        Raises:
          ValueError / TypeError: ``value`` has the wrong shape or cannot be converted to
            the variable's dtype; the variable is unchanged.
        """
        if type(op) is Scatter:
            return self._prepare_scatter(op, value)
        array = to_array(value, self.dtype, describe_write(self._name, op))
        if type(op) is SliceAssign:
            return self._prepare_slice(op, array)
        if op == ASSIGN:
            self._check_assign_shape(tuple(array.shape))
            spare = self._spare_like(array)
            if spare is not None:
                np.copyto(spare, array)
                return spare
            return self._impl.copy(array, self._device)  # the variable owns what it stores
        if tuple(array.shape) != self.shape:
            raise InvalidArgumentError(
                f"Cannot {op} a value of shape {tuple(array.shape)} to variable {self.name} of shape "
                f"{self.shape}: the shapes must be equal (variables do not broadcast). Reshape the "
                f"value or use assign()."
            )
        array = self._impl.to_device(array, self._device)
        spare = self._spare_like(self._array)
        if spare is not None:
            (np.subtract if op == ASSIGN_SUB else np.add)(self._array, array, out=spare)
            return spare
        return self._impl.add(self._array, array, subtract=op == ASSIGN_SUB)

    def _prepare_slice(self, op: SliceAssign, array: TensorLike) -> TensorLike:
        """The value with the elements ``op.key`` selects replaced by ``array`` (broadcast)."""
        old = self._array
        op.check(old, array, self.name)
        array = self._impl.to_device(array, self._device)
        if _is_string(old.dtype) and array.dtype.itemsize > old.dtype.itemsize:
            return op.apply(old.astype(array.dtype), array)  # longer strings widen the variable, as assign does
        spare = self._spare_like(old)
        if spare is not None:
            np.copyto(spare, old)
            return op.apply(spare, array)
        return op.apply(self._impl.copy(old, self._device), array)

    def _prepare_scatter(self, op: Scatter, value: TensorLike) -> TensorLike:
        """The value with the scatter ``op`` of ``value`` (an ``IndexedSlices``, or updates) applied, in a new array."""
        if isinstance(value, PerReplica):
            value = value._local()
        indices, updates = op.split(value)
        try:
            updates = to_array(updates, self.dtype, f"{API} on {self.name}")
        except (TypeError, ValueError) as error:  # worded by the public method: Variable.scatter_add() on v:0: ...
            raise unworded(error) from None
        old = self._array
        impl = self._impl
        with impl.on_array_device(old):
            indices = scatter.index_array(impl, old, indices, self.name)
            updates = impl.to_device_of(updates, old)
            spare = self._spare_like(old)
            if spare is not None:
                np.copyto(spare, old)
                new = spare
            else:
                new = impl.copy(old, self._device)
            op.apply(new, indices, updates, self.name)
        return new

    def _spare_like(self, like: TensorLike) -> np.ndarray | None:
        """A private host buffer for a new value shaped like ``like``: the previous value's, if reusable."""
        if self._buffers is None or type(like) is not np.ndarray:
            return None
        spare: np.ndarray | None = self._buffers.out("value", like)
        return spare

    def _store(self, array: TensorLike) -> None:
        """Adopts ``array`` (private) as the new value; one computed on another GPU is moved here first."""
        old = self._array
        if type(array) is not type(old) or (type(array) is not np.ndarray and array.device != old.device):
            array = self._impl.to_device(array, self._device)  # (the common case, already here, needs no call)
        self._array = self._impl.freeze(array)
        if type(old) is np.ndarray and old.nbytes >= _SPARE_MIN_BYTES:
            if self._buffers is None:
                self._buffers = UpdateBuffers()
            self._buffers.retire("value", old if old.base is None else old.base)

    # --- the storage API (for the optimizer's fused update) --------------------------------
    #
    # ``_array`` is the stored value: read it freely (no lock; a write swaps it whole), never
    # assign it or write into it from outside this class. Writes that bypass ``_write``
    # (a value computed elsewhere for this variable) go through the three methods below,
    # each under this variable's write lock, so they serialise with ``assign`` and friends
    # (and :func:`adopt_shared`, below the class, for one array shared by several).

    def _adopt(self, array: TensorLike) -> None:
        """Makes ``array`` the value as it is: no copy, no move, no freeze.

        ``array`` must already be what a write would store: read-only (host), on this
        variable's device, of its dtype and an allowed shape, and never written again.
        (:func:`adopt_shared` does this for several variables that share one array.)
        """
        with self._write_lock:
            self._array = array

    def _adopt_moved(self, array: TensorLike) -> None:
        """Adopts ``array`` (private to this variable), moved to this device first and frozen.

        For a value computed on another device (a GPU component of a group updated once);
        the previous host buffer is kept for reuse, as a write does.
        """
        with self._write_lock:
            self._store(array)

    def _share(self, array: TensorLike, replacing: object) -> bool:
        """Holds ``array`` instead of ``replacing``, which views the same memory the same way.

        The caller has checked that the two arrays are views of one buffer (so the value does
        not change); this makes the components of one group hold the very same object. Does
        nothing (and returns False) if a write swapped the value since ``replacing`` was read.
        """
        with self._write_lock:
            if self._array is not replacing:
                return False
            self._array = array
            return True

    def _drop_spare(self) -> None:
        """Forgets the reusable buffer (another component of the same group keeps it)."""
        self._buffers = None

    def _check_assign_shape(self, shape: tuple[int, ...]) -> None:
        declared = self._declared_shape
        if declared is None:
            return
        if len(shape) != len(declared) or any(d is not None and d != s for d, s in zip(declared, shape)):
            raise ValueError(
                f"Cannot assign a value of shape {shape} to variable {self.name}: its shape is "
                f"{_format_shape(declared)}. Reshape the value, or create the variable with "
                f"shape=... (None for a free dimension) or validate_shape=False to allow other shapes."
            )

    def __deepcopy__(self, memo: dict[int, Any]) -> ResourceVariable:
        """A new, independent variable with this one's value, device and attributes (as TensorFlow's).

        The strategy, name, aggregation, synchronization and shape are kept; writes to the
        copy never change the original.
        """
        if update_fence.up:  # copied by the replica that handed its update over: the value after it
            update_fence.wait(self)
        copied = self._copy_with(self._impl.copy(self._array, self._device))
        memo[id(self)] = copied
        return copied

    def _copy_with(self, array: TensorLike) -> ResourceVariable:
        """A variable like this one holding ``array`` (a private buffer on this device)."""
        return ResourceVariable(
            array,
            name=self._name,
            device=self._device,
            trainable=self._trainable,
            synchronization=self._synchronization,
            aggregation=self._aggregation,
            shape=self._declared_shape,
            constraint=self._constraint,
            strategy=self._distribute_strategy,
        )

    def __repr__(self) -> str:
        if update_fence.up:  # printed by the replica that handed its update over: the value after it
            update_fence.wait(self)
        return format_variable(self.name, self._array)


class UnreadVariable(Variable):
    """What a write returns: the variable written, read when used (TensorFlow's ``_UnreadVariable``).

    ``v.assign(x)`` returns one. It reads the variable each time it is used, so it shows
    later writes too (it is not a snapshot), and writing it writes the variable:
    ``v.assign(1.0).assign_add(2.0)``. It is a different object from ``v`` (so
    ``v.assign(x) is v`` is False, and ``run`` regroups the ones its replicas return into a
    ``PerReplica``), named ``'UnreadVariable'``, with ``v``'s other attributes. Returned by a
    component of a distributed variable (a replica-local write, or one in ``extended.update``)
    it stands for that component; returned by ``v[key].assign(x)`` of a distributed variable
    in cross-replica context, it stands for the distributed variable (reads give its value,
    writes write every copy).
    """

    def __init__(self, target: Variable) -> None:
        self._target = target

    @property
    def name(self) -> str:
        return "UnreadVariable"

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._target.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._target.shape

    @property
    def device(self) -> str:
        return self._target.device

    @property
    def trainable(self) -> bool:
        return self._target.trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._target.synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        return self._target.aggregation

    @property
    def distribute_strategy(self) -> Strategy:
        return self._target.distribute_strategy

    @property
    def constraint(self) -> Callable[[Any], Any] | None:
        return self._target.constraint

    def value(self) -> TensorLike:
        return self._target.value()

    def _write(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        result = self._target._write(op, value, read_value)
        if result is None or type(result) is UnreadVariable:
            return result
        # Standing for a distributed variable (``v[key].assign(x)``): a chained write returns
        # one variable again, as TensorFlow's does, although it wrote every copy.
        return unread(self._target)

    def __deepcopy__(self, memo: dict[int, Any]) -> Variable:
        """A new, independent copy of the variable it stands for, holding the current value (TensorFlow's raises)."""
        return copy.deepcopy(self._target, memo)

    def __repr__(self) -> str:
        if update_fence.up:
            update_fence.wait(self._target)
        array = getattr(self._target, "_array", None)  # a distributed variable has none: its value then
        return format_variable(self.name, self._target.value() if array is None else array)


def unread(target: Variable) -> UnreadVariable:
    """The :class:`UnreadVariable` a write of ``target`` returns (a variable or a distributed variable)."""
    # Built directly: the factory metaclass's __call__ would cost more than the rest of a small write.
    result = object.__new__(UnreadVariable)
    result._target = target
    return result


def adopt_shared(variables: Sequence[ResourceVariable], array: TensorLike) -> None:
    """Makes one ``array`` the value of every variable in ``variables``, as :meth:`ResourceVariable._adopt` does.

    For the host components of one group (copies of a variable on logical CPUs): they hold
    the very same read-only array, so they keep sharing one buffer, and the next step's
    check that they do is an identity check. One call for the group (this is every
    training step's path), each variable written under its own write lock.
    """
    for variable in variables:
        with variable._write_lock:
            variable._array = array


def read_unread(result: Nest) -> Nest:
    """``result`` with each :class:`UnreadVariable` leaf read into an array (a snapshot)."""
    if type(result) is UnreadVariable:
        return result.value()
    if isinstance(result, (list, tuple, dict)):
        return nest.map_structure(lambda x: x.value() if type(x) is UnreadVariable else x, result)
    return result


def _format_shape(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


# --- converting values to a variable's dtype -------------------------------------------------


def to_array(value: TensorLike, dtype: DTypeLike | None, what: str) -> TensorLike:
    """``value`` as an array of ``dtype`` (None: TensorFlow's default dtype for it).

    Variables and distributed values are read first. Arrays convert to ``dtype`` when no
    information is lost in kind (int to float is fine, float to int is not); Python values
    must be representable in ``dtype``. Strings (numpy ``str_``/``bytes_`` arrays, which
    hold TensorFlow's ``tf.string``) convert only to strings, and keep their own width: a
    string variable takes longer strings, as a ``tf.string`` variable does.

    Raises:
      InvalidArgumentError: an array whose dtype cannot be converted.
      TypeError: a Python value that cannot be converted (e.g. 1.5 to an int32 variable).
      ValueError: a ragged nested list, or a value that is not numbers or strings.
    """
    if isinstance(value, Variable):
        value = value.value()
    elif isinstance(value, PerReplica):
        value = value._local()
    elif isinstance(value, DistributedValues):
        value = value._get()
        if isinstance(value, Variable):
            value = value.value()
    target = None if dtype is None else np.dtype(dtype)
    if backend.is_array(value):
        if target is None or value.dtype == target:
            return value
        if _is_string(value.dtype) or _is_string(target):
            return _as_strings(value, target, what, InvalidArgumentError)
        if not np.can_cast(value.dtype, target, "same_kind"):
            raise InvalidArgumentError(
                f"{what}: cannot convert an array of dtype {value.dtype} to dtype {target} "
                f"without losing information; cast it explicitly with td.cast(value, {target.name})."
            )
        return value.astype(target)
    raw = from_python(value, what)
    if _is_string(raw.dtype) or (target is not None and _is_string(target)):
        return raw if target is None else _as_strings(raw, target, what, TypeError)
    if raw.dtype.kind not in "biufc":
        raise TypeError(f"{what}: cannot convert {value!r} (of type {type(value).__name__}) to an array of numbers.")
    if target is None:
        return constant(value)
    integers = raw.dtype.kind in "biu" and target.kind in "iu"  # checked by value in _fits
    if not (integers or np.can_cast(raw.dtype, target, "same_kind")) or not _fits(raw, target):
        raise TypeError(f"{what}: cannot convert {value!r} to dtype {target.name}.")
    return np.asarray(raw, dtype=target)


def _is_string(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "US"


def _as_strings(array: TensorLike, target: np.dtype[Any], what: str, error: type[Exception]) -> TensorLike:
    """A string array as ``target``'s kind of string (``str_`` or ``bytes_``), at its own width."""
    if not (_is_string(array.dtype) and _is_string(target)):
        raise error(
            f"{what}: cannot convert an array of dtype {array.dtype} to dtype {target}: strings convert only "
            f"to and from strings. Format or parse the values explicitly."
        )
    if array.dtype.kind == target.kind:
        return array
    try:
        return array.astype(target.kind)  # numpy picks the width the strings need
    except UnicodeEncodeError:
        raise error(
            f"{what}: cannot store text that is not ASCII in a bytes variable; encode it to bytes first."
        ) from None


def _fits(raw: np.ndarray, target: np.dtype[Any]) -> bool:
    if raw.dtype.kind in "iu" and target.kind in "iu" and raw.size:
        info = np.iinfo(target)
        return bool(raw.min() >= info.min and raw.max() <= info.max)
    return True
