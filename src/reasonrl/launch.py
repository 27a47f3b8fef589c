"""Run a stage script on one process, or under torchrun on several: the command dvc.yaml and the Snakefile give a
stage that can spread over GPUs, with the counts from ``params.yaml`` (``distributed``).

    python -m reasonrl.launch --nproc-per-node N --nnodes M stages/grpo.py --params params.yaml ...

- 1 × 1: the script runs in this process (``exec``), exactly as ``python stages/grpo.py ...`` would.
- N × 1: ``torchrun --standalone --nproc-per-node N``: one node, a rendezvous on a free local port.
- N × M: ``torchrun --nnodes M --nproc-per-node N`` with a c10d rendezvous at ``$MASTER_ADDR:$MASTER_PORT`` (port
  29500 by default) and the id ``$SLURM_JOB_ID``: start this command once per node (``srun --ntasks-per-node=1``),
  every node with the same ``MASTER_ADDR`` (the allocation's first host; the README's SLURM recipe sets it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from reasonrl.config import ConfigError

DEFAULT_PORT = "29500"


def torchrun_arguments(nproc_per_node: int, nnodes: int, environ: Mapping[str, str]) -> list[str]:
    """torchrun's arguments (before the script) for ``nnodes`` nodes of ``nproc_per_node`` processes."""
    if nnodes == 1:
        return ["--standalone", f"--nproc-per-node={nproc_per_node}"]
    if not environ.get("MASTER_ADDR"):
        raise ConfigError(
            f"distributed.nnodes: {nnodes} nodes meet at $MASTER_ADDR, which is not set; export the first node's "
            f"host name on every node (under SLURM: MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | "
            f"head -n 1))"
        )
    endpoint = f"{environ['MASTER_ADDR']}:{environ.get('MASTER_PORT', DEFAULT_PORT)}"
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={environ.get('SLURM_JOB_ID', 'reasonrl')}",
    ]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reasonrl.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, default=1, help="processes (GPUs) per node")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes")
    parser.add_argument("script", help="the stage script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    for name in ("nproc_per_node", "nnodes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"distributed.{name}: must be ≥ 1, got {getattr(args, name)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.nproc_per_node * args.nnodes == 1:
        os.execv(sys.executable, [sys.executable, args.script, *args.script_args])
    from torch.distributed.run import main as torchrun

    torchrun([*torchrun_arguments(args.nproc_per_node, args.nnodes, os.environ), args.script, *args.script_args])


if __name__ == "__main__":
    from reasonrl.cli import run_stage

    run_stage(main)
