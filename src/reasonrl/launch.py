"""Run a stage script on one process, or under torchrun on several: the command dvc.yaml and the Snakefile give a
stage that can spread over GPUs, with the counts from ``params.yaml`` (``distributed``).

    python -m reasonrl.launch --params params.yaml stages/grpo.py --params params.yaml ...
    python -m reasonrl.launch --nproc-per-node N --nnodes M SCRIPT ARGS...

``--params`` reads the counts from the file (``distributed.nproc_per_node``, ``distributed.nnodes``, validated), so
no value of the file passes through the shell that runs the command (dvc.yaml's way).

- 1 × 1: the script runs in this process (``exec``), exactly as ``python stages/grpo.py ...`` would.
- N × 1: ``torchrun --standalone --nproc-per-node N``: one node, a rendezvous on a free local port.
- N × M: one torchrun agent per node, ``--nnodes M --nproc-per-node N``, meeting in a c10d rendezvous at
  ``$MASTER_ADDR:$MASTER_PORT`` (port 29500 by default) with the id ``$SLURM_JOB_ID``. Inside a SLURM allocation
  (a batch job on M nodes, as Snakemake's SLURM profile submits it) this command starts itself once per node with
  ``srun --nodes M --ntasks-per-node 1`` and sets ``MASTER_ADDR`` to the allocation's first host; elsewhere, run it on
  every node yourself with the same ``MASTER_ADDR``.

The ranks die with this launcher: torchrun runs in this process, and each rank asks the kernel for SIGTERM when it
ends, even by SIGKILL (Linux's ``PR_SET_PDEATHSIG``; torchrun alone starts them in sessions of their own, where a
killed agent leaves them running). A SIGTERM or SIGINT to the launcher reaches the ranks through torchrun, which stops
them before it exits.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from reasonrl.config import ConfigError, load_params

DEFAULT_PORT = "29500"


NODE_LAUNCHED = "REASONRL_NODE_LAUNCHED"
"""Set on the per-node launchers ``srun`` starts, so that they run torchrun instead of starting ``srun`` again."""


def srun_command(nnodes: int, argv: Sequence[str]) -> list[str]:
    """This launch again, once on each of the allocation's ``nnodes`` nodes. The task count is explicit and the step
    may overlap the one it is started from (Snakemake's SLURM jobs run their command inside an ``srun`` step, whose
    ``SLURM_NTASKS=1`` srun would otherwise take, and whose resources it would otherwise wait for)."""
    return ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--overlap",
            "--kill-on-bad-exit=1", sys.executable, "-m", "reasonrl.launch", *argv]  # fmt: skip


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[01-04]`` style), as ``scontrol`` expands it."""
    import subprocess

    hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return hosts.stdout.split()[0]


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


PR_SET_PDEATHSIG = 1
"""From ``<linux/prctl.h>``: the signal the kernel sends a process when its parent ends."""


def die_with_parent(parent: int, child: str) -> None:
    """Have the kernel send this process SIGTERM when ``parent`` ends, however it ends; exit now, naming ``child``
    (this process), if it has already (then no signal would come). Only the thread that started this process counts
    as its parent: torchrun starts the ranks from its main thread, which lives as long as the launcher (and so must
    whatever starts a process that calls this)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        sys.exit(f"{child}: its parent (PID {parent}) ended before it started")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="python -m reasonrl.launch", description=first_paragraph)
    parser.add_argument("--params", help="read the counts from this params file's distributed section")
    parser.add_argument("--nproc-per-node", type=int, help="processes (GPUs) per node (default 1)")
    parser.add_argument("--nnodes", type=int, help="nodes (default 1)")
    # Internal: how torchrun starts each rank (through this module, to tie the rank's life to the launcher's).
    parser.add_argument("--rank-of", type=int, help=argparse.SUPPRESS)
    parser.add_argument("script", help="the stage script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.params is not None:
        if args.nproc_per_node is not None or args.nnodes is not None:
            raise ConfigError(
                f"--params {args.params}: the counts come from its distributed section; drop --nproc-per-node and "
                f"--nnodes"
            )
        distributed = load_params(args.params).distributed
        args.nproc_per_node, args.nnodes = distributed.nproc_per_node, distributed.nnodes
    args.nproc_per_node = 1 if args.nproc_per_node is None else args.nproc_per_node
    args.nnodes = 1 if args.nnodes is None else args.nnodes
    for name in ("nproc_per_node", "nnodes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"distributed.{name}: must be ≥ 1, got {getattr(args, name)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.rank_of is not None:  # a rank torchrun started: the command torchrun itself would have run
        die_with_parent(args.rank_of, "reasonrl.launch: this rank")
        os.execv(sys.executable, [sys.executable, "-u", args.script, *args.script_args])
    if args.nproc_per_node * args.nnodes == 1:
        os.execv(sys.executable, [sys.executable, args.script, *args.script_args])
    if args.nnodes > 1 and "SLURM_JOB_ID" in os.environ and NODE_LAUNCHED not in os.environ:
        environ = {**os.environ, NODE_LAUNCHED: "1"}
        if not environ.get("MASTER_ADDR"):
            if not environ.get("SLURM_JOB_NODELIST"):
                raise ConfigError(
                    "distributed.nnodes: in SLURM job $SLURM_JOB_ID without $SLURM_JOB_NODELIST; export MASTER_ADDR "
                    "(the first node's host name) for the nodes to meet at"
                )
            environ["MASTER_ADDR"] = first_host(environ["SLURM_JOB_NODELIST"])
        command = srun_command(args.nnodes, argv)
        os.execvpe(command[0], command, environ)
    from torch.distributed.run import main as torchrun

    torchrun([*torchrun_arguments(args.nproc_per_node, args.nnodes, os.environ), "--module", "reasonrl.launch",
              f"--rank-of={os.getpid()}", args.script, *args.script_args])  # fmt: skip


if __name__ == "__main__":
    from reasonrl.cli import run_stage

    run_stage(main)
