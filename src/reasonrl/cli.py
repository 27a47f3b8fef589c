"""What every stage script shares: its argument parser and how a user error ends the stage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from reasonrl.errors import UserError


def stage_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    return parser


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main``; a user error prints ``error: ...`` naming its source and exits with status 2."""
    try:
        main()
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def open_live(directory: str, resume: bool = False, monitor_system: bool = False):
    """DVCLive for a stage that DVC or Snakemake runs: the pipeline file declares its outputs, so DVCLive neither
    writes a dvc.yaml nor saves an experiment of its own. ``monitor_system``: DVCLive samples the GPUs' memory and
    utilisation (and the CPU, RAM and disk) as it runs, into ``system/*`` curves; the training stages ask for it on a
    GPU layout only (on the CPU its sampling thread would compete with the run for the cores)."""
    from dvclive import Live

    return Live(directory, resume=resume, save_dvc_exp=False, dvcyaml=False, monitor_system=monitor_system)
