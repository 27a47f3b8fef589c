"""Stage download: GSM8K (verified, validated), the synthetic arithmetic set or the user's own jsonl files, all
written in GSM8K's format → ``train/val/test.jsonl``; each of ``eval.test_sets`` and ``eval.benchmarks`` →
``<test-sets>/<name>.jsonl``. Warns of held-out questions that the training data asks too; screens each benchmark for
contamination by the training data (``--benchmarks-summary``)."""

import sys
from functools import partial

from reasonrl.atomic import atomic_write_json
from reasonrl.benchmarks import BENCHMARKS, Tally, benchmark_lines, benchmark_summary, summary_lines
from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.data import given_lines, gsm8k_lines, jsonl_file_lines, resolve_source, write_data
from reasonrl.synthetic import arithmetic_lines


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--out", required=True, help="output directory for train/val/test.jsonl")
    parser.add_argument(
        "--test-sets", required=True, help="output directory for one <name>.jsonl per eval.test_sets and benchmark"
    )
    parser.add_argument(
        "--benchmarks-summary", required=True, help="JSON to write: each benchmark's counts and contaminated questions"
    )
    args = parser.parse_args()
    params = load_params(args.params)
    data, cap = params.data, params.data.max_download_bytes
    if data.name == "arithmetic":
        synthetic = data.arithmetic
        source = f"synthetic arithmetic (seed {synthetic.seed})"
        train, test = (
            partial(
                given_lines,
                arithmetic_lines(size, synthetic.seed * 2 + offset, synthetic.max_steps, synthetic.max_value),
            )
            for offset, size in enumerate((synthetic.train_size, synthetic.test_size))
        )
    elif data.name == "jsonl":
        source = f"{data.jsonl.train.path} and {data.jsonl.test.path}"
        train, test = (
            partial(jsonl_file_lines, file.path, file.sha256, data.jsonl.fields, f"data.jsonl.{split}", cap)
            for split, file in (("train", data.jsonl.train), ("test", data.jsonl.test))
        )
    else:
        source = resolve_source(data.mirror, data.url)
        train, test = (partial(gsm8k_lines, source, data.sha256[split], split, cap) for split in ("train", "test"))
    test_sets = {
        test_set.name: partial(
            jsonl_file_lines, test_set.path, test_set.sha256, test_set.fields, f"eval.test_sets[{index}]", cap
        )
        for index, test_set in enumerate(params.eval.test_sets)
    }
    tallies = {name: Tally() for name in params.eval.benchmarks}
    benchmarks = {
        name: partial(benchmark_lines, BENCHMARKS[name], params.eval.benchmark_mirror, cap, tallies[name])
        for name in params.eval.benchmarks
    }
    written = write_data(
        train, test, test_sets, data.val_size, data.split_seed, args.out, args.test_sets,
        benchmarks, params.eval.decontaminate,
    )  # fmt: skip
    summary = benchmark_summary(tallies, written.contaminated, params.eval.decontaminate)
    atomic_write_json(args.benchmarks_summary, summary)
    print(f"{data.name} from {source}: " + ", ".join(f"{split} {count}" for split, count in written.counts.items()))
    for line in summary_lines(summary):
        print(line)
    for held_out, count in written.in_train.items():
        if count:
            print(
                f"warning: {count} of the {written.counts[held_out]} {held_out} questions are asked in the train file "
                "too (compared ignoring case and spacing): their scores measure recall more than reasoning",
                file=sys.stderr,
            )


if __name__ == "__main__":
    run_stage(main)
