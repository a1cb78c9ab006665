"""towerdist's version, kept below every other module so that any of them may record it."""

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"  # the same as pyproject.toml's [project] version
