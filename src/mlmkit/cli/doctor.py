"""``mlmkit doctor [<overrides of a run>] [--out report.json]``: what the run those overrides
describe will get on this machine (``mlmkit.training.doctor``), in under a minute.

    mlmkit doctor model=bert-base data=files 'data.train_files=[corpus.txt]'
    mlmkit doctor model=modernbert-base data.max_seq_length=1024 --out doctor.json
"""

from __future__ import annotations

import argparse
import json


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mlmkit doctor", description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="the run's settings, as for mlmkit train")
    p.add_argument(
        "--steps", type=int, default=20, help="timed steps of the rehearsal (default 20)"
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=20.0,
        help="the rehearsal's training time limit, whatever its steps (default 20)",
    )
    p.add_argument("--out", default=None, help="also write the report to this JSON file")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mlmkit.cli.errors import hydra_error_sentence
    from mlmkit.config import compose
    from mlmkit.errors import ConfigError
    from mlmkit.training.doctor import format_report, run_doctor

    try:
        cfg = compose(args.overrides)
    except (HydraException, OmegaConfBaseException) as exc:  # as mlmkit train says it
        raise ConfigError(hydra_error_sentence(exc)) from None
    report = run_doctor(cfg, steps=args.steps, max_seconds=args.max_seconds)
    print(format_report(report))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
    return 0
