"""`hpckit project`: the time to train at a scale nobody ran, from the site's measured runs
and the convergence record; and the projection's validation on the published rounds.

    hpckit project --benchmark B --units N --local-batch b --from RUNS...
                   [--epochs-from PATH ...] [--dataset official|runs] [--json FILE]
    hpckit project --validate --published TREE... [--json FILE]

The method is the MLPerf HPC paper's (section 4.1.2, Fig. 2 b-d): in the closed division the
epochs to converge depend on the global batch size B = N x b alone, the time per epoch on
the system, so

    T(N, b) = T_first + T_warmup + E(B) x [ S_train / X(N, b) + k_eval x S_eval / (N x x_eval) + T_other ]

* E(B): the convergence record's curve (hpckit/results/analysis.py EpochCurve; the shipped
  record of the published rounds, or the converged runs given with --epochs-from), its
  p10/p50/p90 giving the projection's;
* X(N, b), the system record, from the --from runs (converged or step-capped, any unit
  counts and local batches): one step of b samples per unit takes
      t(N, b) = (t0 + t1 x b) x (1 + c x log2 N)
  t0 a fixed cost per step, t1 the cost per sample, c the loss of efficiency per doubling
  of the units (the all-reduce, stragglers); X = N x b / t. Fitted by least squares on the
  runs' relative step times; a parameter the runs cannot determine (one local batch: t0 =
  0; one unit count: c = 0) is fixed and the output says so;
* evaluation: the runs' evaluations per epoch k_eval, and the per-unit eval throughput
  x_eval of the runs at the unit count nearest N, taken to scale with the units; of that
  time, the share the runs' clocks spent on it (all of it where the evaluations block the
  training; where they run beside it, only what the training waited for: timeline.py);
* T_first (run_start to the first epoch: staging and set-up inside the clock), the warm-up
  (the first epoch's time beyond a steady one's) and the time per epoch in neither training
  nor evaluation (a steady cycle less both): medians of the runs at the unit count nearest
  N, not scaled; the throughput X is that of the epochs after the first;
* S_train, S_eval: the runs' dataset (--dataset runs) or the official one (--dataset
  official, the default: the record's latest dataset of the benchmark);
* OpenFold counts no epochs: E is the fraction of an epoch to converge (its samples to
  converge over train_samples), X its cycles' samples over their training time, k_eval and
  T_other follow the train/eval cycles an epoch holds at N x b (its runs' steps per cycle).

Validation (--validate), on data nobody tuned to: every published closed set of CosmoFlow,
DeepCAM, OC20 and OpenFold is predicted from its own runs' first epochs and the convergence
record of the OTHER submitters (every point of the submitter left out, whatever round: `LBNL` and
`HPE+LBNL` are one). Per run: T = (run_start to the first epoch) + the first epoch's cycle
+ (E - 1) x the median cycle of epochs 2 to 4 (a cycle: one epoch_start to the next,
evaluations included; OpenFold, which counts no epochs: E is its samples to converge over
train_samples, a fraction of an epoch, in cycles E x train_samples / the samples between its
evaluations, plus the cycle a run whose evaluation runs beside the training trains while its
last evaluation runs). A strong set's figure is the olympic mean of its runs' predictions,
as its score; a weak set's the latest predicted stop of its M instances, each at the epochs
of the slowest of M runs of one set (EpochCurve.slowest_of: the curve times the within-set
spread's p(M / (M + 1)); the instances share their hyper-parameters). The error is predicted /
measured - 1 on the same runs; `epochs known` is the error had E been the set's own median
(what is left is the time model's), separating the two sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hpckit.common.errors import KitError
from hpckit.common.fileio import output_file
from hpckit.common.inputs import cli_int
from hpckit.results.analysis import (KIT_BENCHMARKS, EpochCurve, RunFacts, fit_epochs, gather, load_record,
                                     median, record_points, same_submitter)

MAX_UNITS = 10 ** 8          # --units: a hundred million accelerators
MAX_LOCAL_BATCH = 10 ** 6    # --local-batch
WARMUP_CYCLES = 1            # epochs left out of the measured epoch time (validation)
MEASURED_CYCLES = 3          # epochs after the warm-up whose median cycle is the epoch time


def add_arguments(p) -> None:
    p.add_argument("--benchmark", choices=KIT_BENCHMARKS, help="the benchmark to project")
    # bounded: N x b is a global batch a float carries exactly, far beyond any machine
    p.add_argument("--units", type=cli_int(1, MAX_UNITS), help="compute units (accelerators; CPU: ranks) to project to")
    p.add_argument("--local-batch", type=cli_int(1, MAX_LOCAL_BATCH),
                   help="samples per unit per step at the projected scale")
    p.add_argument("--from", dest="from_runs", nargs="+", default=[], metavar="RUN",
                   help="the site's measured runs (kit output directories or logs; step-capped runs count): "
                        "the system record")
    p.add_argument("--epochs-from", nargs="+", default=[], metavar="PATH",
                   help="converged runs or result trees whose epochs make the convergence record "
                        "(default: the record of the published rounds shipped with the kit)")
    p.add_argument("--record", metavar="FILE", help="a convergence record written by `hpckit analyze --record`")
    p.add_argument("--dataset", choices=("official", "runs"), default=None,
                   help="the dataset projected: the official one (default without --epochs-from) or the "
                        "--from runs' own (default with --epochs-from)")
    p.add_argument("--validate", action="store_true",
                   help="instead: predict every published set of --published from its first epochs and the "
                        "other submitters' record, and print the errors")
    p.add_argument("--published", nargs="+", action="extend", default=[], metavar="PATH",
                   help="with --validate: the published result trees")
    p.add_argument("--json", metavar="FILE", type=output_file("--json"),
                   help="also write the projection (or the validation) as JSON (a new file)")


# ---- the system record -----------------------------------------------------------------

@dataclass
class SystemModel:
    t0: float            # s per step, fixed
    t1: float            # s per sample per unit
    c: float             # efficiency loss per doubling of the units
    fixed: list          # what the runs could not determine, said as such
    points: list         # (units, local batch, measured samples/s, model samples/s, run)

    def step_s(self, units: int, local_batch: float) -> float:
        return (self.t0 + self.t1 * local_batch) * (1.0 + self.c * math.log2(max(units, 1)))

    def throughput(self, units: int, local_batch: float) -> float:
        return units * local_batch / self.step_s(units, local_batch)

    def describe(self) -> str:
        return (f"t(N, b) = ({self.t0:.4g} s + {self.t1:.4g} s x b) x (1 + {self.c:.3g} log2 N)"
                + (f"; fixed: {', '.join(self.fixed)}" if self.fixed else ""))


def fit_system(runs: list[RunFacts]) -> SystemModel:
    pts = [(f.compute_units, f.local_batch, f.steady_throughput, f) for f in runs
           if f.compute_units and f.local_batch and f.steady_throughput]
    if not pts:
        raise KitError("--from: no run with an epoch's throughput, compute units and global batch size "
                       "(a run needs at least one whole epoch)")
    n = np.array([p[0] for p in pts], dtype=float)
    b = np.array([p[1] for p in pts], dtype=float)
    t = n * b / np.array([p[2] for p in pts])            # measured seconds per step
    fixed = []
    two_b = np.unique(b).size >= 2
    two_n = np.unique(n).size >= 2
    if not two_b:
        fixed.append(f"t0 = 0 (one local batch measured, {b[0]:g}: throughput per unit taken as independent of b)")
    if not two_n:
        fixed.append(f"c = 0 (one unit count measured, {n[0]:g}: no loss of efficiency with more units assumed)")

    def solve(c):
        scale = 1.0 + c * np.log2(n)
        y = t / scale
        if two_b:
            a = np.vstack([np.ones_like(b), b]).T
            (t0, t1), *_ = np.linalg.lstsq(a / t[:, None], y / t, rcond=None)   # relative errors
            if t0 < 0 or t1 <= 0:
                t0, t1 = 0.0, float(np.median(y / b))
        else:
            t0, t1 = 0.0, float(np.median(y / b))
        err = float(np.sum(((t0 + t1 * b) * scale / t - 1.0) ** 2))
        return err, t0, t1

    best = (math.inf, 0.0, 0.0, 0.0)
    for c in (np.linspace(0.0, 2.0, 401) if two_n else [0.0]):
        err, t0, t1 = solve(c)
        if err < best[0]:
            best = (err, t0, t1, float(c))
    _, t0, t1, c = best
    model = SystemModel(t0=float(t0), t1=float(t1), c=c, fixed=fixed, points=[])
    model.points = [(int(p[0]), p[1], p[2], model.throughput(p[0], p[1]), p[3].name) for p in pts]
    return model


def _nearest(runs: list[RunFacts], units: int) -> list[RunFacts]:
    """The runs at the unit count nearest `units` (on a log scale): where evaluation and the
    time to the first epoch are taken from (they are not modelled across unit counts)."""
    have = [f for f in runs if f.compute_units]
    if not have:
        return runs
    best = min(abs(math.log(f.compute_units / units)) for f in have)
    return [f for f in have if abs(math.log(f.compute_units / units)) == best]


def _cycles_per_epoch(runs: list[RunFacts], s_train: float, batch: float) -> float | None:
    """For runs whose logs count no epochs (OpenFold): the train/eval cycles an epoch of
    s_train samples holds at global batch `batch`, the cycles being as many steps as the
    runs' (their samples between evaluations over their global batch); None for the others."""
    steps = [float(np.median([x for x in f.interval_samples if x])) / f.global_batch_size for f in runs
             if f.no_epochs and f.global_batch_size and any(f.interval_samples)]
    return s_train / (float(np.median(steps)) * batch) if steps and s_train and batch else None


