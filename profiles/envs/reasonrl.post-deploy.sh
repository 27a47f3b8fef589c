#!/usr/bin/env bash
# Snakemake runs this once inside the fresh conda environment, from the workflow directory (the repository root).
# Editable, so the jobs run the repository's current code, as they do from the .venv.
set -euo pipefail
python -m pip install --editable '.[gpu]'
