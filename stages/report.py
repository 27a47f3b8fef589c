"""Stage report: the routes' test accuracy, training curves, example rollouts and ablations as Markdown and HTML,
and the headline metrics file that ``dvc exp show`` opens with.

The ablation table lists the DVC experiments of the current commit (``dvc exp show --json``). DVC sets
``DVC_ROOT`` and, in an experiment, ``DVC_EXP_NAME`` for a stage's command; this script is the one place that
reads them. ``DVC_ROOT`` matters for a queued experiment: it runs in a temporary copy of the repository that
holds no other experiment, so the listing has to come from the original repository. Outside DVC (Snakemake, by
hand) the current directory is asked; if it is no DVC repository the report says so and a warning is printed.
"""

import os
import sys
from pathlib import Path

from reasonrl.atomic import atomic_directory, atomic_write_text
from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.report import ReportInputs, build_report
from reasonrl.report.document import render_html, render_markdown
from reasonrl.report.headline import write_headline


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--reports", required=True, help="the reports directory the other stages wrote")
    parser.add_argument("--out", required=True, help="Markdown report to write")
    parser.add_argument("--html", required=True, help="self-contained HTML report to write")
    parser.add_argument("--figures", required=True, help="directory for the PNG figures")
    parser.add_argument("--headline", required=True, help="headline metrics JSON to write (test accuracy per route, …)")
    args = parser.parse_args()
    load_params(args.params)  # a report of a run with invalid params would mislead
    inputs = ReportInputs(
        reports_dir=Path(args.reports),
        params_path=Path(args.params),
        repo_root=Path(os.environ.get("DVC_ROOT") or "."),
        experiment_name=os.environ.get("DVC_EXP_NAME") or None,
    )
    report = build_report(inputs)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)

    figures_prefix = Path(os.path.relpath(args.figures, Path(args.out).parent)).as_posix()
    with atomic_directory(args.figures) as staging:
        for name, png in report.figures.items():
            (staging / name).write_bytes(png)
    atomic_write_text(args.out, render_markdown(report.blocks, figures_prefix))
    atomic_write_text(args.html, render_html(report.blocks, report.figures))
    write_headline(inputs.reports_dir, Path(args.headline))
    print(f"report: {args.out}, {args.html} ({len(report.figures)} figures in {args.figures})")


if __name__ == "__main__":
    run_stage(main)
