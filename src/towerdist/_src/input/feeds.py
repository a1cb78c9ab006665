"""Where one worker's steps come from, and the position a checkpoint keeps of it.

A *feed* turns this worker's input pipeline(s) into steps (one piece per local replica),
the way its distributed dataset says, and keeps, in the units of that way, what it has
read but not yet made into steps. Each step comes with its *raw* form, in the same units:
what the step was cut from. A distributed iterator keeps the raw form of the steps it read
ahead and of those it handed out that no ``strategy.run`` has used yet; saved, they go back
in front of the feed's own leftovers (:meth:`Feed.leftover`), so a restored feed — on this
number of replicas or another — makes its steps from exactly the data the saved run would
have used next.

The kinds, by the rule that makes the steps (``split``):

* :class:`BatchFeed` — every global batch split across all replicas (sharding by data; or
  one replica); the unit is the global batch, so it restores onto any number of replicas
  or workers.
* :class:`RowFeed` — the worker's rows re-cut by its rotation of the per-replica sizes (the
  cycling rule); the unit is the row.
* :class:`SplitAllFeed` — each element split over every replica of every worker, this
  worker feeding all the pieces, its replicas in turn (a worker's own stream of unknown batch
  size); the unit is the element with the index of its next group of pieces.
* :class:`ElementFeed` — whole elements of one pipeline, ``num_local`` per step
  (``distribute_datasets_from_function``); the unit is the element. Restored onto a number
  of replicas that changes the per-replica batch size, it cuts the rows of the rest of the
  pass into batches of the new size (``rows``).
* :class:`PerReplicaFeed` — one pipeline per local replica, one element of each per step
  (``InputReplicationMode.PER_REPLICA``); the unit is the element, per pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, TypedDict, Unpack

from towerdist._src import nest
from towerdist._src.data.cursor import Cursor
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.structure import unstack_count
from towerdist._src.data.transforms import RowCutter
from towerdist._src.input.split import legacy_split
from towerdist._src.type_aliases import Nest

__all__ = ["MISSING", "BatchFeed", "ElementFeed", "Ended", "Feed", "PerReplicaFeed", "RowFeed", "SplitAllFeed", "Step"]

MISSING: Any = object()  # a replica without data in this step


class Step(NamedTuple):
    """One step: a piece per local replica (``MISSING`` where a replica has no data), and its raw form."""

    pieces: list[Any]
    raw: Any


class Ended(TypedDict, total=False):
    """How the pipelines had ended when the position was saved: ``Feed``'s keywords, passed on by its kinds."""

    exhausted: bool
    error: BaseException | None


class Feed:
    """One worker's steps from its input pipeline(s) (see the module docstring).

    Args:
      datasets: the worker's pipeline(s).
      cursors: a pass over each (new, or restored at a saved position).
      leftover: raw units read before and not yet made into steps, to use first.
      exhausted: the pipelines had ended (or failed, ``error``) when the position was saved:
        the leftovers are all there is, then ``error`` (if any) is raised.
    """

    kind = ""

    def __init__(
        self,
        datasets: Sequence[Dataset],
        cursors: Sequence[Cursor],
        leftover: list[Any],
        exhausted: bool = False,
        error: BaseException | None = None,
    ) -> None:
        self.datasets = list(datasets)
        self.cursors = list(cursors)
        self._leftover = list(leftover)
        self._exhausted = exhausted
        self._error = error

    @property
    def exhausted(self) -> bool:
        """The pipelines had ended when the position this feed resumes was saved."""
        return self._exhausted

    @property
    def error(self) -> BaseException | None:
        """The error an exhausted feed raises after its leftovers (None: it just ends)."""
        return self._error

    def _source(self, k: int = 0) -> Iterator[Any]:
        """Pipeline ``k``'s elements: its pass, or (exhausted) nothing but the saved error, if any."""
        if not self._exhausted:
            return iter(self.cursors[k])
        return _ended(self._error)

    def steps(self) -> Iterator[Step]:
        raise NotImplementedError

    def leftover(self) -> list[Any]:
        """What was read from the pipeline(s) but is not in a step yet, as raw units (read between steps)."""
        return list(self._leftover)

    def close(self) -> None:
        for cursor in self.cursors:
            cursor.close()

    # --- raw units --------------------------------------------------------------------------

    @staticmethod
    def units_of(raw: Nest) -> list[Nest]:
        """The raw units of a step's raw form, in order (what goes back in front of the leftovers)."""
        return [raw]

    @staticmethod
    def merged(units: list[Any]) -> list[Any]:
        """``units`` (steps' raw forms, then the leftovers, in order) as the leftovers of a restored feed."""
        return units

    def state(self) -> dict[str, Any]:
        """What the feed keeps besides its leftovers (saved with it)."""
        return {}