# ---- the projection --------------------------------------------------------------------

def _record(args, benchmark: str):
    """(points, where they came from) of the convergence record to use."""
    if args.epochs_from:
        seen: set = set()
        sets, facts = gather(args.epochs_from, "site", seen)
        return record_points(sets, facts), f"converged runs of {', '.join(args.epochs_from)}"
    points, meta = load_record(args.record)
    src = args.record or "the kit's record of the published rounds"
    return points, f"{src} ({', '.join(meta.get('sources', []))})"


@dataclass
class Projector:
    """Everything a projection of one benchmark rests on: the site's runs and their system
    model, the convergence curve and the dataset projected (`hpckit project` and the
    report's map, hpckit/results/report.py, use the same)."""
    benchmark: str
    runs: list
    system: SystemModel
    curve: EpochCurve
    dataset: str
    s_train: float
    s_eval: float | None
    source: str

    @classmethod
    def build(cls, benchmark: str, runs: list[RunFacts], points: list, source: str,
              dataset_mode: str = "official") -> "Projector":
        runs_given = runs
        runs = [f for f in runs if str(f.log.benchmark).lower() == benchmark]
        if not runs:
            raise KitError(f"--from: no {benchmark} run among the {len(runs_given)} runs given")
        system = fit_system(runs)
        if dataset_mode == "runs":
            datasets = sorted({f.dataset for f in runs if f.dataset})
            if len(datasets) != 1:
                raise KitError(f"--from: the runs are of {len(datasets)} datasets ({', '.join(datasets)}); give one")
            dataset = datasets[0]
            s_train = median([f.train_samples for f in runs])
            s_eval = median([f.eval_samples for f in runs])
        else:
            official = [p for p in points if p.benchmark == benchmark and p.dataset.startswith("official/")]
            if not official:
                raise KitError(f"{source}: no published {benchmark} point")
            latest = max(official, key=lambda p: (p.round or "", p.dataset))
            dataset = latest.dataset
            s_train, s_eval = latest.train_samples, latest.eval_samples
        curve = fit_epochs(points, benchmark, dataset)
        if curve is None:
            raise KitError(f"{source}: no converged closed-division {benchmark} run of dataset {dataset}")
        return cls(benchmark, runs, system, curve, dataset, s_train, s_eval, source)

    def time_s(self, n: int, b: float, epochs: float) -> float:
        """Time to train at n units x local batch b, for a given number of epochs."""
        p = self._parts(n, b)
        return p["first_epoch_start"] + p["warmup"] + epochs * (p["epoch"] + p["eval_per_epoch"] + p["other_per_epoch"])

    def _parts(self, n: int, b: float) -> dict:
        near = _nearest(self.runs, n)
        x_eval_unit = median([f.per_unit(f.eval_throughput) for f in near])
        k_eval = median([f.evaluations / f.epochs_to_converge for f in self.runs if f.epochs_to_converge]) or 0.0
        other = median([f.other_per_epoch_s for f in near]) or 0.0
        cycles = _cycles_per_epoch(self.runs, self.s_train, n * b)
        if cycles is not None:
            # OpenFold evaluates every so many steps, not every epoch: its evaluations and gaps
            # per epoch follow the cycles an epoch holds at the projected global batch
            k_eval = cycles * (median([f.evaluations / len(f.cycles_s) for f in self.runs if f.cycles_s]) or 0.0)
            other = cycles * (median([f.other_per_epoch_s / f.cycles_per_epoch for f in near
                                      if f.cycles_per_epoch]) or 0.0)
        # of the evaluations' time, what the clock spends on them: all where they block the
        # training, what the training waited for where they run beside it (timeline.py)
        on_clock = median([f.eval_blocking_fraction for f in near])
        on_clock = 1.0 if on_clock is None else on_clock
        return {"first_epoch_start": median([f.to_first_epoch_s for f in near]) or 0.0,
                "warmup": median([f.warmup_s for f in near]) or 0.0,
                "epoch": self.s_train / self.system.throughput(n, b),
                "eval_per_epoch": k_eval * self.s_eval / (n * x_eval_unit) * on_clock
                if (x_eval_unit and self.s_eval) else 0.0,
                "other_per_epoch": other, "x_eval_unit": x_eval_unit, "k_eval": k_eval}

    def predict(self, n: int, b: int) -> dict:
        batch = n * b
        parts = self._parts(n, b)
        x_eval_unit, k_eval = parts.pop("x_eval_unit"), parts.pop("k_eval")
        x_train = self.system.throughput(n, b)
        e10, e50, e90 = self.curve.quantiles(batch)
        total = [self.time_s(n, b, e) for e in (e10, e50, e90)]
        measured = sorted({(f.compute_units, f.local_batch) for f in self.runs if f.compute_units})
        extrapolated = [w for w, ok in (("units", n <= max(u for u, _ in measured)),
                                        ("local batch", min(lb for _, lb in measured) <= b
                                         <= max(lb for _, lb in measured)))
                        if not ok]
        lo, hi = min(p.global_batch_size for p in self.curve.sets), max(p.global_batch_size for p in self.curve.sets)
        if not lo <= batch <= hi:
            extrapolated.append(f"global batch {batch} outside the record's {lo}-{hi}")
        return {
            "benchmark": self.benchmark, "units": n, "local_batch": b, "global_batch_size": batch,
            "dataset": self.dataset, "train_samples": self.s_train, "eval_samples": self.s_eval,
            "time_to_train_min": {"p10": total[0] / 60, "p50": total[1] / 60, "p90": total[2] / 60},
            "epochs": {"p10": e10, "p50": e50, "p90": e90, "curve": self.curve.describe()},
            "parts_s": {**parts, "train_p50": e50 * parts["epoch"], "eval_p50": e50 * parts["eval_per_epoch"],
                        "other_p50": e50 * parts["other_per_epoch"]},
            "throughput": {"train_samples_per_s": x_train, "per_unit": x_train / n,
                           "eval_samples_per_s_per_unit": x_eval_unit, "evaluations_per_epoch": k_eval},
            "system_model": self.system.describe(), "extrapolated": extrapolated,
            "measured_runs": [{"run": name, "units": u, "local_batch": lb, "samples_per_s": x,
                               "model_samples_per_s": m} for u, lb, x, m, name in self.system.points],
            "convergence_record": {"source": self.source, "sets": len(self.curve.sets),
                                   "submitters": sorted({p.org for p in self.curve.sets}),
                                   "rounds": sorted({p.round for p in self.curve.sets if p.round})},
        }


