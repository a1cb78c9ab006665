"""One line describing the machine, printed at the top of every benchmark."""

from __future__ import annotations

import os
import platform

import numpy as np


def machine_info() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass  # not Linux: keep platform.processor()
    return (
        f"machine: {model}; {os.cpu_count()} logical cores; Python {platform.python_version()}; "
        f"numpy {np.__version__}; {platform.system()} {platform.release()}"
    )
