"""The README and docs/ say what the code does: every setting, module, command, make target
and example they name exists, and the design's layout lists every module."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
from pathlib import Path

import pytest

from mlmkit.cli import COMMANDS
from mlmkit.config import Config, FinetuneConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTING = re.compile(
    r"(?<![\w./-])((?:train|data|model|optim|masking|tokenizer|paths|logger|task)\.[a-z_][a-z_0-9.]*)"
)
MODULE = re.compile(r"(?<![\w/.-])(?:src/)?(mlmkit(?:[./][a-z_0-9]+)+)")


def _code(text: str) -> list[str]:
    """The inline code and code blocks of a Markdown text."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return blocks + inline


def _is_setting(schema: type, parts: list[str]) -> bool:
    for part in parts:
        if not dataclasses.is_dataclass(schema):
            return False
        names = {f.name for f in dataclasses.fields(schema)}
        if part not in names:
            return False
        hint = typing.get_type_hints(schema)[part]
        if not dataclasses.is_dataclass(hint):
            return True  # a leaf (a list or a dict may be indexed further)
        schema = hint
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_setting_named_is_in_the_schema(doc):
    unknown = set()
    for code in _code(doc.read_text()):
        for setting in SETTING.findall(code):
            setting = setting.rstrip(".")
            if setting.endswith(
                (".py", ".yaml", ".json", ".txt", ".tsv", ".csv", ".jsonl", ".log", ".safetensors")
            ):
                continue  # a file (train.py, model.safetensors)
            parts = setting.split(".")
            schema = FinetuneConfig if parts[0] == "task" else Config
            if not _is_setting(schema, parts):
                unknown.add(setting)
    assert not unknown, f"{doc.name} names settings the schema lacks: {sorted(unknown)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_named_exists(doc):
    missing = set()
    for code in _code(doc.read_text()):
        for name in MODULE.findall(code):
            name = name.removesuffix(".py").replace("/", ".").rstrip(".")
            if name.endswith((".yaml", ".json")) or name == "mlmkit.conf":
                continue
            if not _exists(name):
                missing.add(name)
    assert not missing, f"{doc.name} names modules that do not exist: {sorted(missing)}"


def _exists(name: str) -> bool:
    """A module, or an attribute of one (``mlmkit.cli.errors.report_errors``)."""
    try:
        if importlib.util.find_spec(name) is not None:
            return True
    except ModuleNotFoundError:
        pass
    head, _, attr = name.rpartition(".")
    try:
        return hasattr(importlib.import_module(head), attr)
    except ModuleNotFoundError:
        return False


def test_every_command_and_make_target_in_the_readme_exists():
    readme = (ROOT / "README.md").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    code = "\n".join(
        line
        for line in "\n".join(_code(readme)).splitlines()
        if not line.lstrip().startswith(("from ", "import "))
    )
    commands = set(re.findall(r"(?<![\w-])mlmkit ([a-z][\w-]*)", code)) - {"train.py"}
    makes = set(re.findall(r"(?<![\w-])make ([a-z][\w-]*)", code))
    assert commands and commands <= set(COMMANDS), sorted(commands - set(COMMANDS))
    assert makes and makes <= targets, sorted(makes - targets)


def test_the_design_layout_lists_every_module():
    design = (ROOT / "docs" / "design.md").read_text()
    layout = design[design.index("src/mlmkit/\n") :]
    layout = layout[: layout.index("```")]
    package = ROOT / "src" / "mlmkit"
    for sub in sorted(
        p for p in package.iterdir() if (p / "__init__.py").is_file() and p.name != "conf"
    ):
        line = re.search(rf"^  {sub.name}/(.*?)(?=^  \S|\Z)", layout, flags=re.M | re.S)
        assert line, f"docs/design.md's layout lacks {sub.name}/"
        named = set(re.findall(r"([a-z_]+)\.py", line.group(1)))
        modules = {p.stem for p in sub.glob("*.py") if p.stem != "__init__"}
        if sub.name == "cli":  # "one module per subcommand": the others are named
            commands = {module.rsplit(".", 1)[1] for module, _, _ in COMMANDS.values()}
            modules, named = modules - commands, named - commands
        assert modules <= named | {"__main__"}, (
            f"{sub.name}/: not in the layout: {sorted(modules - named)}"
        )
        assert named <= modules, (
            f"{sub.name}/: the layout names modules that are gone: {sorted(named - modules)}"
        )


def test_the_reference_names_every_command_group_and_preset():
    reference = (ROOT / "docs" / "reference.md").read_text()
    table = reference[reference.index("## Commands") : reference.index("## Install")]
    listed = set(re.findall(r"^\| `([a-z][\w-]*)` \|", table, flags=re.M))
    assert listed == set(COMMANDS), sorted(set(COMMANDS) ^ listed)
    for group in sorted(
        p for p in (ROOT / "conf").iterdir() if p.is_dir() and not p.name.startswith("_")
    ):
        assert f"**`{group.name}/`**" in reference, group.name
        for preset in sorted(group.glob("*.yaml")):
            assert f"`{preset.stem}`" in reference, f"{group.name}/{preset.name}"


@pytest.mark.parametrize("doc", ["README.md", "docs/reference.md"])
def test_no_table_cell_runs_past_200_characters(doc):
    rows = [line for line in (ROOT / doc).read_text().splitlines() if line.startswith("|")]
    long = [
        cell.strip()[:60]
        for row in rows
        for cell in row.strip("|").split(" | ")
        if len(cell.strip()) > 200
    ]
    assert rows and not long, long
