"""Stage filter_cots: GSM8K train → SFT pairs in the r1_zero format (prompt ``sft.prompt``), all (full) and
verified-correct (filtered: the reference response earns reward 1 from ``rewards.<sft.prompt>``)."""

import statistics
from pathlib import Path

from reasonrl.atomic import atomic_directory, atomic_write_json, atomic_write_jsonl
from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.cot_filter import drop_counts, make_sft_pairs, require_kept
from reasonrl.data import load_gsm8k
from reasonrl.models import load_tokenizer
from reasonrl.prompts import check_prompt


def length_stats(lengths: list[int]) -> dict[str, float]:
    ordered = sorted(lengths)
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "max": ordered[-1],
    }


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--data", required=True, help="directory with train.jsonl")
    parser.add_argument(
        "--model", required=True, help="base model directory (its tokenizer renders chat prompts, measures lengths)"
    )
    parser.add_argument("--out", required=True, help="output directory for full.jsonl and filtered.jsonl")
    parser.add_argument("--stats", required=True, help="statistics JSON to write")
    args = parser.parse_args()
    params = load_params(args.params)
    prompt = params.sft.prompt
    tokenizer = load_tokenizer(args.model)
    check_prompt(prompt, "sft.prompt", tokenizer, args.model)
    pairs = make_sft_pairs(load_gsm8k(Path(args.data) / "train.jsonl"), prompt, tokenizer, params.rewards.specs)
    require_kept(pairs, prompt, params.rewards.specs)

    full = [{"prompt": pair.prompt, "response": pair.response} for pair in pairs]
    filtered = [record for record, pair in zip(full, pairs, strict=True) if pair.drop_reason is None]
    kept = [pair for pair in pairs if pair.drop_reason is None]
    stats = {
        "examples": len(pairs),
        "kept": len(kept),
        "dropped": drop_counts(pairs),
        "prompt_tokens": length_stats([len(tokenizer(p.prompt)["input_ids"]) for p in kept]),
        "response_tokens": length_stats([len(tokenizer(p.response)["input_ids"]) for p in kept]),
    }
    with atomic_directory(args.out) as staging:
        atomic_write_jsonl(staging / "full.jsonl", full)
        atomic_write_jsonl(staging / "filtered.jsonl", filtered)
    atomic_write_json(args.stats, stats)
    print(f"SFT pairs: {len(full)} full, {len(filtered)} filtered")


if __name__ == "__main__":
    run_stage(main)
