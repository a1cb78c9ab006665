"""Restores a ``td.data`` iterator in a new process: what ``tests/data/iterator_checkpoint_helpers`` runs.

Reads Python code defining ``make()`` from standard input, restores an iterator of
``make()`` at the position saved in ``argv[1]`` and writes what it yields, encoded with
``state_codec``, to ``argv[2]``.
"""

from __future__ import annotations

import sys

from towerdist._src.data import state_codec


def main() -> None:
    state_path, out_path = sys.argv[1], sys.argv[2]
    namespace: dict[str, object] = {}
    exec(sys.stdin.read(), namespace)  # noqa: S102  (the test's own pipeline code)
    iterator = iter(namespace["make"]())  # type: ignore[operator]
    with open(state_path, "rb") as f:
        iterator._checkpoint_restorer(f.read())()
    rest = list(iterator)
    with open(out_path, "wb") as f:
        f.write(state_codec.encode(rest))


if __name__ == "__main__":
    main()
