"""``python -m reasonrl.presets NAME [--apply PARAMS]``: print a preset as ``dvc exp run`` -S arguments, or write
it into a params file."""

import argparse
import sys

from reasonrl.config import ConfigError
from reasonrl.presets import apply_to_file, as_set_params, available, checked_overrides


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m reasonrl.presets", description=__doc__)
    parser.add_argument("name", help=f"one of {available()}")
    parser.add_argument("--params", default="params.yaml", help="params file the preset is checked against")
    parser.add_argument("--apply", action="store_true", help="write the preset into --params instead of printing")
    args = parser.parse_args()
    try:
        overrides = checked_overrides(args.name, args.params)
    except (ConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.apply:
        apply_to_file(overrides, args.params)
    else:
        print(as_set_params(overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
