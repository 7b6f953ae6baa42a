"""Several processes (gloo on CPU): the same optimisation as one process, resume, and the
FSDP and DeepSpeed engines (sharded checkpoints, export of the full model)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runs import (
    ACCELERATE,
    ROOT,
    TINY,
    events,
    free_port,
    launch_engine,
    processes,
    run_launch,
    run_train,
    write_probe_task,
)

COMMON = [
    "train.max_steps=10",
    "train.save_every=5",
    "train.eval_every=10",
    "train.log_every=1",
    "train.precision=no",
    "logger=none",
]


def launch_two(
    python: str,
    run_dir: Path,
    cache_dir: Path,
    *overrides: str,
    as_module: bool = False,
    n: int = 2,
) -> subprocess.CompletedProcess:
    """Two CPU processes (``n``): ``accelerate launch train.py ...``, or with ``as_module``
    ``accelerate launch -m mlmkit train ...`` (the installed package's way); ``python`` runs
    the ``accelerate`` script (the zygote's client, conftest.py's ``zygote_python``)."""
    launcher = [python, str(Path(sys.executable).with_name("accelerate")), "launch"]
    script = ["-m", "mlmkit", "train"] if as_module else [str(ROOT / "train.py")]
    cmd = [
        *launcher,
        "--main_process_port",
        free_port(),
        *processes(n),
        *script,
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    return run_launch(cmd, timeout=900)


# Five evaluation batches over two ranks: the rank with fewer must still take part in every
# forward, which under FSDP and ZeRO-3 gathers the weights from all ranks. A global batch of 24:
# 2 processes x 12 here, 1 x 24 and 3 x 8 for the resumes on another number of processes.
ENGINE_ARGS = [*COMMON, "train.batch_size=12", "data.max_eval_samples=60", "train.eval_every=5"]
GLOBAL = 24


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory, cache_dir, zygote_python) -> Path:
    """``accelerate launch -m mlmkit train`` (the installed package's way) with two CPU
    processes and ENGINE_ARGS, its run dir named by the launch time: the DDP run that the
    one-process, resume, FSDP and DeepSpeed runs are compared with."""
    out = tmp_path_factory.mktemp("ddp") / "outputs"
    run_dir = Path(f"{out}/${{launch_time:%H-%M-%S}}")
    launch_two(zygote_python, run_dir, cache_dir, *ENGINE_ARGS, as_module=True)
    runs = list(out.iterdir())
    assert len(runs) == 1, runs  # both ranks resolved the same launch time
    return runs[0]


@pytest.mark.slow
def test_two_processes_share_one_run_dir(ddp_reference):
    """Both ranks write into one run dir, and its events once, not per rank."""
    assert "2 process(es)" in (ddp_reference / "train.log").read_text()
    assert [e["step"] for e in events(ddp_reference, "train")] == list(range(1, 11))
    assert [e["step"] for e in events(ddp_reference, "eval")] == [5, 10]
    assert (ddp_reference / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_processes_follow_one_process_with_the_same_global_batch(
    tmp_path, cache_dir, ddp_reference, zygote_python
):
    """2 processes x batch 12 = 1 process x batch 24: same rows, masks and normalisation."""
    one, two = tmp_path / "one", ddp_reference
    run_train(one, cache_dir, *ENGINE_ARGS, f"train.batch_size={GLOBAL}")
    a, b = events(one, "train"), events(two, "train")
    assert [e["step"] for e in a] == [e["step"] for e in b] == list(range(1, 11))
    for x, y in zip(a, b):
        assert (
            x["tokens_seen"] == y["tokens_seen"]
            and x["global_batch_size"] == y["global_batch_size"] == GLOBAL
        )
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4), (x["step"], x["loss"], y["loss"])
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-3)
    ea, eb = events(one, "eval")[-1], events(two, "eval")[-1]
    assert ea["eval_loss"] == pytest.approx(eb["eval_loss"], rel=1e-4)

    # The 2-process run resumes from its step-5 checkpoint to the same end (train.py this time).
    resumed = tmp_path / "resumed"
    resume_from_step_5(two, resumed)
    launch_two(zygote_python, resumed, cache_dir, *ENGINE_ARGS, "train.resume=auto")
    assert "Resumed from" in (resumed / "train.log").read_text()
    c = events(resumed, "train")
    assert [e["step"] for e in c] == list(range(1, 11))
    for x, y in zip(b, c):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-6)
    assert events(resumed, "eval")[-1]["eval_loss"] == pytest.approx(eb["eval_loss"], rel=1e-6)


RTD_ARGS = [*COMMON, "objective=rtd", "train.max_steps=6", "data.max_eval_samples=40"]
RTD_FIGURES = ("loss", "mlm_loss", "rtd_loss", "rtd_accuracy", "replaced_share")
RTD_PARTS = ("final", "final/generator")  # the exported discriminator and generator


@pytest.fixture(scope="module")
def rtd_ddp(tmp_path_factory, cache_dir, zygote_python) -> Path:
    """objective=rtd on two DDP processes of batch 8: the run the one-process and the FSDP and
    DeepSpeed runs are compared with."""
    run = tmp_path_factory.mktemp("rtd") / "ddp"
    launch_two(zygote_python, run, cache_dir, *RTD_ARGS, "train.batch_size=8")
    return run


def assert_same_rtd_figures(a: Path, b: Path) -> None:
    x, y = events(a, "train"), events(b, "train")
    assert [e["step"] for e in x] == [e["step"] for e in y] == list(range(1, 7))
    for p, q in zip(x, y):
        for key in RTD_FIGURES:
            assert p[key] == pytest.approx(q[key], rel=1e-4), (p["step"], key)
    for key in ("eval_loss", "eval_rtd_loss"):
        assert events(a, "eval")[-1][key] == pytest.approx(events(b, "eval")[-1][key], rel=1e-4)


@pytest.mark.slow
def test_rtd_two_processes_follow_one_process_with_the_same_global_batch(
    tmp_path, cache_dir, rtd_ddp
):
    """objective=rtd: 2 processes x batch 8 = 1 process x batch 16, the generator's samples
    included (each row's draws come from its own mask seed)."""
    one = tmp_path / "one"
    run_train(one, cache_dir, *RTD_ARGS, "train.batch_size=16")
    assert_same_rtd_figures(one, rtd_ddp)


@pytest.mark.slow
def test_rtd_under_fsdp_and_zero3_follows_ddp_and_exports_both_models(
    tmp_path, cache_dir, rtd_ddp, zygote_python
):
    """objective=rtd under FSDP2 and DeepSpeed ZeRO-3, which shard or partition the generator
    with the discriminator: the same figures as DDP, and final/ (the discriminator) and
    final/generator/ the same plain models as DDP's, their embeddings one tensor."""
    from safetensors.torch import load_file

    engines = ["fsdp"]
    if importlib.util.find_spec("deepspeed") is not None:  # the dev extra installs it
        engines.append("deepspeed_zero3")
    ddp = {part: load_file(rtd_ddp / part / "model.safetensors") for part in RTD_PARTS}
    for engine in engines:
        run = tmp_path / engine
        launch_engine(engine, run, cache_dir, *RTD_ARGS, "train.batch_size=8", python=zygote_python)
        assert_same_rtd_figures(run, rtd_ddp)
        final = {part: load_file(run / part / "model.safetensors") for part in RTD_PARTS}
        for part, weights in final.items():
            assert set(weights) == set(ddp[part]), (engine, part)
            for name, tensor in weights.items():
                assert tensor.allclose(ddp[part][name], rtol=1e-4, atol=1e-5), (engine, name)
        discriminator, generator = final["final"], final["final/generator"]
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            key = f"embeddings.{name}.weight"
            assert generator[f"electra.{key}"].equal(discriminator[f"bert.{key}"]), (engine, key)


def assert_same_losses(a: Path, b: Path, rel: float) -> None:
    x, y = events(a, "train"), events(b, "train")
    assert [e["step"] for e in x] == [e["step"] for e in y] == list(range(1, 11))
    for p, q in zip(x, y):
        assert p["loss"] == pytest.approx(q["loss"], rel=rel), (p["step"], p["loss"], q["loss"])
    assert events(a, "eval")[-1]["eval_loss"] == pytest.approx(
        events(b, "eval")[-1]["eval_loss"], rel=rel
    )


def assert_resumed_on_another_split(run: Path, resumed: Path, written: str) -> None:
    """``resumed``, the continuation of ``run``'s step-5 checkpoint on another number of
    processes with the same global batch, read on at the epoch's next sample (the same rows,
    the same masks): the same losses and weights as ``run``."""
    import torch
    from safetensors.torch import load_file

    text = (resumed / "train.log").read_text()
    assert f"{written}: the epoch goes on at its sample {5 * GLOBAL}" in text
    assert_same_losses(run, resumed, rel=1e-4)
    a, b = (load_file(r / "final" / "model.safetensors") for r in (run, resumed))
    for name, tensor in a.items():
        assert torch.allclose(tensor, b[name], rtol=1e-4, atol=1e-5), name


def resume_from_step_5(run: Path, resumed: Path) -> None:
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_0000010")
    shutil.rmtree(resumed / "final")


@pytest.mark.slow
def test_fsdp_shards_checkpoints_resumes_and_exports_the_full_model(
    tmp_path, cache_dir, ddp_reference, zygote_python
):
    """FSDP2 (full shard per BertLayer, sharded state dicts): the same losses as DDP, each rank
    writes its shard, a resumed run continues exactly (on 2 processes, and on 3 and 1 with the
    same global batch), and final/ holds the gathered weights."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ddp, fsdp = ddp_reference, tmp_path / "fsdp"
    # probed too (through the sharded objective's forward), which leaves the training as it was
    task = write_probe_task(tmp_path / "task")
    launch_engine(
        "fsdp", fsdp, cache_dir, *ENGINE_ARGS, "probe.every=5", f"probe.task.data_dir={task}",
        python=zygote_python,
    )  # fmt: skip
    assert_same_losses(ddp, fsdp, rel=1e-4)
    assert [e["step"] for e in events(fsdp, "probe")] == [0, 5, 10]

    # Each rank wrote its own shard of the weights and of the optimizer state.
    ckpt = fsdp / "checkpoints" / "step_0000010"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (ckpt / part).glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]
    # final/ is one plain model, the files a DDP run writes: the full tensors the shards hold.
    dcp_to_torch_save(ckpt / "pytorch_model_fsdp_0", tmp_path / "gathered.pt")
    shards = torch.load(tmp_path / "gathered.pt")["model"]
    gathered = {k.removeprefix("model."): v for k, v in shards.items()}
    final, ddp_final = (
        load_file(fsdp / "final" / "model.safetensors"),
        load_file(ddp / "final" / "model.safetensors"),
    )
    assert set(final) == set(ddp_final) and set(final) <= set(gathered)
    for name, tensor in final.items():
        assert torch.equal(tensor, gathered[name]), name
        assert torch.allclose(tensor, ddp_final[name], rtol=1e-4, atol=1e-5), name

    # Resumed from the sharded step-5 checkpoint, the run ends where it ended.
    resumed = tmp_path / "resumed"
    resume_from_step_5(fsdp, resumed)
    launch_engine(
        "fsdp", resumed, cache_dir, *ENGINE_ARGS, "train.resume=auto", python=zygote_python
    )
    assert "Resumed from" in (resumed / "train.log").read_text()
    assert_same_losses(fsdp, resumed, rel=1e-6)
    resumed_final = load_file(resumed / "final" / "model.safetensors")
    for name, tensor in final.items():
        assert torch.allclose(tensor, resumed_final[name], rtol=1e-5, atol=1e-6), name

    # Resumed on 3 processes and on 1 (the same global batch): the sharded state is resharded
    # (torch's distributed checkpoint), the epoch goes on at its next sample, the run as before.
    for n in (3, 1):
        other = tmp_path / f"on_{n}"
        resume_from_step_5(fsdp, other)
        launch_engine(
            "fsdp", other, cache_dir, *ENGINE_ARGS, f"train.batch_size={GLOBAL // n}",
            "train.resume=auto", python=zygote_python, n=n,
        )  # fmt: skip
        assert_resumed_on_another_split(fsdp, other, "written with 2 x 12")


@pytest.mark.slow
def test_deepspeed_zero2_and_zero3_follow_ddp_resume_and_export_the_full_model(
    tmp_path, cache_dir, ddp_reference, zygote_python
):
    """DeepSpeed ZeRO-2 and ZeRO-3 (DeepSpeed's CPU accelerator): the same losses as DDP, each
    rank writes its partition, ZeRO-3 resumes exactly, each resumes on 1 and on 3 processes
    (through DeepSpeed's universal checkpoint) as the run went on, and final/ is the plain
    model."""
    pytest.importorskip(
        "deepspeed", reason="the dev extra installs deepspeed (pip install -e '.[dev]')"
    )
    import torch
    from safetensors.torch import load_file

    ddp = ddp_reference
    ddp_final = load_file(ddp / "final" / "model.safetensors")
    for stage in (2, 3):
        run = tmp_path / f"zero{stage}"
        launch_engine(f"deepspeed_zero{stage}", run, cache_dir, *ENGINE_ARGS, python=zygote_python)
        assert_same_losses(ddp, run, rel=1e-4)
        files = sorted(
            p.name for p in (run / "checkpoints" / "step_0000010" / "pytorch_model").iterdir()
        )
        for rank in (0, 1):
            assert f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" in files
            if stage == 3:  # the weights are partitioned too
                assert f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" in files
        final = load_file(run / "final" / "model.safetensors")
        assert set(final) == set(ddp_final)
        for name, tensor in final.items():
            assert torch.allclose(tensor, ddp_final[name], rtol=1e-4, atol=1e-5), (stage, name)

    resumed = tmp_path / "resumed"
    resume_from_step_5(tmp_path / "zero3", resumed)
    launch_engine(
        "deepspeed_zero3", resumed, cache_dir, *ENGINE_ARGS, "train.resume=auto",
        python=zygote_python,
    )  # fmt: skip
    assert "Resumed from" in (resumed / "train.log").read_text()
    assert_same_losses(tmp_path / "zero3", resumed, rel=1e-6)
    first, again = (
        load_file(tmp_path / "zero3" / "final" / "model.safetensors"),
        load_file(resumed / "final" / "model.safetensors"),
    )
    for name, tensor in first.items():
        assert torch.allclose(tensor, again[name], rtol=1e-5, atol=1e-6), name

    # On another number of processes (the same global batch), each stage's partitioned state
    # goes through DeepSpeed's universal checkpoint and the run goes on as before.
    for stage, n in ((2, 1), (2, 3), (3, 3), (3, 1)):
        run, other = tmp_path / f"zero{stage}", tmp_path / f"zero{stage}_on_{n}"
        resume_from_step_5(run, other)
        launch_engine(
            f"deepspeed_zero{stage}", other, cache_dir, *ENGINE_ARGS, "train.resume=auto",
            f"train.batch_size={GLOBAL // n}", python=zygote_python, n=n,
        )  # fmt: skip
        assert_resumed_on_another_split(run, other, "written with 2 x 12")
        assert (
            "converting its ZeRO state to DeepSpeed's universal form"
            in (other / "train.log").read_text()
        )


@pytest.mark.slow
def test_deepspeed_config_micro_batch_other_than_train_batch_size_is_refused(
    tmp_path, cache_dir, zygote_python
):
    pytest.importorskip(
        "deepspeed", reason="the dev extra installs deepspeed (pip install -e '.[dev]')"
    )
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(
        '{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, '
        '"zero_optimization": {"stage": 2}}'
    )
    config = tmp_path / "deepspeed.yaml"
    config.write_text(f"""compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: {ds_json}
  zero3_init_flag: false
num_machines: 1
num_processes: 1
use_cpu: false
""")
    cmd = [
        zygote_python,
        *ACCELERATE[1:],
        "--main_process_port",
        free_port(),
        "--config_file",
        str(config),
        str(ROOT / "tests" / "engine_on_cpu.py"),
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={tmp_path / 'run'}",
        *COMMON,
        "train.batch_size=8",
    ]
    proc = run_launch(cmd, timeout=300, check=False)
    assert proc.returncode != 0
    assert (
        "The DeepSpeed config sets train_micro_batch_size_per_gpu=4 but train.batch_size=8; "
        "make them equal, or set the DeepSpeed one to auto."
    ) in proc.stderr


# -- resumed on another number of processes ------------------------------------------------------


def loop_state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step_{step:07d}" / "loop_state.json").read_text())


@pytest.mark.slow
def test_a_two_process_checkpoint_resumes_on_one_process_at_the_next_sample(
    tmp_path, cache_dir, ddp_reference
):
    """Map mode: the 2-process run's step-5 checkpoint, resumed by one process taking the same
    global batch in 2 micro-batches, reads on from the epoch's next sample: the same rows with
    the same masks as the 2 processes read, so the same losses, and the same position at the
    end."""
    resumed = tmp_path / "one"
    resume_from_step_5(ddp_reference, resumed)
    run_train(
        resumed, cache_dir, *ENGINE_ARGS, f"train.global_batch_size={GLOBAL}", "train.resume=auto"
    )
    text = (resumed / "train.log").read_text()
    assert f"written with 2 x 12: the epoch goes on at its sample {5 * GLOBAL}" in text
    assert "The global batch is now" not in text
    assert_same_losses(ddp_reference, resumed, rel=1e-4)

    def read(run: Path) -> int:  # samples of the epoch read by the step-10 checkpoint
        state = loop_state(run, 10)
        stream, world = state["stream"], state["world_size"]
        return stream["start"] + stream["offset"] * world * stream["batch_size"]

    assert read(resumed) == read(ddp_reference) == 10 * GLOBAL


ELASTIC_ARGS = [
    *COMMON,
    "data.streaming=true",
    "data.stream_shards=6",
    "data.shuffle_buffer=16",
    "data.stream_validation_docs=50",
    "data.max_eval_samples=16",
    "train.batch_size=2",
    "train.global_batch_size=12",
    "train.num_workers=0",
]


def shard_positions(run: Path, step: int) -> dict:
    """Where each stream shard stood at the step's checkpoint, whichever reader read it."""
    shards: dict = {}
    for rank in loop_state(run, step)["stream"]["ranks"]:
        for reader in rank["readers"]:
            shards.update(reader["shards"] if reader else {})
    return shards


@pytest.mark.slow
def test_a_streaming_checkpoint_resumes_on_three_and_on_one_process(
    tmp_path, cache_dir, zygote_python
):
    """A streaming run of 2 processes with 6 stream shards, checkpointed at step 5, goes on with
    3 processes and with 1 (the global batch of 12 kept by accumulation): every shard ends where
    the uninterrupted run's ends (the same documents read, none twice), and the losses go on as
    its, within the masks' noise."""
    whole = tmp_path / "two"
    launch_two(zygote_python, whole, cache_dir, *ELASTIC_ARGS)
    expected = shard_positions(whole, 10)
    assert sorted(expected, key=int) == [str(v) for v in range(6)]
    three, one = tmp_path / "three", tmp_path / "one"
    resume_from_step_5(whole, three)
    resume_from_step_5(whole, one)
    launch_two(zygote_python, three, cache_dir, *ELASTIC_ARGS, "train.resume=auto", n=3)
    run_train(one, cache_dir, *ELASTIC_ARGS, "train.resume=auto")
    for run, n in ((three, 3), (one, 1)):
        text = (run / "train.log").read_text()
        assert (
            f"read by 2 process(es) x 1 worker(s) at the checkpoint, are dealt out to {n} x 1"
            in (text)
        )
        assert shard_positions(run, 10) == expected
        a, b = events(whole, "train"), events(run, "train")
        assert [e["step"] for e in b] == list(range(1, 11))
        for x, y in zip(a[5:], b[5:]):
            assert y["global_batch_size"] == 12
            assert y["loss"] == pytest.approx(x["loss"], rel=0.05), (
                y["step"],
                x["loss"],
                y["loss"],
            )
        assert (run / "final" / "model.safetensors").is_file()
