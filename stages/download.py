"""Stage download: GSM8K train/test → verified, validated ``train/val/test.jsonl`` (val carved from train)."""

from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import download_gsm8k, resolve_source


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--out", required=True, help="output directory for train/val/test.jsonl")
    args = parser.parse_args()
    data = load_params(args.params).data
    source = resolve_source(data.mirror, data.url)
    counts = download_gsm8k(source, data.sha256, data.val_size, data.split_seed, args.out)
    print(f"GSM8K from {source}: " + ", ".join(f"{split} {count}" for split, count in counts.items()))


if __name__ == "__main__":
    run_stage(main)
