"""The tests' fork server (tests/fork_server.py): its commands run in processes that have
loaded the libraries already, and its second server's children have never imported mlmkit."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
from runs import python_run

pytestmark = pytest.mark.skipif(
    os.environ.get("MLMKIT_TEST_FORK", "1") == "0" or not sys.platform.startswith("linux"),
    reason="no fork server (MLMKIT_TEST_FORK=0, or not Linux): every command is a fresh interpreter")

# what a command finds loaded at its start (of mlmkit and the libraries)
LOADED = ("import json, os, sys\n"
          "names = ('mlmkit', 'transformers', 'sentence_transformers')\n"
          "modules = sorted(m for m in sys.modules if m.split('.')[0] in names)\n"
          "print(json.dumps({'pid': os.getpid(), 'modules': modules}))\n")


def _loaded(plain: bool) -> dict:
    proc = python_run("-c", LOADED, plain=plain, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_plain_command_has_the_libraries_loaded_and_nothing_of_mlmkit():
    plain = {name.split(".")[0] for name in _loaded(True)["modules"]}
    assert "transformers" in plain and "mlmkit" not in plain
    if importlib.util.find_spec("sentence_transformers") is not None:  # the dev extra has it
        assert "sentence_transformers" in plain


def test_a_command_has_mlmkit_loaded_in_a_process_of_its_own():
    first, second = _loaded(False), _loaded(False)
    assert "mlmkit.cli" in first["modules"] and "transformers" in first["modules"]
    assert first["pid"] != second["pid"] != os.getpid()
