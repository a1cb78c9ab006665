"""``python -m towerdist``: the ``towerdist`` command (``towerdist info``, ``towerdist bench``)."""

from towerdist._src.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
