"""What an installed mlmkit finds without a checkout: the packaged accelerate configs
(``mlmkit accelerate-config``)."""

from __future__ import annotations

from pathlib import Path

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
