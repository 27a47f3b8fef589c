"""Stage expert_iteration: rounds of sampling, keeping correct answers and fine-tuning on them. Resumable."""

import time
from pathlib import Path

from reasonrl.cli import open_live, run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import load_gsm8k
from reasonrl.expert_iteration import run_expert_iteration
from reasonrl.model_card import TRAIN_SPLIT, VALIDATION_SPLIT, DataFile
from reasonrl.training.stage import SavedModel, run_training_stage


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--models", required=True, help="the model directory: the rounds start from its ei.init_model")
    parser.add_argument("--data", required=True, help="directory with train.jsonl and val.jsonl")
    parser.add_argument("--out", required=True, help="output model directory (best round)")
    parser.add_argument("--checkpoints", required=True, help="resumable checkpoints (kept between runs)")
    parser.add_argument("--metrics", required=True, help="summary metrics JSON to write")
    parser.add_argument("--cost", required=True, help="cost JSON to write (reasonrl.cost)")
    parser.add_argument("--live", required=True, help="DVCLive directory for the curves")
    args = parser.parse_args()
    started = time.perf_counter()
    params = load_params(args.params)
    config = params.ei
    start = Path(args.models) / config.init_model  # read here, not templated into the command: no shell sees it
    train_file, val_file = Path(args.data) / "train.jsonl", Path(args.data) / "val.jsonl"
    train, val = load_gsm8k(train_file), load_gsm8k(val_file)

    def run(engine, policy, tokenizer, keep, ledger):
        return run_expert_iteration(
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
            rewards=params.rewards.specs,
            ledger=ledger,
        )

    best = run_training_stage(
        params,
        "ei",
        start,
        [DataFile(train_file, TRAIN_SPLIT), DataFile(val_file, VALIDATION_SPLIT)],
        run,
        [SavedModel(Path(args.out), "the round with the best validation accuracy")],
        params_file=args.params,
        checkpoints=args.checkpoints,
        metrics=args.metrics,
        cost=args.cost,
        started=started,
        unit="round",
    )
    print(f"expert iteration: best validation accuracy {best.accuracy:.3f} after round {best.step}")


if __name__ == "__main__":
    run_stage(main)
