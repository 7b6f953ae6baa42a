"""A command's record of its settings in its run dir, ``.hydra/`` (config.yaml, hydra.yaml and
overrides.yaml, as Hydra writes them), written by mlmkit once the command's checks have passed.

mlmkit's configs set ``hydra.output_subdir`` to null, so Hydra writes nothing into a run dir
before mlmkit has looked at it: a command refused there (a run dir in use, one that already
holds a run, a resume that would mix runs, a fine-tuning into a folder that holds one) leaves
the settings of the run already there as they were, and ``mlmkit eval``, ``mlmkit sweep`` and a
resume go on reading that run's own.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

RECORD_DIR = ".hydra"


def write_record(run_dir: str | os.PathLike, cfg: DictConfig) -> None:
    """Write ``<run_dir>/.hydra/``: ``cfg`` (the command's settings as it runs them), Hydra's
    own config and the command line's overrides; each file whole (written aside, then renamed)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    folder = Path(run_dir) / RECORD_DIR
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "config.yaml": cfg,
        "hydra.yaml": OmegaConf.create({"hydra": hydra_cfg}),
        "overrides.yaml": hydra_cfg.overrides.task,
    }
    for name, node in files.items():
        tmp = folder / f".tmp-{os.getpid()}-{name}"
        tmp.write_text(OmegaConf.to_yaml(node), encoding="utf-8")
        os.replace(tmp, folder / name)
