"""Stage download: GSM8K (verified, validated), the synthetic arithmetic set or the user's own jsonl files, all
written in GSM8K's format → ``train/val/test.jsonl``; each of ``eval.test_sets`` → ``<test-sets>/<name>.jsonl``."""

from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import fetch_verified_gsm8k, fetch_verified_jsonl, resolve_source, write_splits, write_test_sets
from reasonrl.synthetic import arithmetic_lines


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--out", required=True, help="output directory for train/val/test.jsonl")
    parser.add_argument("--test-sets", required=True, help="output directory for one <name>.jsonl per eval.test_sets")
    args = parser.parse_args()
    params = load_params(args.params)
    data = params.data
    if data.name == "arithmetic":
        synthetic = data.arithmetic
        source = f"synthetic arithmetic (seed {synthetic.seed})"
        train, test = (
            arithmetic_lines(size, synthetic.seed * 2 + offset, synthetic.max_steps, synthetic.max_value)
            for offset, size in enumerate((synthetic.train_size, synthetic.test_size))
        )
    elif data.name == "jsonl":
        source = f"{data.jsonl.train.path} and {data.jsonl.test.path}"
        train, test = (
            fetch_verified_jsonl(file.path, file.sha256, data.jsonl.fields, f"data.jsonl.{split}")
            for split, file in (("train", data.jsonl.train), ("test", data.jsonl.test))
        )
    else:
        source = resolve_source(data.mirror, data.url)
        splits = fetch_verified_gsm8k(source, data.sha256)
        train, test = splits["train"], splits["test"]
    test_sets = {
        test_set.name: fetch_verified_jsonl(test_set.path, test_set.sha256, test_set.fields, f"eval.test_sets[{index}]")
        for index, test_set in enumerate(params.eval.test_sets)
    }
    counts = write_splits(train, test, data.val_size, data.split_seed, args.out)
    write_test_sets(test_sets, args.test_sets)
    counts |= {f"test set {name}": len(lines) for name, lines in test_sets.items()}
    print(f"{data.name} from {source}: " + ", ".join(f"{split} {count}" for split, count in counts.items()))


if __name__ == "__main__":
    run_stage(main)
