"""One setting, several seeds:
``python -m reasonrl.seeds 0 1 2 [-S key=value …] [--name NAME] [--vary KEY …] [--run [-j N]]``.

Queues one DVC experiment per seed, named ``<setting>-seed<k>``, each with the setting's ``-S`` overrides and every
param of :data:`SEED_PARAMS` set to ``k`` (``--vary`` narrows them). The name is what
``python -m reasonrl.compare --settings`` groups by; the overrides are in each experiment's params, where
``dvc params diff`` and compare's params table show them. Everything is checked against ``params.yaml`` (unknown
keys, values the pipeline refuses, seeds, names already taken) before anything is queued.

The data's seeds (``data.split_seed``, ``data.arithmetic.seed``) and the evaluation's (``rollout.seed``) are not
varied: every seed of every setting answers the same test questions with the same sampling seed, which is what the
interval over seeds and questions and the comparison across settings assume (:mod:`reasonrl.statistics`).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reasonrl.cli import run_stage
from reasonrl.config import ConfigError, Params, from_dict, parse_yaml
from reasonrl.errors import UserError
from reasonrl.presets import apply_overrides
from reasonrl.report.inputs import flatten

SEED_PARAMS = ("model.seed", "sft.seed", "ei.seed", "grpo.seed")
"""What a training run's seed is: the tiny model's initial weights, SFT's data order, EI's question draws and
sampling, GRPO's question draws and sampling. With a hub model ``model.seed`` changes nothing."""
PARAMS = Path("params.yaml")
SEED_SUFFIX = "-seed"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_EXPERIMENT = re.compile(rf"(?P<setting>{_NAME.pattern}){SEED_SUFFIX}(?P<seed>[0-9]+)")


class SeedsError(UserError):
    """Seeds, overrides or a name that cannot be queued; the message names them."""


def experiment_name(setting: str, seed: int) -> str:
    return f"{setting}{SEED_SUFFIX}{seed}"


