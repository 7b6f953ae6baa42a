"""Checkpoints: accelerate state plus the loop's own state, written atomically.

A checkpoint is a folder ``checkpoints/step_0000500/`` holding what
``accelerator.save_state`` writes (model, optimizer, scheduler, RNG states) and
``loop_state.json``. It is written under a temporary name and renamed only when
complete, so a run killed while saving never leaves a latest checkpoint that cannot be
loaded. ``final/`` is the plain Hugging Face export.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from mlmkit.errors import CheckpointError

log = logging.getLogger(__name__)

LOOP_STATE = "loop_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


def is_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / LOOP_STATE).is_file()


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoints in ``ckpt_dir``, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = []
    for child in ckpt_dir.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and is_checkpoint(child):
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def resolve_resume(resume: str | None, ckpt_dir: Path) -> Path | None:
    """Return the checkpoint to resume from: None, the latest in ``ckpt_dir`` ("auto") or a path."""
    if resume is None or resume in ("", "none", "null", "false"):
        return None
    if resume == "auto":
        found = list_checkpoints(ckpt_dir)
        if found:
            return found[-1]
        log.info("train.resume=auto: no checkpoint in %s, starting from scratch", ckpt_dir)
        return None
    path = Path(resume).expanduser()
    if not is_checkpoint(path):
        raise CheckpointError(
            f"train.resume={resume!r} is not a checkpoint folder (it has no {LOOP_STATE}); "
            "use train.resume=auto or the path of a checkpoints/step_* folder."
        )
    return path


def save_checkpoint(
    accelerator, ckpt_dir: Path, step: int, loop_state: dict[str, Any], keep_last: int
) -> Path:
    """Save on every rank (sharded engines need it); rename and prune on the main process.

    A failed write (a full disk, say) removes the partial folder and raises one sentence;
    the checkpoints already there are left as they were.
    """
    final = ckpt_dir / checkpoint_name(step)
    tmp = ckpt_dir / f".tmp-{checkpoint_name(step)}"
    try:
        if accelerator.is_main_process:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp), safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            with open(tmp / LOOP_STATE, "w") as f:
                json.dump(loop_state, f)
                f.flush()
                os.fsync(f.fileno())
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            for old in list_checkpoints(ckpt_dir)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    except (OSError, RuntimeError, SafetensorError) as exc:  # torch.save fails with RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        kept = list_checkpoints(ckpt_dir)
        raise CheckpointError(
            f"Could not write the step-{step} checkpoint to {str(ckpt_dir)!r} ({_reason(exc)}); "
            f"free disk space or lower train.keep_last, then resume with train.resume=auto"
            + (f" (from {kept[-1].name}, which is intact)." if kept else ".")
        ) from None
    accelerator.wait_for_everyone()
    return final


def _reason(exc: BaseException) -> str:
    """Return an OS error's text ("No space left on device"), else the first line of the message."""
    text = getattr(exc, "strerror", None) or str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_checkpoint(accelerator, path: Path) -> dict[str, Any]:
    """Restore accelerate state and return the loop state."""
    try:
        with open(path / LOOP_STATE) as f:
            loop_state = json.load(f)
        check_loop_state(loop_state)
        # accelerate skips RNG states it cannot read with only a log line, which would
        # break exact resume silently; read them first (weights_only) so a bad file fails.
        rng_file = path / f"random_states_{accelerator.process_index}.pkl"
        if rng_file.exists():
            from accelerate.utils.other import load as safe_load

            safe_load(rng_file)
        saved_world = loop_state.get("world_size", accelerator.num_processes)
        if saved_world != accelerator.num_processes and _is_deepspeed(accelerator):
            with universal_checkpoint(accelerator, path, saved_world):
                accelerator.load_state(str(path))
        else:
            accelerator.load_state(str(path))
        if saved_world != accelerator.num_processes:
            if not rng_file.exists():
                log.info(
                    "The checkpoint was written by %d process(es): this process starts its "
                    "random numbers afresh.",
                    saved_world,
                )
        elif not rng_file.exists():
            log.warning(
                "The checkpoint %s has no %s, so the resumed run draws other random numbers "
                "than an uninterrupted run would (exact resume is lost); continuing.",
                path,
                rng_file.name,
            )
        return loop_state
    except Exception as exc:  # a truncated file fails in json, safetensors or torch.load
        raise CheckpointError(
            f"Could not load checkpoint {str(path)!r}: {load_failure(exc)}; "
            "point train.resume at another checkpoint or start a new run."
        ) from None