def project(args) -> dict:
    for name in ("benchmark", "units", "local_batch"):
        if getattr(args, name) is None:
            raise KitError(f"--{name.replace('_', '-')} is required (or --validate)")
    if args.units < 1 or args.local_batch < 1:
        raise KitError(f"--units {args.units} --local-batch {args.local_batch}: both must be positive")
    if not args.from_runs:
        raise KitError("--from RUN... is required: the measured runs the throughput comes from")
    seen: set = set()
    _, facts = gather(args.from_runs, "site", seen)
    points, source = _record(args, args.benchmark)
    projector = Projector.build(args.benchmark, list(facts.values()), points, source,
                                args.dataset or ("runs" if args.epochs_from else "official"))
    return projector.predict(args.units, args.local_batch)


def print_projection(r: dict) -> None:
    t, e, parts = r["time_to_train_min"], r["epochs"], r["parts_s"]
    print(f"{r['benchmark']}: {r['units']} units x local batch {r['local_batch']} = global batch "
          f"{r['global_batch_size']}, dataset {r['dataset']} ({r['train_samples']:.0f} train samples)")
    print(f"  time to train: {t['p50']:.2f} min (p10 {t['p10']:.2f}, p90 {t['p90']:.2f})")
    print(f"  epochs: {_epochs_text(e['p50'])} (p10 {_epochs_text(e['p10'])}, p90 {_epochs_text(e['p90'])}); "
          f"{e['curve']}")
    print(f"  parts at p50: to the first epoch {parts['first_epoch_start']:.1f} s, warm-up {parts['warmup']:.1f} s, "
          f"training {parts['train_p50']:.1f} s ({parts['epoch']:.2f} s per epoch), evaluation "
          f"{parts['eval_p50']:.1f} s, between epochs {parts['other_p50']:.1f} s")
    th = r["throughput"]
    print(f"  throughput: {th['train_samples_per_s']:.4g} samples/s ({th['per_unit']:.4g} per unit); "
          f"{r['system_model']}")
    for m in r["measured_runs"]:
        print(f"  measured: {m['run']}: {m['units']} units x b {m['local_batch']:g}: {m['samples_per_s']:.4g} "
              f"samples/s (model {m['model_samples_per_s']:.4g})")
    cr = r["convergence_record"]
    print(f"  convergence record: {cr['sets']} sets of {len(cr['submitters'])} submitters from {cr['source']}")
    if r["extrapolated"]:
        print(f"  extrapolated beyond what was measured: {'; '.join(r['extrapolated'])}")


