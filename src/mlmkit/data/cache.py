"""Entries of the cache under ``paths.cache_dir`` (trained tokenizers, packed datasets).

An entry is written into a temporary folder beside its place (``.<key>-*``), locked with
``flock`` while it is written, then renamed into place with a manifest of its files' sizes
(``write_entry``). A reader checks the sizes (``damage``), and a damaged entry is deleted
with a warning to be built again (``discard``). A temporary folder whose writer is gone (a
killed preparation: no process holds its lock) is removed by the next preparation
(``remove_orphans``); several ranks preparing at once never remove each other's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MANIFEST = "mlmkit-entry.json"
_TEMP_NAME = re.compile(
    r"^\.[0-9a-f]{16}-"
)  # .<key>-<random>, as write_entry and discard name them
ORPHAN_AGE_S = 60.0  # a folder younger than this may be one whose writer has not locked it yet


def write_entry(target: Path, fill: Callable[[Path], None], info: dict | None = None) -> bool:
    """``fill(folder)`` writes the entry; it is then renamed to ``target``, its manifest
    holding ``info`` (``read_info``). Return False where another process put ``target`` in
    place first (its entry stays); on an error the folder is removed and the error raised."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    fd = os.open(tmp, os.O_RDONLY)
    try:
        _try_lock(fd)  # a new folder: nobody else holds it
        fill(tmp)
        sizes = {
            p.relative_to(tmp).as_posix(): p.stat().st_size
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        (tmp / MANIFEST).write_text(json.dumps({"sizes": sizes, "info": info or {}}))
        try:
            os.replace(tmp, target)  # atomic: a reader sees the whole entry or none
        except OSError:
            if not target.is_dir():
                raise
            return False  # a concurrent writer was first
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def damage(target: Path) -> str | None:
    """Return what is wrong with the entry's files (one missing, or of another size than written),
    or None. Entries written without a manifest are checked only by loading them."""
    try:
        sizes = json.loads((target / MANIFEST).read_text())["sizes"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    for name, size in sizes.items():
        path = target / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes of {size}"
    return None


def read_info(target: Path) -> dict:
    """Return the ``info`` the entry was written with ({} for an entry without a manifest)."""
    try:
        return json.loads((target / MANIFEST).read_text()).get("info") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def discard(target: Path, what: str, reason: str) -> None:
    """Warn that the entry is damaged and delete it (moved aside first, so no reader sees
    it half deleted)."""
    log.warning(
        "The cached %s %s is damaged (%s); deleting it and building it again.", what, target, reason
    )
    aside = target.with_name(f".{target.name}-damaged-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(target, aside)
    except FileNotFoundError:
        return  # another process discarded it first
    shutil.rmtree(aside, ignore_errors=True)


def remove_orphans(folder: Path, min_age_s: float = ORPHAN_AGE_S) -> None:
    """Remove the temporary folders in ``folder`` whose writer is gone: no process holds
    their lock, and they are older than ``min_age_s``."""
    if not folder.is_dir():
        return
    now = time.time()
    for child in folder.iterdir():
        if not _TEMP_NAME.match(child.name):
            continue
        try:
            if not child.is_dir() or now - child.stat().st_mtime < min_age_s:
                continue
            fd = os.open(child, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile
        if not _try_lock(fd):
            os.close(fd)
            continue  # being written (or a filesystem without locks: kept)
        try:
            shutil.rmtree(child, ignore_errors=True)
            log.info("Removed %s, left by a preparation that was stopped", child)
        finally:
            os.close(fd)


def reason(exc: BaseException) -> str:
    """Return an OS error's text ("No space left on device"), else the first line of the message."""
    text = getattr(exc, "strerror", None) or str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another process, or locks unsupported
        return False
    return True