class BatchFeed(Feed):
    """Each global batch split into ``num_replicas`` pieces; this worker keeps ``pieces[first:first+local]``.

    With one replica in all, the batch itself is the piece.
    """

    kind = "batches"

    def __init__(
        self,
        datasets: Sequence[Dataset],
        cursors: Sequence[Cursor],
        leftover: list[Any],
        num: int,
        first: int,
        local: int,
        **ended: Unpack[Ended],
    ) -> None:
        super().__init__(datasets, cursors, leftover, **ended)
        self._num, self._first, self._local = num, first, local

    def steps(self) -> Iterator[Step]:
        source = self._source()
        leftover = self._leftover
        num, first, local = self._num, self._first, self._local
        while True:
            if leftover:
                element = leftover.pop(0)
            else:
                try:
                    element = next(source)
                except StopIteration:
                    return
            pieces = [element] if num == 1 else legacy_split(element, num)[first : first + local]
            yield Step(pieces, element)


class RowFeed(Feed):
    """This worker's rows re-cut by its rotation of the per-replica sizes, ``local`` pieces per step.

    ``turn`` is the index of the next size in the rotation (after ``s`` steps of a worker with
    ``R`` replicas among ``W`` workers: ``R * (s mod W)``).
    """

    kind = "rows"

    def __init__(
        self,
        datasets: Sequence[Dataset],
        cursors: Sequence[Cursor],
        leftover: list[Any],
        sizes: Sequence[int],
        local: int,
        turn: int = 0,
        template: Nest = None,
        cut_all: bool = False,
        **ended: Unpack[Ended],
    ) -> None:
        super().__init__(datasets, cursors, [], **ended)
        self._cutter = RowCutter(sizes)
        self._cutter.resume(
            {
                "pending": [[unit, 0] for unit in leftover if _rows(unit) > 0],
                "template": template if template is not None else (leftover[0] if leftover else None),
                "turn": turn % len(sizes),
                "exhausted": cut_all,
            }
        )
        self._local = local

    def steps(self) -> Iterator[Step]:
        return _grouped(self._cutter.pieces(self._source()), self._local)

    def leftover(self) -> list[Any]:
        position = self._cutter.position()
        return [_rows_from(element, start) for element, start in position["pending"]]

    @staticmethod
    def units_of(raw: Nest) -> list[Nest]:
        return [piece for piece in raw if _rows(piece) > 0]

    def state(self) -> dict[str, Any]:
        position = self._cutter.position()
        return {"template": position["template"], "cut_all": position["exhausted"]}


class SplitAllFeed(Feed):
    """Each element split over all ``num`` replicas; this worker feeds every piece, ``local`` per step.

    A unit is ``[element, next group]``: the element and the index of the first piece of its
    next step.
    """

    kind = "split_all"

    def __init__(
        self,
        datasets: Sequence[Dataset],
        cursors: Sequence[Cursor],
        leftover: list[Any],
        num: int,
        local: int,
        **ended: Unpack[Ended],
    ) -> None:
        super().__init__(datasets, cursors, leftover, **ended)
        self._num, self._local = num, local

    def steps(self) -> Iterator[Step]:
        source = self._source()
        leftover = self._leftover
        num, local = self._num, self._local
        while True:
            if leftover:
                element, start = leftover[0]
            else:
                try:
                    element, start = next(source), 0
                except StopIteration:
                    return
                leftover.append([element, 0])
            pieces = legacy_split(element, num)
            if start + local >= num:
                leftover.pop(0)
            else:
                leftover[0] = [element, start + local]
            yield Step(pieces[start : start + local], [element, start])

    @staticmethod
    def merged(units: list[Any]) -> list[Any]:
        # A unit that starts past group 0 continues the element of the unit before it (the steps
        # cut from one element, then what is left of it): the first unit of an element stands for
        # its groups from there on. (Not compared by identity: a pipeline may yield one object twice.)
        kept: list[Any] = []
        for element, start in units:
            if kept and start != 0:
                continue
            kept.append([element, start])
        return kept


