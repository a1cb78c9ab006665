"""What ``Checkpoint.restore`` returns: checks on how well the checkpoint matched the objects."""

from __future__ import annotations

from typing import TYPE_CHECKING

from towerdist._src.checkpoint import graph, saving
from towerdist._src.checkpoint.deferred import Restore

if TYPE_CHECKING:
    from towerdist._src.checkpoint.checkpoint import Checkpoint

__all__ = ["SAVE_COUNTER", "CheckpointLoadStatus", "InitializationOnlyStatus"]

SAVE_COUNTER = "save_counter"


class CheckpointLoadStatus:
    """The result of :meth:`Checkpoint.restore`: checks on how well the checkpoint matched.

    Variables and saveables (input iterators) count alike: each is an object that takes
    one saved entry. A saved value whose object does not exist yet waits for it (see
    ``deferred.py``): the checks see what has happened by the time they are called.
    """

    def __init__(self, checkpoint: Checkpoint, restore: Restore) -> None:
        self._checkpoint = checkpoint
        self._restore = restore

    def _pending_slots(self) -> list[str]:
        return sorted(k for k, (opt, slot) in self._restore.slots.items() if slot in opt._deferred_slots)

    def _objects_without_value(self) -> tuple[list[str], list[str]]:
        """The keys of existing objects the checkpoint has no value for, and of those that did not receive theirs."""
        found = graph.walk(self._checkpoint._checkpoint_dependencies())
        live = [*saving.saved_variables(found, strict=False), *found.saveables]
        entries, consumed = self._restore.entries, self._restore.consumed
        return sorted(k for k in live if k not in entries), sorted(k for k in live if k in entries and k not in consumed)

    def _existing_problems(self) -> list[str]:
        missing, unassigned = self._objects_without_value()
        problems = []
        if missing:
            problems.append(f"objects with no value in the checkpoint: {missing}")
        if unassigned:
            problems.append(
                f"objects that did not receive their saved value: {unassigned} (they were added to a list or dict in "
                f"place after the restore; assign the list or dict to its attribute again, or restore again)"
            )
        return problems

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Asserts that every saved value went to an object and every object received one.

        A value whose object does not exist yet fails it until the object is created or
        attached; so do values for optimizer slots that do not exist yet, until the
        optimizer creates them.

        Raises:
          AssertionError: listing the keys at fault.
        """
        problems = []
        unused = sorted(self._restore.waiting)
        if unused:
            problems.append(f"values in the checkpoint matched to no object: {unused}")
        pending = self._pending_slots()
        if pending:
            problems.append(
                f"optimizer slot values waiting for their slot to be created (run a step or optimizer.build()): "
                f"{pending}"
            )
        problems += self._existing_problems()
        if problems:
            waits = " (A value waits for its object: it is restored when the object is created or attached.)"
            raise AssertionError(
                f"Checkpoint {self._restore.prefix} was not fully consumed: "
                + "; ".join(problems)
                + "."
                + (waits if unused else "")
            )
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Asserts that every object that exists now received its value (values still waiting are fine).

        Raises:
          AssertionError: listing the objects with no saved value, or that did not receive it.
        """
        problems = self._existing_problems()
        if problems:
            raise AssertionError(f"Checkpoint {self._restore.prefix} did not restore every existing object: "
                                 + "; ".join(problems) + ".")
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """Asserts that at least one object other than ``save_counter`` received its value.

        Raises:
          AssertionError: nothing but the save counter matched (yet).
        """
        if not self._restore.consumed - {SAVE_COUNTER}:
            raise AssertionError(
                f"Nothing except the save counter was restored from {self._restore.prefix}: no key of the checkpoint "
                f"matches this Checkpoint's objects. Check the keyword names you passed to td.train.Checkpoint."
            )
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Declares a partial restore intended: no warning about values that found no object.

        Without it, when the restore is deleted (its checkpoint and this status gone) with
        saved values that never found their object, the ``towerdist`` logger warns,
        listing them, as TensorFlow does. Values still wait for their objects either way.
        """
        self._restore.expect_partial()
        return self

    def run_restore_ops(self, session: object = None) -> None:
        """Does nothing: restores happen eagerly (TensorFlow graph-mode compatibility)."""
        del session


class InitializationOnlyStatus:
    """The status of ``restore(None)``: nothing was restored."""

    def assert_consumed(self) -> InitializationOnlyStatus:
        """Always raises: there was no checkpoint."""
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def assert_existing_objects_matched(self) -> InitializationOnlyStatus:
        """Always raises: there was no checkpoint."""
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def assert_nontrivial_match(self) -> InitializationOnlyStatus:
        """Always raises: there was no checkpoint."""
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def expect_partial(self) -> InitializationOnlyStatus:
        """Returns this status."""
        return self

    def run_restore_ops(self, session: object = None) -> None:
        """Does nothing."""
        del session
