"""``mlmkit <command> --help`` lists the config groups that command can override.

Hydra's help lists every folder of the config dir as a group, so each command would offer
the groups of the others (``train`` would offer ``task``, and ``accelerate``, which holds
accelerate's configs, not Hydra's). A group can be overridden (``group=option``) only where
the command's config composes it: the groups of its defaults list, which Hydra records in
``hydra.runtime.choices``. While a command shows its help, the list keeps only those.

The list is made from one view of the config dirs: Hydra's own listing copies its whole
repository of configs (the schemas included) for each group it looks at, some ninety times,
which made ``mlmkit train --help`` take 2 s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HELP_FLAGS = ("--help", "-h")


def overridable(group: str, choices) -> bool:
    """Whether ``group=option`` is an override of the config whose defaults chose ``choices``
    (Hydra's own groups, ``hydra/...``, are listed by ``--hydra-help`` as they are)."""
    return group == "hydra" or group.startswith("hydra/") or group in choices


def group_listing(loader, predicate: Callable[[str], bool], compact: bool = True) -> str:
    """What Hydra's ``format_config_groups`` gives (each config group the predicate keeps, with
    its options), read from one copy of the loader's repository instead of one per group."""
    from hydra.core.object_type import ObjectType

    _, repo = loader._parse_overrides_and_create_caching_repo(None, [])

    def groups_under(parent: str) -> list[str]:
        found = []
        for group in repo.get_group_options(parent, ObjectType.GROUP):
            name = f"{parent}/{group}" if parent else group
            if repo.get_group_options(name, ObjectType.CONFIG):
                found.append(name)
            if repo.get_group_options(name, ObjectType.GROUP):
                found.extend(groups_under(name))
        return found

    text = ""
    for group in sorted(g for g in groups_under("") if predicate(g)):
        options = sorted(repo.get_group_options(group, ObjectType.CONFIG))
        text += (f"{group}: {', '.join(options)}" if compact
                 else f"{group}:\n" + "\n".join("  " + o for o in options)) + "\n"
    return text


@contextmanager
def hydra_method_replaced(name: str, make: Callable[[Callable], Callable] | None) -> Iterator[None]:
    """Within: Hydra's ``Hydra.<name>`` is ``make(original)``; as it was where ``make`` is None,
    or where this Hydra has no such method (another version's internals)."""
    try:
        from hydra._internal.hydra import Hydra
    except ImportError:
        Hydra = None
    original = getattr(Hydra, name, None)
    if make is None or original is None:
        yield
        return
    setattr(Hydra, name, make(original))
    try:
        yield
    finally:
        setattr(Hydra, name, original)


def composed_groups_only(argv: list[str] | None = None):
    """Within: Hydra's ``--help`` lists only the groups the command's config composes."""
    argv = sys.argv[1:] if argv is None else argv
    return hydra_method_replaced("format_config_groups",
                                 _groups_of_the_command if any(arg in HELP_FLAGS for arg in argv) else None)


def _groups_of_the_command(original: Callable) -> Callable:
    def format_config_groups(self, predicate: Callable[[str], bool], compact: bool = True) -> str:
        from hydra.core.hydra_config import HydraConfig

        try:
            choices = HydraConfig.get().runtime.choices  # set while the help is printed
        except ValueError:
            return original(self, predicate, compact)

        def keep(group: str) -> bool:
            return predicate(group) and overridable(group, choices)

        try:
            return group_listing(self.config_loader, keep, compact)
        except AttributeError:  # another Hydra's internals: its own listing
            return original(self, keep, compact)

    return format_config_groups
