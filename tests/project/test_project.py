"""Project-level promises: the README's commands, CI, packaging, the public namespaces."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def quick_start_commands() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_quick_start_has_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert 'pip install -e ".[examples]"' in commands[0] and commands[0].endswith("examples/train_digits.py")
    assert 'pip install -e ".[test]"' in commands[1] and commands[1].endswith("-m pytest")


def test_ci_runs_the_readme_test_command_in_a_fresh_virtualenv():
    script = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in script and "mktemp -d" in script
    assert 'pip" install --quiet -e ".[test]"' in script
    assert 'python" -m pytest' in script
    assert '"$status" -eq 5' in script  # "no tests collected" is a failure
    assert "mkdocs build --strict" in script  # the docs site is built, and broken references fail CI


def test_runtime_dependencies_are_numpy_and_optree_only():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = sorted(re.split(r"[<>=!~ ]", dep, maxsplit=1)[0] for dep in project["dependencies"])
    assert names == ["numpy", "optree"]
    extras = project["optional-dependencies"]
    assert {"test", "examples", "cuda12", "cuda13"} <= set(extras)
    example_needs = {re.split(r"[<>=!~ ]", dep, maxsplit=1)[0] for dep in extras["examples"]}
    test_needs = {re.split(r"[<>=!~ ]", dep, maxsplit=1)[0] for dep in extras["test"]}
    assert example_needs <= test_needs  # the test run exercises the examples
    assert any(dep.startswith("cupy-cuda12x") for dep in extras["cuda12"])
    assert any(dep.startswith("cupy-cuda13x") for dep in extras["cuda13"])


def test_package_is_typed():
    assert (ROOT / "src" / "towerdist" / "py.typed").exists()


@pytest.mark.parametrize(
    "module", ["towerdist", "towerdist.distribute", "towerdist.distribute.experimental", "towerdist.config",
               "towerdist.errors", "towerdist.types.experimental", "towerdist.optimizers", "towerdist.metrics",
               "towerdist.nn", "towerdist.train", "towerdist.data"]
)
def test_public_namespaces_export_what_they_list(module):
    namespace = importlib.import_module(module)
    assert namespace.__all__, f"{module} exports nothing"
    missing = [name for name in namespace.__all__ if not hasattr(namespace, name)]
    assert missing == []


def test_importing_towerdist_does_not_import_cupy():
    import subprocess
    import sys

    code = "import sys, towerdist; print('cupy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_package_version_is_the_one_pyproject_declares():
    import tomllib

    import towerdist

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert towerdist.__version__ == declared
