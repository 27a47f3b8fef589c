"""Stage report: the summary verdict, the run's details, the routes' test accuracy, training curves and example answers
as Markdown and HTML, and the headline metrics file that ``dvc exp show`` opens with.

It reads this run's files only (its deps), and the date, commit and machine it renders on (the page says so): a
cached report describes its own run, never experiments made since. Experiments side by side are
``python -m reasonrl.compare``'s, outside the pipeline.
"""

from pathlib import Path

from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.report.document import write_report
from reasonrl.report.environment import capture_environment
from reasonrl.report.headline import write_headline
from reasonrl.report.page import ReportInputs, build_report


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--reports", required=True, help="the reports directory the other stages wrote")
    parser.add_argument("--out", required=True, help="Markdown report to write")
    parser.add_argument("--html", required=True, help="self-contained HTML report to write")
    parser.add_argument("--figures", required=True, help="directory for the PNG figures")
    parser.add_argument("--headline", required=True, help="headline metrics JSON to write (test accuracy per route, …)")
    args = parser.parse_args()
    load_params(args.params)  # a report of a run with invalid params would mislead
    inputs = ReportInputs(Path(args.reports), Path(args.params), capture_environment())
    report = build_report(inputs)

    write_report(report, args.out, args.html, args.figures)
    write_headline(inputs.reports_dir, Path(args.headline))
    print(f"report: {args.out}, {args.html} ({len(report.figures)} figures in {args.figures})")


if __name__ == "__main__":
    run_stage(main)