def parse_experiment_name(name: str) -> tuple[str, int] | None:
    """``(setting, seed)`` of a name :func:`experiment_name` wrote; None for any other name."""
    match = _EXPERIMENT.fullmatch(name)
    return None if match is None else (match["setting"], int(match["seed"]))


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` read as ``dvc exp run -S`` reads it, by the Hydra override grammar DVC parses it with
    (``3e-5`` a float, ``[a,b]`` a list, ``{k:v}`` a mapping, ``null``; ``++key=…`` force-adds, the key is checked
    as ``key``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        [override] = OverridesParser.create().parse_overrides([text])
        return override.key_or_group, override.value()
    except HydraException as error:
        first_line = str(error).splitlines()[0]
        raise SeedsError(
            f"-S {text!r}: not an override DVC reads ({first_line}), e.g. -S grpo.loss_type=grpo_clip"
        ) from None


def default_setting_name(assignments: Sequence[str]) -> str:
    """A name made of the overrides (``-S grpo.loss_type=grpo_clip`` → ``loss_type-grpo_clip``); ``default``
    without any."""
    if not assignments:
        return "default"
    parts = []
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        parts.append(re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key.rsplit('.', 1)[-1]}-{value}").strip("_."))
    return "_".join(parts)


def check_setting_name(name: str) -> None:
    if not _NAME.fullmatch(name) or ".." in name or name.endswith((".", ".lock")) or len(name) > 80:
        raise SeedsError(
            f"setting name {name!r}: use letters, digits, '.', '_' and '-' (starting with a letter or digit, at most "
            "80 characters); name it with --name"
        )


def checked_plan(
    params_text: str, seeds: Sequence[int], assignments: Sequence[str], varied: Sequence[str]
) -> dict[int, dict[str, Any]]:
    """Each seed's overrides (the setting's, then each varied seed param set to the seed), after checking that
    params.yaml has every key and accepts every seed's values (:func:`reasonrl.config.from_dict`)."""
    if not seeds:
        raise SeedsError("name one seed at least, e.g. python -m reasonrl.seeds 0 1 2")
    if bad := [seed for seed in seeds if seed < 0]:
        raise SeedsError(f"seeds must be non-negative integers, got {bad}")
    if len(set(seeds)) < len(seeds):
        raise SeedsError(f"each seed once: {list(seeds)} repeats one")
    tree = parse_yaml(params_text)
    known = flatten(tree)
    overrides = dict(parse_assignment(a) for a in assignments)
    if not_seeds := [key for key in varied if key not in SEED_PARAMS]:
        raise SeedsError(
            f"--vary {', '.join(not_seeds)}: not a training seed; --vary takes {', '.join(SEED_PARAMS)} (the data's "
            "and the evaluation's seeds stay fixed, so that every seed answers the same test questions)"
        )
    if unknown := [key for key in overrides if key not in known]:
        raise SeedsError(f"params.yaml has no parameter {', '.join(unknown)} (-S takes its dotted keys)")
    if clash := [key for key in overrides if key in varied]:
        raise SeedsError(
            f"-S {', '.join(clash)}: a seed param the command sets per seed; drop it or leave it out of --vary"
        )
    if not varied:
        raise SeedsError("--vary: name one seed param at least")
    plan = {}
    for seed in seeds:
        values = {**overrides, **dict.fromkeys(varied, seed)}
        seeded = parse_yaml(params_text)
        apply_overrides(seeded, values)
        try:
            from_dict(Params, seeded)
        except ConfigError as error:
            raise SeedsError(f"params.yaml with {', '.join(assignments) or 'no -S'} and seed {seed}: {error}") from None
        plan[seed] = values
    return plan


def taken_names(names: Sequence[str]) -> list[str]:
    """Those of ``names`` that an experiment of the current commit or one in DVC's queue already has."""
    from dvc.repo import Repo

    with Repo() as repo:
        existing = {name for experiments in repo.experiments.ls().values() for name, _ in experiments}
        queue = repo.experiments.celery_queue
        existing |= {entry.name for entry in [*queue.iter_queued(), *queue.iter_active()] if entry.name}
    return [name for name in names if name in existing]


def queue_commands(
    setting: str, assignments: Sequence[str], plan: dict[int, dict[str, Any]], varied: Sequence[str]
) -> list[list[str]]:
    """One ``dvc exp run --queue`` per seed: the setting's ``-S`` as the user wrote them, then the seed params."""
    return [
        [
            "dvc", "exp", "run", "--queue", "--name", experiment_name(setting, seed),
            *(f"-S{assignment}" for assignment in assignments), *(f"-S{key}={seed}" for key in varied),
        ]
        for seed in plan
    ]  # fmt: skip


def run_dvc(command: Sequence[str], follow: bool = False) -> None:
    """``command`` (``dvc …``) with this interpreter's DVC, echoed first; a failure stops with DVC's message.
    ``follow``: its output goes to the terminal as it comes (a run of the queue)."""
    print("$ " + " ".join(command), flush=True)
    result = subprocess.run([sys.executable, "-m", *command], capture_output=not follow, text=True)
    if result.returncode != 0:
        message = "its output above" if follow else (result.stderr or result.stdout).strip()
        raise SeedsError(f"`{' '.join(command)}` failed: {message}")


EXAMPLES = """examples:
  python -m reasonrl.seeds 0 1 2 --name reference                                # params.yaml as it is
  python -m reasonrl.seeds 0 1 2 -S grpo.loss_type=grpo_clip --name clip --run   # and run the queue
  python -m reasonrl.seeds 0 1 2 --vary grpo.seed -S grpo.learning_rate=3e-5     # only GRPO's seed varies
  python -m reasonrl.compare --settings reference clip --out compare.md          # once they have run"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.seeds",
        description="Queue one DVC experiment per seed of a setting, named <setting>-seed<k>, with the setting's -S\n"
        f"overrides and the seed params ({', '.join(SEED_PARAMS)}) set to k. Checked against params.yaml\n"
        "before anything is queued. `python -m reasonrl.compare --settings` compares settings over their seeds.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("seeds", nargs="+", type=int, metavar="SEED", help="seeds, e.g. 0 1 2")
    parser.add_argument(
        "-S", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
        help="a param of the setting, as dvc exp run -S takes it (repeatable)",
    )  # fmt: skip
    parser.add_argument("--name", help="the setting's name (default: made of the -S overrides, or `default`)")
    parser.add_argument(
        "--vary", action="append", metavar="KEY",
        help=f"a seed param set to each seed (repeatable; default: {' '.join(SEED_PARAMS)})",
    )  # fmt: skip
    parser.add_argument(
        "--run", action="store_true", help="then run the queue to its end (dvc exp run --run-all; without --run: "
        "dvc queue start runs it in the background)"
    )  # fmt: skip
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="experiments at a time with --run, and in the advice printed (default 1)",
    )
    args = parser.parse_args(argv)
    varied = args.vary or list(SEED_PARAMS)
    if not PARAMS.is_file():
        raise SeedsError(f"no {PARAMS} here: run it at the repository's root")
    plan = checked_plan(PARAMS.read_text(encoding="utf-8"), args.seeds, args.assignments, varied)
    setting = args.name if args.name is not None else default_setting_name(args.assignments)
    check_setting_name(setting)
    names = [experiment_name(setting, seed) for seed in plan]
    if taken := taken_names(names):
        raise SeedsError(
            f"experiment names already taken: {', '.join(taken)} (`dvc exp list`, `dvc queue status`); choose another "
            "--name, or remove them (`dvc exp remove NAME`, `dvc queue remove NAME`)"
        )
    for command in queue_commands(setting, args.assignments, plan, varied):
        run_dvc(command)
    if args.run:
        run_dvc(["dvc", "exp", "run", "--run-all", "-j", str(args.jobs)], follow=True)
    print(f"seeds: {'ran' if args.run else 'queued'} {', '.join(names)}")
    if not args.run:
        print(f"run them: dvc queue start -j {args.jobs} (in the background; dvc queue status follows them)")
    print(f"compare: python -m reasonrl.compare --settings {setting} OTHER_SETTING [...] --out compare.md")


if __name__ == "__main__":
    run_stage(main)
