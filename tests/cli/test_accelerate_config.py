"""What an installed mlmkit finds without a checkout: the packaged accelerate configs
(``mlmkit accelerate-config``), and a ``--help`` that offers only the config groups the
command can override."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from runs import ROOT, run_cli

CONFIGS = ROOT / "conf" / "accelerate"


def mlmkit(*args: str, cwd: Path):
    return run_cli(*args, cwd=cwd)


def test_no_name_lists_every_packaged_config_with_what_it_is_for(tmp_path):
    proc = mlmkit("accelerate-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split(None, 1) for line in proc.stdout.splitlines()]
    assert [name for name, _ in rows] == sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert all(len(what) > 10 for _, what in rows)
    assert dict(rows)["fsdp"].startswith("Fully sharded data parallel")


def test_a_name_prints_the_config_and_out_writes_it_for_accelerate_launch(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    shown = mlmkit("accelerate-config", "ddp_bf16", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout == (CONFIGS / "ddp_bf16.yaml").read_text()
    written = mlmkit("accelerate-config", "fsdp", "--out", "configs/fsdp.yaml", cwd=tmp_path)
    assert written.returncode == 0, written.stderr[-2000:]
    path = tmp_path / written.stdout.strip()  # the path alone, for --config_file "$(...)"
    assert path == tmp_path / "configs" / "fsdp.yaml"
    assert path.read_text() == (CONFIGS / "fsdp.yaml").read_text()
    config = load_config_from_file(str(path))  # as accelerate launch --config_file reads it
    assert str(config.distributed_type).endswith("FSDP")


def _groups(help_text: str) -> dict[str, list[str]]:
    section = help_text.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    return {m[1]: m[2].split(", ") for m in re.finditer(r"^([\w/]+): (.+)$", section, re.M)}


@pytest.mark.parametrize("command, groups", [
    ("train", {"data", "logger", "masking", "model", "optim", "recipe", "train"}),
    ("eval", {"data", "masking"}),
    ("finetune", {"task"}),
    ("eval-sts", {"task"}),
    ("glue", set()),  # its tasks are a list, not a group
    ("eval-retrieval", set()),
])
def test_help_lists_only_the_groups_the_command_can_override(tmp_path, command, groups):
    proc = mlmkit(command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = _groups(proc.stdout)
    assert set(listed) == groups, proc.stdout[:2000]
    if command == "train":  # an option of each listed group, all at once, is an override that composes
        overrides = [f"{group}={option}" for group, options in listed.items() for option in options[-1:]]
        composed = mlmkit(command, *overrides, "--cfg", "job", cwd=tmp_path)
        assert composed.returncode == 0, composed.stderr[-2000:]


def test_the_help_lists_the_groups_as_hydra_itself_does():
    """``cli.hydra_help.group_listing`` (one copy of the config repository) gives Hydra's own
    listing of the config groups and their options, Hydra's groups and the command's."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from mlmkit.cli.hydra_help import group_listing
    from mlmkit.config.compose import CONFIG_MODULE, register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        loader = GlobalHydra.instance().hydra.config_loader
        every = GlobalHydra.instance().hydra.format_config_groups(lambda g: True)  # Hydra's own
        assert group_listing(loader, lambda g: True) == every
        assert "hydra/launcher: " in every and "\nmodel: bert-base, " in every
        lines = every.splitlines()
        assert group_listing(loader, lambda g: g in {"data", "model"}) == "".join(
            line + "\n" for line in lines if line.startswith(("data:", "model:")))
        assert group_listing(loader, lambda g: g == "model", compact=False) == "".join(
            f"{group}:\n" + "".join(f"  {o}\n" for o in options.split(", "))
            for group, options in (line.split(": ", 1) for line in lines if line.startswith("model:")))
