"""The accelerate configs that ship inside the package (conf/accelerate/, ``mlmkit.conf``).

    mlmkit accelerate-config                       # the names, each with what it is for
    mlmkit accelerate-config ddp_bf16              # the YAML on stdout
    mlmkit accelerate-config fsdp --out fsdp.yaml  # written to a file, its path on stdout
    accelerate launch --config_file "$(mlmkit accelerate-config ddp_bf16 --out ddp.yaml)" \\
        -m mlmkit train model=bert-base

An installed mlmkit has no conf/ folder to point ``--config_file`` at; this command gives
the same files from any folder.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mlmkit.cli.errors import ArgumentParser
from mlmkit.errors import ConfigError

PROG = "mlmkit accelerate-config"


def _folder():
    return resources.files("mlmkit.conf").joinpath("accelerate")


def config_names() -> list[str]:
    """Return the names of the packaged accelerate configs, sorted."""
    return sorted(p.name[: -len(".yaml")] for p in _folder().iterdir() if p.name.endswith(".yaml"))


def config_text(name: str) -> str:
    """Return the YAML text of the packaged config ``name`` (``ddp_bf16`` or ``ddp_bf16.yaml``)."""
    name = name.removesuffix(".yaml")
    names = config_names()
    if name not in names:
        raise ConfigError(
            f"{PROG}: {name!r} is not a packaged accelerate config; choose one of "
            f"{', '.join(names)}."
        )
    return _folder().joinpath(f"{name}.yaml").read_text()


def summary(text: str) -> str:
    """Say what a config is for: the first sentence of its leading comment."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    words = " ".join(lines)
    end = [i for i in (words.find(". "), words.find(":  "), words.find(": ")) if i >= 0]
    return (words[: min(end)] if end else words).rstrip(".:")


def write_config(name: str, out: str | Path) -> Path:
    """Write the packaged config ``name`` to ``out`` (its folder is created); returns the path."""
    text, out = config_text(name), Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise ConfigError(
            f"{PROG}: cannot write {str(out)!r} ({exc.strerror}); set --out to a writable file."
        ) from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[-1].strip())
    parser.add_argument("name", nargs="?", help="a packaged config; none: list them")
    parser.add_argument("--out", help="write the config to this file and print its path")
    args = parser.parse_args(argv)
    if args.name is None:
        if args.out:
            raise ConfigError(f"{PROG}: --out needs a config name; run {PROG} to list them.")
        names = config_names()
        width = max(map(len, names))
        for name in names:
            print(f"{name:<{width}}  {summary(config_text(name))}")
        return 0
    if args.out:
        print(write_config(args.name, args.out))
    else:
        print(config_text(args.name), end="")
    return 0
