"""``python -m reasonrl.presets NAME [--params PARAMS] [--apply]``: print a preset as ``dvc exp run`` -S
arguments, or write it into the params file."""

import argparse
import sys

from reasonrl.config import ConfigError
from reasonrl.presets import apply_to_file, available, checked_overrides, set_params_words

EXAMPLES = """examples:
  dvc exp run $(python -m reasonrl.presets cpu)        # the preset as a DVC experiment
  python -m reasonrl.presets cpu --apply && dvc repro  # the preset written into params.yaml (see git diff)"""


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.presets",
        description="Print a parameter preset as `dvc exp run` -S arguments, or write it into the params file.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the examples' lines
    )
    parser.add_argument("name", help=f"one of {available()}")
    parser.add_argument("--params", default="params.yaml", help="the params file (default: %(default)s)")
    parser.add_argument(
        "--apply", action="store_true", help="write the preset's values into --params instead of printing them"
    )
    args = parser.parse_args()
    try:
        overrides = checked_overrides(args.name, args.params)
        if args.apply:
            apply_to_file(overrides, args.params)
        else:
            print("\n".join(set_params_words(overrides)))  # one override a line: $(…) splits at newlines too
    except (ConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