def _is_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


UNIVERSAL = "universal"  # a DeepSpeed checkpoint's universal form, beside its ZeRO state


@contextmanager
def universal_checkpoint(accelerator, path: Path, saved_world: int) -> Iterator[None]:
    """Load the DeepSpeed checkpoint ``path``, written by ``saved_world`` processes, on this
    run's number of processes: its ZeRO state, partitioned for the processes that wrote it, is
    converted once into DeepSpeed's universal checkpoint (``path/universal``, one file per
    parameter) and loaded from there, repartitioned."""
    root = path / UNIVERSAL
    if accelerator.is_main_process and not (root / "latest_universal").is_file():
        log.info(
            "The checkpoint was written by %d DeepSpeed process(es); converting its ZeRO state "
            "to DeepSpeed's universal form (%s) to load it on %d.",
            saved_world,
            root,
            accelerator.num_processes,
        )
        to_universal(path / "pytorch_model", root)
    accelerator.wait_for_everyone()
    engine = accelerator.deepspeed_engine_wrapped.engine
    load = engine.load_checkpoint

    def load_universal(load_dir, tag=None, **kwargs):  # accelerate names the ZeRO state's folder
        return load(str(root), tag, **kwargs)

    # ZeRO-3's universal load gives every parameter group the first group's settings: the
    # settings that tell the groups apart (biases and norms take no weight decay) are put back
    groups = engine.optimizer.param_groups
    own = {
        key: [g[key] for g in groups]
        for key in groups[0]
        if key != "params" and any(g.get(key) != groups[0][key] for g in groups)
    }
    engine._config.load_universal_checkpoint = True
    engine.load_checkpoint = load_universal
    try:
        yield
    finally:
        del engine.load_checkpoint
        engine._config.load_universal_checkpoint = False
        for key, values in own.items():
            for group, value in zip(engine.optimizer.param_groups, values):
                group[key] = value
        # and it gives every group one step counter, which each group's step would advance
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        for state in inner.state.values():
            if hasattr(state.get("step"), "clone"):
                state["step"] = state["step"].clone()


def to_universal(zero_dir: Path, root: Path) -> None:
    """Write DeepSpeed's universal form of the ZeRO state in ``zero_dir`` to
    ``root/<zero_dir's name>`` (with ``root/latest_universal``), whole or not at all."""
    import contextlib
    import io
    from argparse import Namespace

    from deepspeed.checkpoint import ds_to_universal

    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    args = Namespace(
        input_folder=str(zero_dir),
        output_folder=str(partial / zero_dir.name),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # the version key ZeRO-1/2 checkpoints lack
    )
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        ds_to_universal.main(args)
    os.replace(partial, root)


def check_loop_state(state: Any) -> None:
    """Raise a ValueError unless ``state`` has the fields a resume reads (a file emptied or
    rewritten by hand has not)."""
    if not isinstance(state, dict):
        raise ValueError(f"{LOOP_STATE} holds no JSON object")
    wrong = [
        key
        for key, kind in (("step", int), ("tokens_seen", int), ("stream", dict))
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool)
    ]
    if wrong:
        raise ValueError(f"{LOOP_STATE} lacks a valid {', '.join(wrong)}")


def load_failure(exc: BaseException) -> str:
    """Why a checkpoint could not be loaded, in a few words."""
    import pickle

    if isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" in str(exc):
        # torch's own message suggests weights_only=False, which would run the file's code
        return (
            "a pickled file in it holds objects other than tensors and plain data, which "
            "could run code when loaded, so it is refused"
        )
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")


def load_latest(accelerator, ckpt_dir: Path, first: Path) -> tuple[Path, dict[str, Any]]:
    """Load ``first``; if it is damaged, warn and fall back to the next older checkpoint."""
    candidates = [first] + [
        p for p in reversed(list_checkpoints(ckpt_dir)) if p != first and p.name < first.name
    ]
    for i, path in enumerate(candidates):
        try:
            return path, load_checkpoint(accelerator, path)
        except CheckpointError as exc:
            if i == len(candidates) - 1:
                raise
            log.warning("%s Trying the previous checkpoint.", exc)
    raise CheckpointError(f"No loadable checkpoint in {str(ckpt_dir)!r}.")
