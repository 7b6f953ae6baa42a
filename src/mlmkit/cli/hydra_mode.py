"""A Hydra command composes its config once, not twice.

Before it runs a command, Hydra 1.3 composes the whole config once only to read
``hydra.mode`` (whether the command line is one run or a sweep), then composes it again for
the run: a third of a second each on a CPU of 2026, so every ``mlmkit train``, ``evaluate``
or ``finetune`` paid for a composition it threw away. mlmkit's configs never set
``hydra.mode``, so that first composition always finds it unset, and Hydra then takes the
mode from the command line (``--multirun``/``-m`` or not). Within ``compose_once``, Hydra
skips it and goes straight to that rule, unless the command line can set the mode another way:
``hydra.mode=...`` itself, or configs of one's own (``--config-dir``, ``--config-path``,
``--config-name``, ``hydra.searchpath``), which are composed as Hydra composes them.
"""

from __future__ import annotations

import sys

# command-line flags and settings through which a config other than mlmkit's own can set the mode
OWN_CONFIGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
MODE_SETTINGS = ("hydra.mode", "hydra.searchpath")


def mode_may_come_from_config(argv: list[str]) -> bool:
    """Whether ``argv`` can set ``hydra.mode`` other than by ``--multirun``."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        # Hydra's argparse takes a long flag's unique abbreviation too (--config-d is --config-dir)
        if flag in OWN_CONFIGS or flag.startswith("--config") or flag.lstrip("+~").startswith(MODE_SETTINGS):
            return True
    return False


def compose_once(argv: list[str] | None = None):
    """Within: Hydra takes the run mode from the command line without composing the config
    for it (see the module's docstring); elsewhere, as Hydra does."""
    from mlmkit.cli.hydra_help import hydra_method_replaced

    argv = sys.argv[1:] if argv is None else argv
    return hydra_method_replaced("get_mode", None if mode_may_come_from_config(argv) else _mode_from_command_line)


def _mode_from_command_line(original):
    def get_mode(self, config_name, overrides):
        return None  # what Hydra's own lookup gives for mlmkit's configs: the command line decides

    return get_mode
