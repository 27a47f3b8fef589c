"""Stage sft: fine-tune the base model on SFT pairs; keep the checkpoint with the best validation accuracy.
Resumable."""

import time
from pathlib import Path

from reasonrl.atomic import atomic_write_json
from reasonrl.checkpoints import checkpoint_lock, kept_directory, remove_checkpoints
from reasonrl.cli import open_live, run_stage, stage_parser
from reasonrl.config import ConfigError, load_params
from reasonrl.data import load_gsm8k, read_jsonl
from reasonrl.lora import trainable_parameter_count
from reasonrl.model_card import git_commit, render_card
from reasonrl.sft import BestCheckpoint, Pair, run_sft, save_policy, start_training


def load_pairs(path: Path, num_examples: int | None) -> list[Pair]:
    pairs = [Pair(record["prompt"], record["response"]) for record in read_jsonl(path)]
    if not pairs:
        raise ConfigError(
            f"sft.dataset: {path} holds no SFT pairs (reports/filter_cots/stats.json counts why each was dropped); "
            "train data without reasoning (answer_format: number) leaves filtered empty: use sft.dataset: full"
        )
    if num_examples is not None and num_examples > len(pairs):
        raise ConfigError(f"sft.num_examples: asks for {num_examples} pairs but {path} has {len(pairs)}")
    return pairs[:num_examples]


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--model", required=True, help="base model directory")
    parser.add_argument("--pairs", required=True, help="directory with full.jsonl and filtered.jsonl")
    parser.add_argument("--data", required=True, help="directory with val.jsonl")
    parser.add_argument("--out", required=True, help="output model directory (best checkpoint)")
    parser.add_argument("--checkpoints", required=True, help="resumable checkpoints (kept between runs)")
    parser.add_argument("--kept", required=True, help="policies kept every sft.keep_every steps (kept between runs)")
    parser.add_argument("--metrics", required=True, help="summary metrics JSON to write")
    parser.add_argument("--live", required=True, help="DVCLive directory for the curves")
    args = parser.parse_args()
    started = time.perf_counter()
    params = load_params(args.params)
    config = params.sft
    pairs_file, val_file = Path(args.pairs) / f"{config.dataset}.jsonl", Path(args.data) / "val.jsonl"
    pairs = load_pairs(pairs_file, config.num_examples)
    val = load_gsm8k(val_file)

    commit = git_commit()
    kept = kept_directory(args.kept) if config.keep_every else None
    # One run at a time writes the checkpoints, the kept policies, the curves and the outputs.
    with checkpoint_lock(args.checkpoints, kept):
        engine, policy, tokenizer = start_training(args.model, config, "sft", params.rollout)

        def keep(step: int, best: BestCheckpoint) -> None:
            card = render_card(
                params, "sft", f"the policy after optimizer step {step}", best, "step", [pairs_file, val_file], commit
            )
            save_policy(policy, tokenizer, kept / f"step_{step:06d}", card=card)

        best = run_sft(
            policy,
            tokenizer,
            pairs,
            config,
            engine,
            val,
            params.eval,
            open_live=lambda resume: open_live(args.live, resume=resume),
            live_dir=Path(args.live),
            checkpoint_dir=Path(args.checkpoints),
            init_model_dir=args.model,
            keep=keep,
            rewards=params.rewards.specs,
        )
        checkpoint = "the step with the best validation accuracy"
        card = render_card(params, "sft", checkpoint, best, "step", [pairs_file, val_file], commit)
        save_policy(policy, tokenizer, args.out, best.state_dict, card)
        atomic_write_json(
            args.metrics,
            {
                "best_val_accuracy": best.accuracy,
                "best_step": best.step,
                "train_pairs": len(pairs),
                "trainable_parameters": trainable_parameter_count(policy),
                "wall_clock_seconds": round(time.perf_counter() - started, 1),
            },
        )
        remove_checkpoints(Path(args.checkpoints))
    print(f"sft: best validation accuracy {best.accuracy:.3f} at step {best.step}; saved to {args.out}")


if __name__ == "__main__":
    run_stage(main)
