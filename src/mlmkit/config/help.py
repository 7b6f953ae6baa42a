"""Write ``mlmkit <command> --help``: the command's config groups with their options, then each
setting with its default and meaning, read from the schema's field comments."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from importlib.resources import files
from typing import Any

from mlmkit.config.compose import CONFIG_MODULE, SCHEMAS

WIDTH = 100


def field_notes(cls: type) -> dict[str, str]:
    """Map each field of a schema dataclass to its comment: the comment lines just above the
    field and the comment at its end, joined."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    notes, block = {}, None  # block: the field whose comment above also covers the fields after it
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            block = None
            continue
        above, row = [], node.lineno - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments[row])
            row -= 1
        trailing = [comments[r] for r in range(node.lineno, node.end_lineno + 1) if r in comments]
        name = node.target.id
        notes[name] = " ".join(above + trailing)
        if not notes[name] and block is not None and not lines[node.lineno - 2].strip() == "":
            notes[name] = f"see {block} above"
        block = name if above else (block if not lines[node.lineno - 2].strip() == "" else None)
    return notes


def _schema_of(hint: Any) -> type | None:
    """Return the dataclass a field's type names (``X``, ``X | None``), else None."""
    candidates = [hint, *typing.get_args(hint)]
    return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


def setting_rows(
    schema: type, values: dict[str, Any], prefix: str = ""
) -> list[tuple[str, Any, str]]:
    """``(key, default, meaning)`` of every setting of ``schema``, nested configs flattened
    (``model.hidden_size``), with the defaults of the composed ``values``."""
    hints, notes, rows = typing.get_type_hints(schema), field_notes(schema), []
    for f in dataclasses.fields(schema):
        value, nested = values.get(f.name, f.default), _schema_of(hints[f.name])
        if nested is not None and isinstance(value, dict):
            rows += setting_rows(nested, value, f"{prefix}{f.name}.")
        else:
            rows.append((f"{prefix}{f.name}", value, notes.get(f.name, "")))
    return rows


def config_groups(config_name: str) -> list[tuple[str, str, list[str]]]:
    """``(group, default option, options)`` of each config group a command's config composes
    (its defaults list, read from its YAML file)."""
    import yaml

    root = files(CONFIG_MODULE)
    defaults = yaml.safe_load(root.joinpath(f"{config_name}.yaml").read_text()).get("defaults", [])
    groups = []
    for entry in defaults:
        if not isinstance(entry, dict):
            continue
        ((key, default),) = entry.items()
        if key.startswith("override "):
            continue
        group, _, target = key.partition("@")
        folder = root.joinpath(group)
        options = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
        groups.append((target or group, "null" if default is None else str(default), options))
    return groups


def composed_defaults(config_name: str) -> dict[str, Any]:
    """Return the command's settings as its config composes them with no overrides (unresolved)."""
    from omegaconf import OmegaConf

    from mlmkit.config.compose import compose_command

    return OmegaConf.to_container(compose_command(config_name), resolve=False)


def shown(value: Any) -> str:
    """Show a value as it is written on the command line (null, true, [a,b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def command_schema(config_name: str) -> type:
    """Return the schema dataclass a command's config extends (the first entry of its defaults)."""
    import yaml

    defaults = yaml.safe_load(files(CONFIG_MODULE).joinpath(f"{config_name}.yaml").read_text())[
        "defaults"
    ]
    return SCHEMAS[next(d for d in defaults if isinstance(d, str) and d in SCHEMAS)]


def command_help(command: str, config_name: str, what: str) -> str:
    """Write the help of ``mlmkit <command>``."""
    schema = command_schema(config_name)
    out = [
        f"usage: mlmkit {command} [key=value ...] [group=option ...]",
        "",
        f"{what[0].upper()}{what[1:]}.",
    ]
    groups = config_groups(config_name)
    if groups:
        out += ["", "Config groups (group=option; the default first):"]
        for group, default, options in groups:
            rest = [o for o in options if o != default]
            out += textwrap.wrap(
                f"{group}: {default}" + (f" | {' | '.join(rest)}" if rest else ""),
                WIDTH,
                initial_indent="  ",
                subsequent_indent="      ",
            )
    out += ["", "Settings (key=value; the default after '='):"]
    for key, value, note in setting_rows(schema, composed_defaults(config_name)):
        out += textwrap.wrap(
            f"{key}={shown(value)}", WIDTH, initial_indent="  ", subsequent_indent="      "
        )
        if note:
            out += textwrap.wrap(note, WIDTH, initial_indent="      ", subsequent_indent="      ")
    out += [""] + textwrap.wrap(
        f"A list is written key=[a,b], quoted for the shell. Hydra's own options: "
        f"mlmkit {command} --hydra-help; the composed config: mlmkit {command} "
        "--cfg job.",
        WIDTH,
    )
    return "\n".join(out)
