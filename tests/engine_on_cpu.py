"""``train.py`` under accelerate's FSDP or DeepSpeed engine on CPU processes (gloo), for tests.

accelerate turns a launch with an FSDP or DeepSpeed config into that engine only on
GPU-class devices; CPU processes fall back to plain data parallelism. This launcher
switches accelerate's distributed type after the Accelerator starts and builds the
engine's plugin from the launcher's environment (the ``FSDP_*`` or
``ACCELERATE_DEEPSPEED_*`` variables ``accelerate launch --config_file ...`` sets), so
accelerate's own code paths run: FSDP2's ``fully_shard`` per BertLayer or DeepSpeed's
ZeRO engine (with DeepSpeed's CPU accelerator), their sharded checkpoints, and the
full-weight gather for the export.

    ACCELERATE_USE_CPU=1 accelerate launch --config_file conf/accelerate/fsdp.yaml \
        --num_processes 2 tests/engine_on_cpu.py <train.py overrides>
"""

import importlib
import os
import runpy
import sys
from pathlib import Path

import accelerate
from accelerate.state import PartialState
from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin

from mlmkit.training import setup


def skip_shared_memory_op() -> None:
    """Keep DeepSpeed's CPU backend from building its shared-memory allreduce: two C++ files,
    about a minute of one core each on a fresh machine.
    DeepSpeed calls that op only in ``inference_all_reduce``; training's collectives go through
    torch.distributed (gloo here) with or without it."""
    try:  # by name: the package's attribute ``torch`` is torch itself
        deepspeed_comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError:  # without the deepspeed extra: FSDP only
        return
    deepspeed_comm.build_shm_op = lambda: None


skip_shared_memory_op()


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"


class EngineOnCPU(accelerate.Accelerator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if _flag("ACCELERATE_USE_FSDP"):
            engine, plugin = DistributedType.FSDP, FullyShardedDataParallelPlugin()
            if self.state.mixed_precision != "no":
                plugin.set_mixed_precision(self.state.mixed_precision)
        elif _flag("ACCELERATE_USE_DEEPSPEED"):
            engine, plugin = DistributedType.DEEPSPEED, DeepSpeedPlugin()
            plugin.set_mixed_precision(self.state.mixed_precision)
        else:
            raise SystemExit("engine_on_cpu.py: launch it with an FSDP or DeepSpeed --config_file")
        # AcceleratorState copies PartialState's fields whenever it is constructed again.
        for state in (PartialState(), self.state):
            state.distributed_type = engine
        if engine == DistributedType.FSDP:
            self.state.fsdp_plugin = plugin
        else:
            self.state.deepspeed_plugins = {"default": plugin}
            plugin.select(_from_accelerator_state=True)


accelerate.Accelerator = EngineOnCPU
# mlmkit's setup took accelerate's name when it was imported (where this process imported
# mlmkit before this file ran)
setup.Accelerator = EngineOnCPU
root = Path(__file__).resolve().parents[1]
sys.argv = [str(root / "train.py"), *sys.argv[1:]]
runpy.run_path(str(root / "train.py"), run_name="__main__")
