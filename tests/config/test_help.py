"""``mlmkit <command> --help`` (``config.help``): the config groups the command composes, and
every setting with its default and its meaning from the schema's comments."""

from __future__ import annotations

import re

import pytest
from runs import run_cli


def _groups(help_text: str) -> dict[str, list[str]]:
    section = (
        help_text.split("Config groups", 1)[1].split("\nSettings", 1)[0]
        if "Config groups" in help_text
        else ""
    )
    section = re.sub(r"\n\s{6}", " ", section)  # a wrapped line
    return {m[1]: m[2].split(" | ") for m in re.finditer(r"^  ([\w.]+): (.+)$", section, re.M)}


def _settings(help_text: str) -> dict[str, str]:
    section = help_text.split("\nSettings", 1)[1]
    return {m[1]: m[2] for m in re.finditer(r"^  ([\w.]+)=(.*)$", section, re.M)}


@pytest.mark.parametrize(
    "command, groups",
    [
        ("train", {"data", "logger", "masking", "model", "optim", "recipe", "train", "probe.task"}),
        ("eval", {"data", "masking"}),
        ("finetune", {"task"}),
        ("eval-sts", {"task"}),
        ("glue", set()),  # its tasks are a list, not a group
        ("eval-retrieval", set()),
        ("scorecard", set()),
    ],
)
def test_help_lists_the_commands_groups_and_every_setting_with_its_meaning(command, groups):
    import dataclasses

    from mlmkit.cli import HYDRA_CONFIGS
    from mlmkit.config.help import command_schema

    proc = run_cli(command, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed, settings = _groups(proc.stdout), _settings(proc.stdout)
    assert set(listed) == groups, proc.stdout[:2000]
    assert all(len(line) <= 100 for line in proc.stdout.splitlines())
    for field in dataclasses.fields(
        command_schema(HYDRA_CONFIGS[command])
    ):  # each setting, or its parts
        assert field.name in settings or any(
            key.startswith(f"{field.name}.") for key in settings
        ), field.name
    if (
        command == "train"
    ):  # an option of each listed group, all at once, is an override that composes
        assert settings["model.hidden_size"] == "128" and settings["train.max_time"] == "null"
        assert "width of the residual stream" in proc.stdout
        overrides = [
            f"{group}={options[-1]}" for group, options in listed.items() if group != "probe.task"
        ]
        composed = run_cli(command, *overrides, "--cfg", "job")
        assert composed.returncode == 0, composed.stderr[-2000:]


def test_a_fields_comment_is_its_meaning_in_the_help():
    from mlmkit.config import ModelConfig, TrainConfig
    from mlmkit.config.help import field_notes

    model, train = field_notes(ModelConfig), field_notes(TrainConfig)
    assert model["hidden_size"] == "width of the residual stream"
    assert model["hidden_dropout_prob"].startswith("Dropout after attention/FFN")  # a comment above
    assert (
        model["attention_probs_dropout_prob"] == "see hidden_dropout_prob above"
    )  # one comment, two fields
    assert train["max_time"].startswith("training wall-clock time")
