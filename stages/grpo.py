"""Stage grpo: GRPO from the base, SFT or EI model; keeps the best (validation) and the final policy. Resumable."""

import contextlib
import time
from pathlib import Path

from reasonrl.atomic import atomic_write_json
from reasonrl.checkpoints import checkpoint_lock, kept_directory, remove_checkpoints
from reasonrl.cli import open_live, run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import load_gsm8k
from reasonrl.distributed import init_ranks
from reasonrl.grpo import run_grpo
from reasonrl.lora import merged_weights, trainable_parameter_count
from reasonrl.model_card import git_commit, render_card
from reasonrl.sft import BestCheckpoint, save_policy, start_training


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--models", required=True, help="the model directory: GRPO starts from its grpo.init_model")
    parser.add_argument("--data", required=True, help="directory with train.jsonl and val.jsonl")
    parser.add_argument("--out", required=True, help="output directory: best/ and final/ models")
    parser.add_argument("--checkpoints", required=True, help="resumable checkpoints (kept between runs)")
    parser.add_argument("--kept", required=True, help="policies kept every grpo.keep_every steps (kept between runs)")
    parser.add_argument("--metrics", required=True, help="summary metrics JSON to write")
    parser.add_argument("--live", required=True, help="DVCLive directory for the curves and example rollouts")
    args = parser.parse_args()
    started = time.perf_counter()
    params = load_params(args.params)
    config = params.grpo
    start = Path(args.models) / config.init_model  # read here, not templated into the command: no shell sees it
    data_files = [Path(args.data) / "train.jsonl", Path(args.data) / "val.jsonl"]
    train, val = (load_gsm8k(path) for path in data_files)

    kept = kept_directory(args.kept) if config.keep_every else None
    ranks = init_ranks(params.distributed, "cpu" if params.rollout.layout == "cpu" else "cuda")  # before the engine
    # One run at a time writes the checkpoints, the kept policies, the curves and the outputs: rank 0 holds the locks
    # for the whole run (its ranks are one holder), and a second run stops here, before it reads or deletes anything.
    with checkpoint_lock(args.checkpoints, kept) if ranks.is_main else contextlib.nullcontext():
        shards = ranks.world_size if params.distributed.strategy == "fsdp2" else 1  # for the memory plan
        # grpo.max_staleness ≥ 1: the engine in a process of its own, sampling while the policy trains; run_grpo's
        # source of rollouts stops it
        engine, policy, tokenizer = start_training(
            start, config, "grpo", params.rollout, ranks, shards, config.max_staleness
        )
        commit = git_commit()

        def keep(step: int, best: BestCheckpoint) -> None:
            weights = dict(merged_weights(policy))  # every rank: gathered from the shards under FSDP2
            if ranks.is_main:
                card = render_card(params, "grpo", f"the policy after step {step}", best, "step", data_files, commit)
                save_policy(policy, tokenizer, kept / f"step_{step:06d}", weights, card)

        best = run_grpo(
            policy,
            tokenizer,
            engine,
            train,
            val,
            config,
            params.eval,
            open_live=lambda resume: open_live(args.live, resume=resume),
            live_dir=Path(args.live),
            checkpoint_dir=Path(args.checkpoints),
            init_model_dir=start,
            distributed=params.distributed,
            ranks=ranks,
            rewards=params.rewards.specs,
            keep=keep,
        )
        final = dict(merged_weights(policy))  # every rank: gathered from the shards under FSDP2
        if not ranks.is_main:
            return
        checkpoints = {
            "final": (final, f"the policy after the last of {config.n_grpo_steps} steps (the best is in best/)"),
            "best": (best.state_dict, "the step with the best validation accuracy"),
        }
        for name, (weights, checkpoint) in checkpoints.items():
            card = render_card(params, "grpo", checkpoint, best, "step", data_files, commit)
            save_policy(policy, tokenizer, Path(args.out) / name, weights, card)
        atomic_write_json(
            args.metrics,
            {
                "best_val_accuracy": best.accuracy,
                "best_step": best.step,
                "trainable_parameters": trainable_parameter_count(policy),
                "wall_clock_seconds": round(time.perf_counter() - started, 1),
            },
        )
        remove_checkpoints(Path(args.checkpoints))
    print(f"grpo: best validation accuracy {best.accuracy:.3f} at step {best.step}")


if __name__ == "__main__":
    run_stage(main)