# ---- validation on the published rounds ------------------------------------------------

def _olympic(values: list[float]) -> float:
    v = sorted(values)
    return float(np.mean(v[1:-1] if len(v) > 2 else v))


def _predict_run(f: RunFacts, epochs: float | None) -> float | None:
    """run_start to the first epoch, its first cycle, and the rest of the cycles `epochs`
    takes at the median of cycles 2 to 4. OpenFold's epochs are a fraction of its
    train_samples: cycles = epochs x its cycles per epoch (its samples between evaluations),
    and where its evaluation runs beside the training, the run stops one cycle after the one
    it evaluates (the log's cycles beyond those its samples to converge count)."""
    c = f.cycles_s
    per_epoch = f.cycles_per_epoch
    if f.to_first_epoch_s is None or not c or epochs is None or not per_epoch:
        return None
    cycles = epochs * per_epoch
    if f.no_epochs and f.epochs_to_converge:
        cycles += max(0, round(len(c) - f.epochs_to_converge * per_epoch))
    steady = c[WARMUP_CYCLES:WARMUP_CYCLES + MEASURED_CYCLES] or c[:1]
    return f.to_first_epoch_s + c[0] + (cycles - 1.0) * float(np.median(steady))


def validate(sets: list[dict], facts: dict, points: list) -> list[dict]:
    rows = []
    for s in sets:
        fs = [facts[r.path] for _, r in s["runs"] if r.path in facts and facts[r.path].log.converged]
        if not fs or str(s["benchmark"]).lower() not in KIT_BENCHMARKS:
            continue
        g = fs[0]
        if str(g.log.division or "").lower() != "closed" or not g.dataset or not g.global_batch_size:
            continue
        row = {"round": g.round, "benchmark": s["benchmark"].lower(), "org": s["org"], "system": s["platform"],
               "scaling": s["score"]["kind"], "global_batch_size": int(g.global_batch_size), "runs": len(fs),
               "dataset": g.dataset}
        # what a row that cannot be predicted still says: the measured figure, the olympic mean
        # of the converged runs (the set's unscaled score; a weak set's time_to_train_all)
        if row["scaling"] == "weak":
            measured = (max(f.log.run_stop_ms for f in fs) - min(f.log.run_start_ms for f in fs)) / 60000.0
        else:
            measured = _olympic([f.total_s for f in fs]) / 60
        others = [p for p in points if not same_submitter(p.org, str(s["org"]))]
        curve: EpochCurve | None = fit_epochs(others, row["benchmark"], g.dataset, bootstrap=False)
        if curve is None:
            row.update(skipped="no other submitter's closed run of this dataset", measured_min=measured)
            rows.append(row)
            continue
        weak = row["scaling"] == "weak"
        e_pred = curve.slowest_of(row["global_batch_size"], len(fs)) if weak else curve.at(row["global_batch_size"])
        e_own = median([f.epochs_to_converge for f in fs])
        preds = [(_predict_run(f, e_pred), _predict_run(f, e_own), f) for f in fs]
        preds = [p for p in preds if p[0] is not None]
        if not preds:
            row.update(skipped="no epoch_start events to time", measured_min=measured)
            rows.append(row)
            continue
        if weak:
            start = min(f.log.run_start_ms for _, _, f in preds)
            actual = (max(f.log.run_stop_ms for _, _, f in preds) - start) / 1000.0
            pred = max(p + (f.log.run_start_ms - start) / 1000.0 for p, _, f in preds)
            known = max(k + (f.log.run_start_ms - start) / 1000.0 for _, k, f in preds)
        else:
            actual = _olympic([f.total_s for _, _, f in preds])
            pred = _olympic([p for p, _, _ in preds])
            known = _olympic([k for _, k, _ in preds])
        lo, hi = min(p.global_batch_size for p in curve.sets), max(p.global_batch_size for p in curve.sets)
        row.update(record_batches=f"{lo}-{hi}", outside_record=not lo <= row["global_batch_size"] <= hi)
        row["record_submitters"] = sorted({p.org for p in curve.sets})
        row.update(predicted_min=pred / 60, measured_min=actual / 60, error=pred / actual - 1.0,
                   error_epochs_known=known / actual - 1.0, epochs_predicted=e_pred, epochs_median=e_own,
                   record_sets=len(curve.sets), record=curve.describe())
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per benchmark and round (and all rounds): sets, median and p90 of |error|, worst."""
    done = [r for r in rows if "error" in r]
    groups = {}
    for r in done:
        for key in ((r["benchmark"], r["round"] or "?"), (r["benchmark"], "all")):
            groups.setdefault(key, []).append(r)
    out = []
    for (bench, rnd), rs in sorted(groups.items()):
        errs = np.abs([r["error"] for r in rs])
        known = np.abs([r["error_epochs_known"] for r in rs])
        worst = max(rs, key=lambda r: abs(r["error"]))
        out.append({"benchmark": bench, "round": rnd, "sets": len(rs), "median_abs_error": float(np.median(errs)),
                    "p90_abs_error": float(np.quantile(errs, 0.9)),
                    "median_abs_error_epochs_known": float(np.median(known)), "worst": worst})
    return out


def _epochs_text(e: float, spec: str = ".1f") -> str:
    """Epochs as the tables print them (`spec`); a fraction of an epoch (OpenFold's) to 3 digits."""
    return f"{e:.3g}" if e < 1 else format(e, spec)


def _worst_text(w: dict) -> str:
    return (f"{w['org']} {w['system']} ({w['scaling']}, B {w['global_batch_size']}): {w['error']:+.0%}, "
            f"epochs {_epochs_text(w['epochs_predicted'])} predicted, {_epochs_text(w['epochs_median'], 'g')} run"
            + (f" (B outside the other submitters' {w['record_batches']})" if w["outside_record"] else ""))


def print_validation(rows: list[dict], summary: list[dict]) -> None:
    print("| round | benchmark | submitter | system | scaling | B | predicted min | measured min | error | "
          "epochs predicted / run | error, epochs known |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            measured = f"{r['measured_min']:.2f}" if "measured_min" in r else "-"
            print(f"| {r['round']} | {r['benchmark']} | {r['org']} | {r['system']} | {r['scaling']} | "
                  f"{r['global_batch_size']} | - | {measured} | skipped: {r['skipped']} | | |")
            continue
        print(f"| {r['round']} | {r['benchmark']} | {r['org']} | {r['system']} | {r['scaling']} | "
              f"{r['global_batch_size']} | {r['predicted_min']:.2f} | {r['measured_min']:.2f} | {r['error']:+.1%} | "
              f"{_epochs_text(r['epochs_predicted'])} / {_epochs_text(r['epochs_median'], 'g')}"
              f"{' (B outside ' + r['record_batches'] + ')' if r['outside_record'] else ''} | "
              f"{r['error_epochs_known']:+.1%} |")
    print()
    print("| benchmark | round | sets | median abs error | p90 abs error | median abs error, epochs known | worst |")
    print("|---|---|---|---|---|---|---|")
    for g in summary:
        print(f"| {g['benchmark']} | {g['round']} | {g['sets']} | {g['median_abs_error']:.1%} | "
              f"{g['p90_abs_error']:.1%} | {g['median_abs_error_epochs_known']:.1%} | {_worst_text(g['worst'])} |")


def main(args) -> int:
    from hpckit.common.fileio import atomic_write_json

    if args.validate:
        if not args.published:
            raise KitError("--validate needs --published TREE...")
        seen: set = set()
        sets, facts = gather(args.published, "published", seen)
        points = record_points(sets, facts)
        rows = validate(sets, facts, points)
        summary = summarize(rows)
        print_validation(rows, summary)
        if args.json:
            atomic_write_json(args.json, {"sets": rows, "summary": summary}, option="--json")
        return 0
    result = project(args)
    print_projection(result)
    if args.json:
        atomic_write_json(args.json, result, option="--json")
    return 0
