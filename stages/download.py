"""Stage download: GSM8K (verified, validated) or the synthetic arithmetic set → ``train/val/test.jsonl``."""

from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import fetch_verified_gsm8k, resolve_source, write_splits
from reasonrl.synthetic import arithmetic_lines


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--out", required=True, help="output directory for train/val/test.jsonl")
    args = parser.parse_args()
    data = load_params(args.params).data
    if data.name == "arithmetic":
        synthetic = data.arithmetic
        source = f"synthetic arithmetic (seed {synthetic.seed})"
        train, test = (
            arithmetic_lines(size, synthetic.seed * 2 + offset, synthetic.max_steps, synthetic.max_value)
            for offset, size in enumerate((synthetic.train_size, synthetic.test_size))
        )
    else:
        source = resolve_source(data.mirror, data.url)
        splits = fetch_verified_gsm8k(source, data.sha256)
        train, test = splits["train"], splits["test"]
    counts = write_splits(train, test, data.val_size, data.split_seed, args.out)
    print(f"{data.name} from {source}: " + ", ".join(f"{split} {count}" for split, count in counts.items()))


if __name__ == "__main__":
    run_stage(main)
