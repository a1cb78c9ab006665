"""The launch commands of the README and ``docs/multi-worker.md`` work as written after the README's install.

The README installs into ``.venv`` without activating it, so a command that says ``mpiexec`` or
``python`` would find another (or no) interpreter and launcher: every command that launches
workers names ``.venv/bin/mpiexec`` and ``.venv/bin/python``, and every install names
``.venv/bin/pip``. The README's two-process command is then run as written, from a directory
where ``.venv`` is this test run's virtualenv.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/multi-worker.md"]


def _code(page: str) -> list[str]:
    """Every command line of the page's bash blocks and every inline code span (continuations joined)."""
    text = (ROOT / page).read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [re.sub(r"\s+#.*$", "", line).strip() for line in lines] + spans


def _launches(page: str) -> list[str]:
    return [code for code in _code(page) if re.search(r"\bmpiexec\b.*\bpython\b", code)]


@pytest.mark.parametrize("page", PAGES)
def test_every_launch_command_names_the_virtualenvs_mpiexec_and_python(page):
    launches = _launches(page)
    assert launches, f"{page} shows no launch command"
    for code in launches:
        for command in code.split("&&"):
            if "mpiexec" in command:
                assert re.search(r"(^|\s)\.venv/bin/mpiexec\s", command), f"{page}: {command!r} (the venv is not activated)"
                pythons = re.findall(r"(\S*python\S*)", command.split("mpiexec", 1)[1])
                assert pythons and all(p == ".venv/bin/python" for p in pythons), f"{page}: {command!r}"


@pytest.mark.parametrize("page", PAGES)
def test_every_install_command_names_the_virtualenvs_pip(page):
    for code in _code(page):
        for command in code.split("&&"):
            if re.search(r"\bpip install\b", command) and "python3 -m venv" not in command:
                assert command.strip().startswith(".venv/bin/pip install"), f"{page}: {command!r}"


def _readme_two_process_command() -> str:
    (code,) = [c for c in _launches("README.md") if c.startswith(".venv/bin/pip") and "examples/train_digits.py" in c]
    install, launch = (part.strip() for part in code.split("&&"))
    assert install == '.venv/bin/pip install -e ".[mpi-mpich]"'
    docs = _launches("docs/multi-worker.md")
    assert launch in docs  # the docs show the same command
    return launch


@pytest.mark.launches_mpi
def test_the_readmes_two_process_command_runs_as_written(tmp_path):
    launch = _readme_two_process_command()
    venv_bin = pathlib.Path(sys.executable).parent
    if not (venv_bin / "mpiexec").exists():
        pytest.skip("this run's virtualenv has no mpiexec (the mpi-mpich extra)")
    # A directory laid out as the checkout after the README's install: .venv, examples/.
    (tmp_path / ".venv").symlink_to(venv_bin.parent, target_is_directory=True)
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        launch, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env  # noqa: S602  (the README's command, as written)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "on 2 replica(s)" in done.stdout and "Test accuracy 0.9" in done.stdout, done.stdout[-2000:]
