"""mlmkit's Hydra commands compose their config once (``cli.hydra_mode``): Hydra's own
lookup of ``hydra.mode`` finds it unset in every command's config, which is what makes
skipping that lookup safe; a run composes once, a sweep still sweeps, and a command line
that can set the mode some other way gets Hydra's own lookup."""

from __future__ import annotations

import importlib.util
import json
from importlib.resources import files

import pytest
from runs import python_run

from mlmkit.cli.hydra_mode import mode_may_come_from_config
from mlmkit.config.compose import CONFIG_MODULE, register_configs

COMMAND_CONFIGS = sorted(p.name[:-5] for p in files(CONFIG_MODULE).iterdir() if p.name.endswith(".yaml"))
LAUNCHERS = [[]] + ([["hydra/launcher=submitit_slurm"]]
                    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") else [])


@pytest.mark.parametrize("overrides", LAUNCHERS, ids=lambda o: o[0] if o else "basic")
def test_hydras_own_lookup_finds_no_mode_in_any_commands_config(overrides):
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    register_configs()
    GlobalHydra.instance().clear()
    assert {"config", "evaluate", "finetune", "glue"} <= set(COMMAND_CONFIGS)
    for name in COMMAND_CONFIGS:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            hydra = GlobalHydra.instance().hydra
            # the composition Hydra makes for its lookup must work, or None would mean a failure
            cfg = hydra.compose_config(config_name=name, overrides=list(overrides), run_mode=RunMode.MULTIRUN,
                                       with_log_configuration=False, validate_sweep_overrides=False)
            assert cfg.hydra.mode is None, name
            assert hydra.get_mode(config_name=name, overrides=list(overrides)) is None, name


def test_what_can_set_the_mode_besides_the_command_line():
    assert not mode_may_come_from_config(["model=bert-mini", "train.max_steps=3", "--multirun",
                                          "hydra.run.dir=out", "hydra/launcher=submitit_slurm"])
    for argv in (["hydra.mode=MULTIRUN"], ["+hydra.mode=RUN"], ["--config-dir", "mine"], ["-cd", "mine"],
                 ["--config-name=mine"], ["-cn", "mine"], ["--config-path", "x"], ["hydra.searchpath=[file://x]"],
                 ["--config-d", "mine"], ["--config-n=mine"]):  # argparse's abbreviations of the flags
        assert mode_may_come_from_config(["model=bert-mini", *argv]), argv


# In a process of its own: mlmkit train with Hydra's compositions counted. Its job fails at once
# (no corpus file), after Hydra made the run or sweep dir.
COUNTED = """
import atexit, json, sys
from hydra._internal.hydra import Hydra
original, calls = Hydra.compose_config, []
def compose_config(self, *args, **kwargs):
    calls.append(str(kwargs.get("run_mode")))
    return original(self, *args, **kwargs)
Hydra.compose_config = compose_config
atexit.register(lambda: print(json.dumps(calls)))
from mlmkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _compositions(tmp_path, *argv: str) -> list[str]:
    flags = [a for a in argv if a.startswith("--")]  # Hydra's flags come before the settings
    proc = python_run("-c", COUNTED, "train", *flags, "data=files", f"data.train_files=[{tmp_path}/absent.txt]",
                      f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep",
                      *(a for a in argv if a not in flags),
                      cwd=tmp_path)
    assert proc.returncode == 2 and "Error: data.train_files: no file matches" in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_run_composes_once_and_a_sweep_still_sweeps(tmp_path):
    assert _compositions(tmp_path) == ["RunMode.RUN"]
    assert (tmp_path / "run").is_dir() and not (tmp_path / "sweep").exists()
    # --multirun: the sweep's config (each job's comes from it); Hydra composed one before, for the mode
    assert _compositions(tmp_path, "--multirun", "train.seed=1") == ["RunMode.MULTIRUN"]
    assert (tmp_path / "sweep" / "0").is_dir()
    # the mode set as a setting: Hydra looks it up as it does, and sweeps
    assert _compositions(tmp_path, "hydra.mode=MULTIRUN", "train.seed=2") == ["RunMode.MULTIRUN"] * 2
    import yaml

    swept = yaml.safe_load((tmp_path / "sweep" / "multirun.yaml").read_text())["hydra"]["overrides"]["task"]
    assert swept.count("train.seed=2") == 1
    assert not (tmp_path / "sweep" / "0" / ".hydra").exists()  # the refused job wrote no record
