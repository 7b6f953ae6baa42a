"""``train.py`` under accelerate's FSDP engine on CPU processes (gloo), for the tests.

accelerate turns a launch with an FSDP config into FSDP only on GPU-class devices; on CPU
processes it falls back to DDP. This launcher switches its distributed type to FSDP after
the Accelerator starts and builds the FSDP plugin from the launcher's environment (the
``FSDP_*`` variables ``accelerate launch --config_file conf/accelerate/fsdp.yaml`` sets), so
accelerate's own FSDP2 paths run: ``fully_shard`` per BertLayer, sharded checkpoints,
the full-state gather for the export.

    ACCELERATE_USE_CPU=1 accelerate launch --config_file conf/accelerate/fsdp.yaml \
        --num_processes 2 tests/fsdp_on_cpu.py <train.py overrides>
"""

import runpy
import sys
from pathlib import Path

import accelerate
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin


class FSDPOnCPU(accelerate.Accelerator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* environment
        if self.state.mixed_precision != "no":
            plugin.set_mixed_precision(self.state.mixed_precision)
        # AcceleratorState copies PartialState's fields whenever it is constructed again.
        for state in (PartialState(), self.state):
            state.distributed_type = DistributedType.FSDP
        self.state.fsdp_plugin = plugin


accelerate.Accelerator = FSDPOnCPU
root = Path(__file__).resolve().parents[1]
sys.argv = [str(root / "train.py"), *sys.argv[1:]]
runpy.run_path(str(root / "train.py"), run_name="__main__")
