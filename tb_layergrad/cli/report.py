"""`tb-layergrad report LOGDIR`: the tab's anomaly verdicts in a terminal, as JSON or CSV, and for CI.

It reads the event files with TensorBoard's own EventMultiplexer keeping every
step (`reader.event_files.open_provider`), lists series with the reader's catalog
and applies the rules of `reader.anomalies` through `reader.run_anomalies`,
exactly as the plugin's `anomalies` route does: the numbers are the tab's. No
TensorFlow and no pandas needed.

Per run: where it broke, the first step at which anything was non-finite and in
which pass (`reader.origin`, docs/ANOMALIES.md "Where it broke"). Per run and layer
(one target, one source): the norm, RMS and zero fraction at the layer's last logged step, the trend (`anomalies.trend`), the first step with
a NaN/Inf gradient, the decay of per-timestep gradients for RNN layers
(`anomalies.timestep_decay`), and the anomaly flags (docs/ANOMALIES.md); for a run with per-example
records, the layers where one example carried most of the gradient at some step (`anomalies.dominance`;
in CSV the `dominated_*` columns of the layer's row). The hyperparameters each run was trained with, as
logged with TensorBoard's HParams API (`reader.hparams`): `hparams` of each run in JSON, columns
`hp/<name>` after the others in CSV. `--sort COLUMN` orders by a CSV column (`report_sort`).

Exit status: 0; 3 when a `--fail-on` condition holds; 1 when the logdir, a run
or the asked series do not exist; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, TextIO

from tb_layergrad import metadata
from tb_layergrad.cli.report_format import (  # noqa: F401 - the report's formats, under its names
    CSV_COLUMNS,
    DOMINATED_FIELDS,
    csv_header,
    format_csv,
    format_text,
    render,
    run_label,
    split_sort,
    to_json,
)
from tb_layergrad.reader import anomalies, event_files, hparams
from tb_layergrad.reader.run_health import default_targets  # noqa: F401 - the report's choice, under its name

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_FAILED = 3

# --fail-on names -> flag kind ("nan" is the short name of "nonfinite").
FAIL_ON = {
    "nan": "nonfinite",
    "nonfinite": "nonfinite",
    "exploding": "exploding",
    "vanishing": "vanishing",
    "dead": "dead",
    "dominated": "dominated",
    "vanishing_over_steps": "vanishing_over_steps",
}


class ReportError(Exception):
    """Nothing to report on (no logdir, unknown run, no such series): exit 1."""


@dataclasses.dataclass
class Report:
    logdir: str
    target: Optional[str]  # None: each run's own (`default_targets`)
    source: str
    runs: List[anomalies.RunAnomalies]
    skipped: List[Dict[str, str]]  # runs (and targets) without stats for (target, source)
    fail_on: List[str]
    failures: List[Dict[str, object]]
    # Damaged event files (`reader.damage`: which run, file, up to which step read), then the catalog's (series
    # skipped: a newer format...).
    warnings: List[str] = dataclasses.field(default_factory=list)
    hparams: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)  # run -> reader.hparams values
    sort: Optional[str] = None  # a column of `csv_header(report)`, "-" before it for descending

    @property
    def failed(self) -> bool:
        return bool(self.failures)


def parse_fail_on(text: Optional[str]) -> List[str]:
    """'nan,exploding' -> ['nonfinite', 'exploding'] (ValueError on an unknown name)."""
    if not text:
        return []
    kinds: List[str] = []
    for name in text.split(","):
        name = name.strip().lower()
        if not name:
            continue
        if name not in FAIL_ON:
            raise ValueError(
                f"unknown --fail-on condition {name!r}; use some of: nan, exploding, vanishing, dead, dominated, "
                "vanishing_over_steps"
            )
        if FAIL_ON[name] not in kinds:
            kinds.append(FAIL_ON[name])
    return kinds


def failures_of(run: anomalies.RunAnomalies, fail_on: Sequence[str]) -> List[Dict[str, object]]:
    """Which `fail_on` conditions hold in a run.

    nonfinite: a layer had a NaN/Inf gradient at any logged step. exploding, vanishing,
    dead: a layer is flagged so at its last logged step (a transient flag earlier in
    training does not fail a build; the counts are in the report). vanishing_over_steps: a layer's verdict
    (`reader.verdict`), at the step its collapse was first seen.
    """
    out: List[Dict[str, object]] = []
    for kind in fail_on:
        if kind == "dominated":  # one example carried most of a layer's gradient at some step (its worst named)
            out += [_failure(run, d.layer, kind, d.worst_step) for d in run.dominated or ()]
            continue
        if kind == "vanishing_over_steps":
            out += [_failure(run, l, kind, v.step) for l, v in zip(run.layers, run.verdicts()) if v.state == kind]
            continue
        for s in run.summaries:
            if kind == "nonfinite":
                if s.first_nonfinite_step is not None:
                    out.append(_failure(run, s.layer, "nan", s.first_nonfinite_step))
            elif kind in s.now_names:
                out.append(_failure(run, s.layer, kind, s.last_step))
    return out


def _failure(run: anomalies.RunAnomalies, layer: str, condition: str, step: Optional[int]) -> Dict[str, object]:
    return {"run": run.run, "target": run.target, "layer": layer, "condition": condition, "step": step}


def build(
    logdir: str,
    runs: Optional[Sequence[str]] = None,
    target: Optional[str] = None,
    source: str = metadata.SOURCE_OUTPUT,
    fail_on: Sequence[str] = (),
) -> Report:
    """Read `logdir` (every step) and evaluate the rules for each run (without importing TensorFlow).

    `target=None`: each run's `default_targets` (`loss`, or every target of a run without one).
    """
    if not event_files.is_url(logdir) and not os.path.isdir(logdir):
        raise ReportError(f"no such directory: {logdir}")
    with event_files.tensorflow_free(logdir):
        return _build(logdir, runs, target, source, fail_on)


def _build(
    logdir: str, runs: Optional[Sequence[str]], target: Optional[str], source: str, fail_on: Sequence[str]
) -> Report:
    from tensorboard import context as tb_context

    from tb_layergrad.reader import catalog, damage, run_anomalies
    from tb_layergrad.reader.run_source import RunSource

    provider = event_files.open_provider(logdir)
    ctx = tb_context.RequestContext()
    cat = catalog.load(provider, ctx, "")
    said = damage.Scanner(logdir).said(cat.runs, runs or None)
    damaged = [d.line() for run in sorted(said) for d in said[run]]  # files read up to a fault: said first
    if not cat.runs:
        raise ReportError(f"no tb_layergrad data under {logdir}" + "".join(f"; {w}" for w in damaged + cat.warnings))
    names = list(cat.runs) if not runs else list(dict.fromkeys(runs))
    unknown = [r for r in names if r not in cat.runs]
    if unknown:
        raise ReportError(f"run(s) not found: {', '.join(unknown)}; the logdir has: {', '.join(cat.runs)}")
    results, skipped, failures = [], [], []
    for name in names:
        rc = cat.runs[name]
        src = RunSource(provider, ctx, "", rc)
        for t in [target] if target is not None else default_targets(rc.targets()):
            result = run_anomalies.read_run(src, t, source)
            if result is None:
                skipped.append(
                    {
                        "run": name,
                        "reason": f"no {source} statistics for target {t!r} "
                        f"(targets: {', '.join(rc.targets())}; sources: {', '.join(rc.sources())})",
                    }
                )
                continue
            result.dominated = run_anomalies.read_dominance(src, t, source)
            results.append(result)
            failures += failures_of(result, fail_on)
    if not results:
        raise ReportError("; ".join(f"run {s['run']}: {s['reason']}" for s in skipped))
    values = hparams.by_run(provider, ctx, "", [r.run for r in results])
    return Report(logdir, target, source, results, skipped, list(fail_on), failures, damaged + cat.warnings, values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logdir", help="TensorBoard log directory (runs are its subdirectories holding event files)")
    parser.add_argument("--run", action="append", metavar="R", help="only this run (repeat for several; default: all)")
    parser.add_argument(
        "--format", choices=("text", "json", "csv"), default="text", help="output format (default: %(default)s)"
    )
    parser.add_argument(
        "--fail-on",
        metavar="LIST",
        default="",
        help="comma-separated conditions that make the exit status 3: nan (a NaN/Inf gradient at any "
        "step), exploding, vanishing, dead (flagged at a layer's last logged step), dominated "
        "(one example carried most of a layer's gradient at some step; per-example records), "
        "vanishing_over_steps (a layer's gradient fell 100-fold over the run while the loss did not fall by half)",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="differentiated scalar (default: loss; a run without a loss target, e.g. a custom train_step's "
        "named tapes: each of its targets)",
    )
    parser.add_argument(
        "--source",
        choices=metadata.SOURCES,
        default=metadata.SOURCE_OUTPUT,
        help="output: gradients w.r.t. layer outputs; weight: w.r.t. variables (default: %(default)s)",
    )
    parser.add_argument(
        "--sort",
        metavar="COLUMN",
        help="order by a CSV column (e.g. last_norm, first_nonfinite, hp/learning_rate); descending: "
        "--sort=-COLUMN (with '=', so that the '-' is not read as an option); empty cells last. Orders the CSV's "
        "rows, the JSON's runs and their layers, the text's runs (default: runs by name, layers in model order)",
    )


def main(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        fail_on = parse_fail_on(args.fail_on)
    except ValueError as e:
        err.write(f"tb-layergrad report: {e}\n")
        return 2
    try:
        report = build(args.logdir, args.run, args.target, args.source, fail_on)
    except ReportError as e:
        err.write(f"tb-layergrad report: {e}\n")
        return EXIT_ERROR
    if getattr(args, "sort", None):
        column, _ = split_sort(args.sort)
        if column not in csv_header(report):
            err.write(
                f"tb-layergrad report: unknown --sort column {column!r}; use one of: "
                f"{', '.join(csv_header(report))} (descending: --sort=-COLUMN)\n"
            )
            return 2
        report.sort = args.sort
    out.write(render(report, args.format))
    out.flush()
    if args.format == "csv":  # no place for them in the table
        for w in report.warnings:
            err.write(f"tb-layergrad report: warning: {w}\n")
    if report.failed:
        if args.format != "text":
            for f in report.failures:
                err.write(
                    f"FAIL {f['condition']}: {run_label(f['run'], f['target'])}, layer {f['layer']}, step {f['step']}\n"
                )
        return EXIT_FAILED
    return EXIT_OK