class ElementFeed(Feed):
    """Whole elements of one pipeline, ``local`` consecutive ones per step (the last padded with ``MISSING``).

    With ``recut`` (a number of rows), the rows of the leftovers and of the rest of the pass are
    cut into elements of that many rows instead: a pass restored onto another per-replica batch
    size (see ``resume.recut_problem`` for when that is exact). ``rows`` is the number of rows of
    the pipeline's elements when they can be cut again, ``batch_size`` the size of its last
    ``batch`` in any case: both saved with the position (None when unknown).
    """

    kind = "elements"

    def __init__(
        self,
        datasets: Sequence[Dataset],
        cursors: Sequence[Cursor],
        leftover: list[Any],
        local: int,
        rows: int | None = None,
        batch_size: int | None = None,
        recut: int | None = None,
        **ended: Unpack[Ended],
    ) -> None:
        super().__init__(datasets, cursors, leftover, **ended)
        self._local, self._rows, self._batch_size, self._recut = local, rows, batch_size, recut
        self._cutter: RowCutter | None = None
        if recut is not None:
            self._cutter = RowCutter([recut])
            self._cutter.resume(
                {
                    "pending": [[unit, 0] for unit in self._leftover if _rows(unit) > 0],
                    "template": self._leftover[0] if self._leftover else None,
                    "turn": 0,
                    "exhausted": False,
                }
            )
            self._leftover = []

    def _elements(self) -> Iterator[Any]:
        if self._cutter is not None:
            yield from self._cutter.pieces(self._source())
            return
        source = self._source()
        leftover = self._leftover
        while True:
            if leftover:
                yield leftover.pop(0)
                continue
            try:
                yield next(source)
            except StopIteration:
                return

    def steps(self) -> Iterator[Step]:
        return _grouped(self._elements(), self._local)

    def leftover(self) -> list[Any]:
        if self._cutter is not None:
            return [_rows_from(element, start) for element, start in self._cutter.position()["pending"]]
        return list(self._leftover)

    @staticmethod
    def units_of(raw: Nest) -> list[Nest]:
        return list(raw)

    def state(self) -> dict[str, Any]:
        rows = self._recut if self._recut is not None else self._rows
        return {"rows": rows, "batch_size": self._batch_size, "recut": self._recut}


class PerReplicaFeed(Feed):
    """One pipeline per local replica; a step takes the next element of each (``MISSING`` once one ends).

    Leftovers are per pipeline: a unit is the list of every pipeline's element of a step
    (``None`` for a pipeline that had ended).
    """

    kind = "per_replica"

    def steps(self) -> Iterator[Step]:
        sources = [self._source(k) for k in range(len(self.cursors))]
        leftover = self._leftover
        while True:
            if leftover:
                unit = leftover.pop(0)
                step = [MISSING if element is None else element for element in unit]
            else:
                step, failure = [], None
                for source in sources:
                    try:
                        step.append(next(source, MISSING))
                    except Exception as error:
                        failure = error
                        break
                if failure is not None:
                    # The elements the other pipelines gave for this step come first, then the error.
                    step += [MISSING] * (len(sources) - len(step))
                    if any(piece is not MISSING for piece in step):
                        yield Step(step, [None if piece is MISSING else piece for piece in step])
                    raise failure
            if all(piece is MISSING for piece in step):
                return
            yield Step(step, [None if piece is MISSING else piece for piece in step])


def _grouped(units: Iterator[Any], local: int) -> Iterator[Step]:
    """``units`` in steps of ``local``, a short last one padded with ``MISSING``.

    The units read before an error make a short step delivered before it: no element read is lost.
    """
    step: list[Any] = []
    try:
        for unit in units:
            step.append(unit)
            if len(step) == local:
                yield Step(step, list(step))
                step = []
    except Exception:
        if step:
            yield Step(step + [MISSING] * (local - len(step)), list(step))
        raise
    if step:
        yield Step(step + [MISSING] * (local - len(step)), list(step))


def _ended(error: BaseException | None) -> Iterator[Any]:
    """An ended pipeline's elements: none, then its saved error (if any)."""
    if error is not None:
        raise error
    yield from ()


def _rows(element: Nest) -> int:
    return unstack_count(nest.flatten(element)[0], "rebatch")


def _rows_from(element: Nest, start: int) -> Nest:
    """``element`` without its first ``start`` rows (views)."""
    if start == 0:
        return element
    leaves, treespec = nest.flatten(element)
    return treespec.unflatten([leaf[start:] for leaf in leaves])
