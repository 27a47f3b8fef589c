"""Stage prepare_model: the base model (hub id, local directory, or the tiny model) → ``models/base``. The tiny
model's tokenizer carries a chat template when one of the run's prompts is a chat prompt."""

from pathlib import Path

from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import load_gsm8k
from reasonrl.models import prepare_base_model
from reasonrl.prompts import load_prompt


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--data", required=True, help="directory with train.jsonl (the tiny tokenizer learns it)")
    parser.add_argument("--out", required=True, help="output model directory")
    args = parser.parse_args()
    params = load_params(args.params)
    model, train = params.model, load_gsm8k(Path(args.data) / "train.jsonl")
    chat = any(load_prompt(name).is_chat for name in params.prompt_names)
    source = prepare_base_model(model.name, model.tiny, model.seed, train, Path(args.out), chat)
    print(f"base model in {args.out}: {source}")


if __name__ == "__main__":
    run_stage(main)
