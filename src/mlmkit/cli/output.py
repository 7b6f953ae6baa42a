"""Keep what a command prints readable: the libraries' progress bars only on a terminal (in a
log file or a SLURM job's output each would be one line of carriage returns), and library
notes that tell a user nothing silenced where they are made."""

from __future__ import annotations

import logging
import os
import sys

# what the libraries read at import to leave their progress bars out (datasets: tokenizing,
# saving; huggingface_hub, and transformers through it: loading and writing weights)
PROGRESS_BAR_SWITCHES = ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS")


def _not_deepspeeds_cpu_note(record: logging.LogRecord) -> bool:
    """Drop DeepSpeed's warning, at its import on a machine without a GPU, that it found none:
    a CPU run is what was asked for."""
    return "Setting accelerator to CPU" not in record.getMessage()


def quiet_libraries() -> None:
    """Turn the libraries' progress bars off where stderr is not a terminal (the processes this
    one starts inherit it), and DeepSpeed's note that it found no GPU."""
    try:
        terminal = sys.stderr.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if not terminal:
        for name in PROGRESS_BAR_SWITCHES:
            os.environ.setdefault(name, "1")
    deepspeed = logging.getLogger("DeepSpeed")
    if _not_deepspeeds_cpu_note not in deepspeed.filters:
        deepspeed.addFilter(_not_deepspeeds_cpu_note)
