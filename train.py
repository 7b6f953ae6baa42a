"""Pretrain a masked language model from a checkout: ``python train.py`` or
``accelerate launch train.py``; the same as ``mlmkit train``.

Any setting can be overridden Hydra-style, e.g.
``accelerate launch train.py model=bert-mini optim.lr=5e-4 train.max_steps=200``.
"""

import sys

from mlmkit.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
