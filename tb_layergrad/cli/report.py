"""`tb-layergrad report LOGDIR`: the tab's anomaly verdicts in a terminal, as JSON or CSV, and for CI.

It reads the event files with TensorBoard's own EventMultiplexer keeping every
step (`reader.event_files.open_provider`), lists series with the reader's catalog
and applies the rules of `reader.anomalies` through `reader.run_anomalies`,
exactly as the plugin's `anomalies` route does: the numbers are the tab's. No
TensorFlow and no pandas needed.

Per run: where it broke, the first step at which anything was non-finite and in
which pass (`reader.origin`, docs/ANOMALIES.md "Where it broke"). Per run and layer
(one target, one source): the norm, RMS and zero fraction at the layer's last logged step, the trend (`trends.trend`), the first step with
a NaN/Inf gradient, the decay of per-timestep gradients for RNN layers
(`trends.timestep_decay`), and the anomaly flags (docs/ANOMALIES.md); for a run with per-example
records, the layers where one example carried most of the gradient at some step (`dominance.dominance`;
in CSV the `dominated_*` columns of the layer's row). The hyperparameters each run was trained with, as
logged with TensorBoard's HParams API (`reader.hparams`): `hparams` of each run in JSON, columns
`hp/<name>` after the others in CSV. `--sort COLUMN` orders by a CSV column.

Exit status: 0; 3 when a `--fail-on` condition holds; 1 when the logdir, a run
or the asked series do not exist; 2 for a usage error.

Three parts, in the order a report is made: what is found (`build`, the command's `main`), how it is
written (text for a person, JSON, and CSV with a row per layer: they only shape a `Report`), and
`--sort COLUMN`: one order for the CSV's rows, the JSON's runs and layers, the text's runs. Why one order
from the CSV: its header is the report's one flat list of names (a layer's statistics, its verdict, and the
run's `hp/<name>` hyperparameters), so a user picks a column they can see. The rows are sorted; runs then
come in the order of their first row. Rules: `COLUMN` ascending, `-COLUMN` descending; empty cells (no
value, NaN) last either way; numbers and booleans compare as numbers, before strings when a column holds
both; ties keep model order (stable).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from tb_layergrad import metadata
from tb_layergrad.reader import anomalies, dominance, event_files, hparams, trends
from tb_layergrad.reader.run_health import default_targets

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
    (`layer_verdicts`), at the step its collapse was first seen.
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
    from tb_layergrad.reader import damage  # when a report is built (`_build`)

    with event_files.tensorflow_free(logdir), damage.checked_once():  # each file's checksums verified once
        return _build(logdir, runs, target, source, fail_on)


def _build(
    logdir: str, runs: Optional[Sequence[str]], target: Optional[str], source: str, fail_on: Sequence[str]
) -> Report:
    # Imported when a report is built, not with this module: every `tb-layergrad` command (`--version` too)
    # builds the parser, which imports this module for its arguments.
    from tensorboard import context as tb_context

    from tb_layergrad.reader import catalog, damage, run_anomalies
    from tb_layergrad.reader.run_source import RunSource

    provider = event_files.open_provider(logdir)
    ctx = tb_context.RequestContext()
    cat = catalog.load(provider, ctx, "")
    said = damage.Scanner(logdir, known=event_files.walked(provider)).said(cat.runs, runs or None)
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


# -- the report's three formats ----------------------------------------------------------------------
LABELS = anomalies.LABELS  # the words of each state, as every reader shows them
WIDTH = 100


def _g(v: Optional[float], spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def shorten(text: str, width: int, path: bool = False) -> str:
    """Fit `text` in `width` columns, marking a cut with "…".

    path=True (layer paths): keep the last segment (the layer's own name) whole when it fits, and as
    much of the start as the rest allows: "encoder/blo…/attention_output". Otherwise keep the start.
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    if path and "/" in text:
        leaf = text[text.rindex("/") + 1 :]
        if len(leaf) + 3 <= width:
            return text[: width - len(leaf) - 2] + "…/" + leaf
        if len(leaf) + 1 <= width:
            return "…" + leaf
        tail = max(1, (2 * width) // 3)
        return text[: width - 1 - tail] + "…" + text[len(text) - tail :]
    return text[: width - 1] + "…"


def _common_model_prefix(layers: Sequence[str]) -> str:
    """'model/' when every layer path starts with the same first segment (the model's name)."""
    firsts = {p.split("/", 1)[0] for p in layers}
    if len(firsts) == 1 and all("/" in p for p in layers):
        return firsts.pop() + "/"
    return ""


def verdict_cell(text: str, width: int) -> str:
    """A verdict's text in `width` columns: whole findings (` · `-separated) while they fit, then how many more
    ("+1": the run's finding lines above name them), cut only when the first alone is too wide."""
    parts = text.split(anomalies.SEPARATOR)
    for keep in range(len(parts), 0, -1):
        more = len(parts) - keep
        cell = anomalies.SEPARATOR.join(parts[:keep]) + (f" +{more}" if more else "")
        if len(cell) <= width:
            return cell
    return shorten(text, width)


def norm_text(s: anomalies.LayerSummary) -> str:
    """The norm at the layer's last step: `nan` when the gradient held a NaN/Inf there (the stored norm
    is that of its finite elements, 0 when there is none: not the gradient's norm)."""
    if s.last_nonfinite:
        return "nan"
    return _g(s.last_norm)


# name, header, width, alignment
_COLUMNS = [
    ("layer", "layer", 28, "<"),
    ("norm", "norm@last", 9, ">"),
    ("trend", "trend", 6, ">"),
    ("zeros", "zeros", 6, ">"),
    ("first", "1st NaN", 8, ">"),
    ("decay", "t-decay", 7, ">"),
]


def run_label(run: str, target: str) -> str:
    """'run gan (target generator)'; the target is named unless it is the default one, `loss`."""
    return f"run {run}" if target == metadata.DEFAULT_TARGET else f"run {run} (target {target})"


def format_text(report: Report, width: int = WIDTH) -> str:
    fixed = 2 + sum(w + 1 for _, _, w, _ in _COLUMNS)
    flags_w = max(10, width - fixed)
    target = report.target or metadata.DEFAULT_TARGET
    named = "" if all(r.target == target for r in report.runs) else "; a run without it: each of its targets, named"
    lines = [
        shorten(f"tb-layergrad report  {report.logdir}  (target {target}, source {report.source})", width),
        "norm@last: L2 norm at the layer's last logged step; trend: log10 change of the norm over the last "
        f"{trends.TREND_WINDOW} logged steps; t-decay: log10(|dL/dh_first| / |dL/dh_last|) of RNN timesteps; "
        f"verdict: docs/ANOMALIES.md; target {target}{named}",
    ]
    lines = [lines[0]] + _wrap(lines[1], width)
    for result in report.runs:
        lines.append("")
        prefix = _common_model_prefix(result.layers)
        summary = result.summary_json()
        span = (
            f"steps {summary['first_step']}–{summary['last_step']} ({summary['steps']} logged)"
            if summary["steps"]
            else "no steps logged"
        )
        n = len(result.layers)
        rows = f"{n} {'weight' if result.source == 'weight' else 'layer'}{'' if n == 1 else 's'}"  # a kernel, a bias
        head = f"{run_label(result.run, result.target)}  ·  {rows}  ·  {span}"
        if prefix:
            head += f"  ·  model {prefix[:-1]}"
        lines.append(shorten(head, width))
        for finding in summary["findings"]:  # the tab's banners, whole (wrapped, not cut: they name layers)
            lines += [
                ("  " if k == 0 else "    ") + part for k, part in enumerate(_wrap(finding["line"], width - 4, ""))
            ]
        latest = {k: v for k, v in result.latest.items() if v}
        if summary["steps"]:
            bits = ", ".join(f"{v} {LABELS[k]}" for k, v in latest.items())
            lines.append(
                shorten(
                    f"  at the latest step ({summary['last_step']}): "
                    + (f"{bits} of {rows}" if bits else "no flagged layer"),
                    width,
                )
            )
        header = "  " + " ".join(f"{h:{a}{w}}" for _, h, w, a in _COLUMNS) + " " + "verdict"
        lines.append(header)
        for s, v in zip(result.summaries, result.verdicts()):
            name = s.layer[len(prefix) :] if prefix and s.layer.startswith(prefix) else s.layer
            cells = {
                "layer": shorten(name, _COLUMNS[0][2], path=True),
                "norm": norm_text(s),
                "trend": _g(s.trend, "+.2f"),
                "zeros": _pct(s.last_zero_frac),
                "first": "-" if s.first_nonfinite_step is None else str(s.first_nonfinite_step),
                "decay": _g(s.timestep_decay, "+.1f"),
            }
            row = "  " + " ".join(f"{shorten(cells[k], w):{a}{w}}" for k, _, w, a in _COLUMNS)
            lines.append(row + " " + verdict_cell(v.text, flags_w))
    for s in report.skipped:
        lines.append("")
        lines.append(shorten(f"run {s['run']}: skipped, {s['reason']}", width))
    for w in report.warnings:  # wrapped, not cut: it says what to do
        lines.append("")
        lines += _wrap(f"warning: {w}", width)
    if report.fail_on:
        lines.append("")
        if report.failures:
            for f in report.failures:
                since = {"nan": "NaN/Inf gradient since step", "vanishing_over_steps": "collapsed from step"}
                what = since.get(f["condition"], f"{f['condition']} at step")
                lines.append(
                    shorten(
                        f"FAIL {f['condition']}: {run_label(f['run'], f['target'])}, layer {f['layer']}: "
                        f"{what} {f['step']}",
                        width,
                    )
                )
        else:
            lines.append(
                "OK: none of " + ", ".join("nan" if k == "nonfinite" else k for k in report.fail_on) + " holds"
            )
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int, indent: str = "  ") -> List[str]:
    """Lines of at most `width` columns, broken at spaces (a longer word is cut), later ones after `indent`."""
    words, lines, cur = text.split(" "), [], ""
    for w in words:
        while len(indent + w) > width:
            w = w[: width - len(indent) - 1] + "…"
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = indent + w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    return lines


def to_json(report: Report) -> dict:
    """The report as JSON; each run with its `hparams` (`{name: value}`, a NaN value as null)."""
    layer_order = _layer_order(report)
    return {
        "logdir": report.logdir,
        "target": report.target,
        "source": report.source,
        "format_version": metadata.FORMAT_VERSION,
        "thresholds": dict(anomalies.THRESHOLDS),
        "trend_window": trends.TREND_WINDOW,
        "runs": [
            {**_run_json(r, layer_order.get(id(r))), "hparams": hparams.json_values(report.hparams.get(r.run, {}))}
            for r in _sorted_runs(report).runs
        ],
        "sort": report.sort,
        "skipped": report.skipped,
        "fail_on": ["nan" if k == "nonfinite" else k for k in report.fail_on],
        "failures": report.failures,
        "warnings": report.warnings,
    }


def _run_json(r: anomalies.RunAnomalies, layers: Optional[List[int]] = None) -> dict:
    """One run; `dominated` (docs/ANOMALIES.md, "One example dominates") only for a run with per-example records.

    `layers`: the indexes of its layers in the order to list them (`--sort`); None: model order."""
    indexes = range(len(r.summaries)) if layers is None else layers
    out = {
        "run": r.run,
        "target": r.target,
        "source": r.source,
        "summary": r.summary_json(),
        "layers": [r.layer_json(i) for i in indexes],
    }
    if r.dominated is not None:
        out["dominated"] = [d.to_json() for d in r.dominated]
        out["example_thresholds"] = dict(dominance.EXAMPLE_THRESHOLDS)
    return out


# The `dominated` condition (docs/ANOMALIES.md, "One example dominates"): `dominated_<key>` is
# `runs[].dominated[].<key>` of --format json. Appended after the flag counts so that the columns before it
# keep their indexes for existing consumers.
DOMINATED_FIELDS = ("steps", "first_step", "worst_step", "worst_share", "worst_position", "examples")

# Appended after them, so that earlier columns keep their indexes: the layer's state (docs/ANOMALIES.md, "One
# verdict"), its NaN/Inf count at the last step, how far its gradient fell over the run ("Vanishing over steps").
AFTER_DOMINATED = ("verdict", "last_nonfinite", "step_decay")

CSV_COLUMNS = (
    "run",
    "target",
    "source",
    "layer",
    "index",
    "recorded",
    "last_step",
    "last_norm",
    "last_rms",
    "last_zero_frac",
    "trend",
    "first_nonfinite",
    "timestep_decay",
    "nonfinite_steps",
    "vanishing_steps",
    "exploding_steps",
    "dead_steps",
    "now",
    *(f"dominated_{k}" for k in DOMINATED_FIELDS),
    *AFTER_DOMINATED,
)


def _csv_cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    return str(v)


def _summary_cells(r: anomalies.RunAnomalies, s: anomalies.LayerSummary) -> list:
    """A layer's statistics and flag counts: the columns up to `now`."""
    return [
        r.run,
        r.target,
        r.source,
        s.layer,
        s.index,
        s.recorded,
        s.last_step,
        s.last_norm,
        s.last_rms,
        s.last_zero_frac,
        s.trend,
        s.first_nonfinite_step,
        s.timestep_decay,
        s.counts["nonfinite"],
        s.counts["vanishing"],
        s.counts["exploding"],
        s.counts["dead"],
        ";".join(s.now_names),
    ]


def _dominated_cells(r: anomalies.RunAnomalies, d: Optional[dominance.Dominance]) -> list:
    """The `dominated_*` columns of one layer.

    All empty when the run has no per-example records (nothing could be said; JSON leaves `dominated` out),
    so that a filter on `dominated_steps > 0` tells "not dominated" (0) from "not known" (empty).
    """
    if d is not None:
        return [getattr(d, k) for k in DOMINATED_FIELDS]
    return [None if r.dominated is None else 0] + [None] * (len(DOMINATED_FIELDS) - 1)


def _csv_rows(r: anomalies.RunAnomalies) -> List[list]:
    """One row per layer (model order), its dominance on the same row so that a row stays a layer."""
    by_layer = {d.layer: d for d in r.dominated or ()}
    rows = [
        _summary_cells(r, s)
        + _dominated_cells(r, by_layer.pop(s.layer, None))
        + [v.state, s.last_nonfinite, s.step_decay]
        for s, v in zip(r.summaries, r.verdicts())
    ]
    # Per-example records of a layer without statistics: still a row, as --fail-on dominated names it.
    blank = [None] * (len(CSV_COLUMNS) - 4 - len(DOMINATED_FIELDS) - len(AFTER_DOMINATED))
    after = [None] * len(AFTER_DOMINATED)
    rows += [[r.run, r.target, r.source, d.layer, *blank, *_dominated_cells(r, d), *after] for d in by_layer.values()]
    return rows


def csv_header(report: Report) -> Tuple[str, ...]:
    """`CSV_COLUMNS`, then `hp/<name>` for every hyperparameter of any reported run, sorted by name."""
    return CSV_COLUMNS + tuple(hparams.column(n) for n in hparams.names(report.hparams))


def _table(report: Report) -> List[Tuple[anomalies.RunAnomalies, Optional[int], list]]:
    """(run, index of the layer's summary or None, cells of `csv_header`) per CSV row, in `report.sort`'s order."""
    names = hparams.names(report.hparams)
    table = []
    for r in report.runs:
        values = report.hparams.get(r.run, {})
        cells = [values.get(n) for n in names]
        table += [(r, i if i < len(r.summaries) else None, row + cells) for i, row in enumerate(_csv_rows(r))]
    if report.sort:
        table = [table[i] for i in order([row for _, _, row in table], csv_header(report), report.sort)]
    return table


def _sorted_runs(report: Report) -> Report:
    """`report` with its runs in the order of their first row in `report.sort`'s order (itself when unsorted)."""
    if not report.sort:
        return report
    runs = {id(r): r for r, _, _ in _table(report)}
    return dataclasses.replace(report, runs=list(runs.values()) + [r for r in report.runs if id(r) not in runs])


def _layer_order(report: Report) -> Dict[int, List[int]]:
    """{id of a (run, target) result: its layers' summary indexes in `report.sort`'s order}; empty when unsorted."""
    out: Dict[int, List[int]] = {}
    for r, i, _ in _table(report) if report.sort else ():
        if i is not None:
            out.setdefault(id(r), []).append(i)
    return out


def format_csv(report: Report) -> str:
    """Columns: `csv_header(report)` (README, "In a terminal, in CI, in a notebook"); a float that is not finite
    is empty; rows in `report.sort`'s order."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(csv_header(report))
    w.writerows([_csv_cell(v) for v in row] for _, _, row in _table(report))
    return buf.getvalue()


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_json(report), indent=1, allow_nan=False) + "\n"
    if fmt == "csv":
        return format_csv(report)
    return format_text(_sorted_runs(report))


# -- --sort COLUMN ----------------------------------------------------------------------------------
def split_sort(text: str) -> Tuple[str, bool]:
    """'-last_norm' -> ('last_norm', True); 'hp/lr' -> ('hp/lr', False).

    Example:

        split_sort("-hp/learning_rate")  # ("hp/learning_rate", True)
    """
    if text.startswith("-"):
        return text[1:], True
    return text, False


def _empty(v: Any) -> bool:
    return v is None or v == "" or (isinstance(v, float) and not math.isfinite(v))


def _key(v: Any) -> Tuple[int, Any]:
    if isinstance(v, (bool, int, float)):
        return (0, float(v))
    return (1, str(v))


def order(rows: Sequence[Sequence[Any]], header: Sequence[str], sort: str) -> List[int]:
    """The indexes of `rows` in `sort`'s order (see the module's rules).

    Args:
      rows: cells, one list per row, in `header`'s order (values before formatting).
      header: the column names.
      sort: a column of `header`, with "-" before it for descending.

    Returns:
      A permutation of `range(len(rows))`.

    Raises:
      ValueError: `sort` names no column of `header` (the message lists them).

    Example:

        order([[1.0], [None], [3.0]], ["x"], "-x")  # [2, 0, 1]
    """
    column, descending = split_sort(sort)
    if column not in header:
        raise ValueError(f"unknown --sort column {column!r}; use one of: {', '.join(header)}")
    j = list(header).index(column)
    present = [i for i, row in enumerate(rows) if not _empty(row[j])]
    present.sort(key=lambda i: _key(rows[i][j]), reverse=descending)
    return present + [i for i, row in enumerate(rows) if _empty(row[j])]
