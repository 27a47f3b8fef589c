"""Stage grpo: GRPO from the base, SFT or EI model; keeps the best (validation) and the final policy. Resumable."""

import time
from pathlib import Path

from reasonrl.cli import open_live, run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import load_gsm8k
from reasonrl.distributed import init_ranks
from reasonrl.grpo import run_grpo
from reasonrl.model_card import TRAIN_SPLIT, VALIDATION_SPLIT, DataFile
from reasonrl.training.checkpoints import kept_directory
from reasonrl.training.stage import SavedModel, run_training_stage


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--models", required=True, help="the model directory: GRPO starts from its grpo.init_model")
    parser.add_argument("--data", required=True, help="directory with train.jsonl and val.jsonl")
    parser.add_argument("--out", required=True, help="output directory: best/ and final/ models")
    parser.add_argument("--checkpoints", required=True, help="resumable checkpoints (kept between runs)")
    parser.add_argument("--kept", required=True, help="policies kept every grpo.keep_every steps (kept between runs)")
    parser.add_argument("--metrics", required=True, help="summary metrics JSON to write")
    parser.add_argument("--cost", required=True, help="cost JSON to write (reasonrl.cost)")
    parser.add_argument("--live", required=True, help="DVCLive directory for the curves and example rollouts")
    args = parser.parse_args()
    started = time.perf_counter()
    params = load_params(args.params)
    config = params.grpo
    start = Path(args.models) / config.init_model  # read here, not templated into the command: no shell sees it
    train_file, val_file = Path(args.data) / "train.jsonl", Path(args.data) / "val.jsonl"
    train, val = load_gsm8k(train_file), load_gsm8k(val_file)

    ranks = init_ranks(params.distributed, "cpu" if params.rollout.layout == "cpu" else "cuda")  # before the engine
    shards = ranks.world_size if params.distributed.strategy == "fsdp2" else 1  # for the memory plan

    def run(engine, policy, tokenizer, keep, ledger):
        return run_grpo(
            policy,
            tokenizer,
            engine,
            train,
            val,
            config,
            params.eval,
            open_live=lambda resume: open_live(args.live, resume, monitor_system=params.rollout.on_gpu),
            live_dir=Path(args.live),
            checkpoint_dir=Path(args.checkpoints),
            init_model_dir=start,
            distributed=params.distributed,
            ranks=ranks,
            rewards=params.rewards.specs,
            keep=keep,
            ledger=ledger,
        )

    outputs = [
        SavedModel(
            Path(args.out) / "final",
            f"the policy after the last of {config.n_grpo_steps} steps (the best is in best/)",
            final=True,
        ),
        SavedModel(Path(args.out) / "best", "the step with the best validation accuracy"),
    ]
    best = run_training_stage(
        params,
        "grpo",
        start,
        [DataFile(train_file, TRAIN_SPLIT), DataFile(val_file, VALIDATION_SPLIT)],
        run,
        outputs,
        params_file=args.params,
        checkpoints=args.checkpoints,
        metrics=args.metrics,
        cost=args.cost,
        started=started,
        kept=kept_directory(args.kept) if config.cadence.keep_every else None,
        ranks=ranks,
        policy_shards=shards,
        # ≥ 1: the engine in a process of its own, which run_grpo's source stops
        max_staleness=config.asynchrony.max_staleness,
    )
    if ranks.is_main:
        print(f"grpo: best validation accuracy {best.accuracy:.3f} at step {best.step}")


if __name__ == "__main__":
    run_stage(main)
