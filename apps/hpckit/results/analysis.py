"""`hpckit analyze`: every run taken apart as the MLPerf HPC paper does, and the convergence
record that says how many epochs a global batch size costs.

    hpckit analyze RUNS... [--published PATH ...] [--json FILE] [--runs] [--record FILE]

The paper (Farrell et al., "MLPerf HPC: A Holistic Benchmark Suite for Scientific Machine
Learning on HPC Systems", SC'21 workshops, section 4) writes a run's time to solution as

    T = T_init + T_staging + E(B) x (T_epoch + T_eval)

where E(B), the epochs to converge, depends in the closed division on the global batch
size B alone, and T_epoch on the system and B. This module measures every term of a run
from its MLPerf log (the kit's own runs and published ones alike, through the one log
reader, hpckit.results.logs):

* init: init_start..init_stop (before run_start, outside the clock);
* staging: staging_start..staging_stop, inside the clock or before it (v3.0 stages first);
* per epoch: training (epoch_start..epoch_stop less the evaluations in it) and evaluation
  (eval_start..eval_stop), the eval share of the clock, T_staging / T_epoch (Table 5);
* throughput: train_samples / epoch time and eval_samples / evaluation time, in total and
  per compute unit (accelerators; on CPU runs, ranks; else nodes);
* the compute budget: time to train x units, in unit-hours;
* each epoch's cycle time (one epoch_start to the next, evaluations included), what
  `hpckit project` validates against (hpckit/results/project.py).

The convergence record: one point per set (system x benchmark x scaling) and dataset,
the epochs of its converged runs at its global batch size. Datasets are told apart by
their train_samples (v0.7 CosmoFlow trained on 262,144 samples, later rounds on 524,288; the
kit's mini configs on their own), never pooled. Per dataset a curve is fitted to the
closed-division sets (see `fit_epochs`), with its uncertainty from a bootstrap over the
sets and the run-to-run spread around it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpckit.common.benchmark import PACKAGES
from hpckit.common.errors import KitError
from hpckit.common.fileio import output_file

KIT_BENCHMARKS = PACKAGES   # the record's benchmarks: the kit's (analyze takes any apart)
RECORD_FILE = Path(__file__).with_name("convergence_record.json")   # shipped, from published rounds
BOOTSTRAP = 400          # resamples of the sets for the curve's uncertainty
DRAWS = 2000             # draws of the residuals around the curve
SEED = 0                 # the bootstrap's generator: the same record gives the same figures


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="*", metavar="RUN",
                   help="the site's runs: kit output directories (mlperf.log), result logs, or directories of them")
    p.add_argument("--published", nargs="+", action="extend", default=[], metavar="PATH",
                   help="published result trees or logs (e.g. a checkout of hpc_results_v3.0)")
    p.add_argument("--json", metavar="FILE", type=output_file("--json"),
                   help="also write every run's breakdown, the sets and the convergence record with its fitted "
                        "curves as JSON (a new file)")
    p.add_argument("--runs", dest="per_run", action="store_true", help="print one line per run, not per set")
    p.add_argument("--record", metavar="FILE", type=output_file("--record"),
                   help="write the convergence record of the published logs only, in the form `hpckit project "
                        "--record` reads (a new file)")


# ---- one run ---------------------------------------------------------------------------

@dataclass
class RunFacts:
    name: str
    origin: str                  # "site" or "published"
    log: object                  # hpckit.results.logs.RunLog
    set_label: str = ""
    round: str | None = None     # a published round (v1.0, ...) when the path says it
    config: str = "official"     # a kit run's training config (mini, reference)
    global_batch_size: int | None = None
    train_samples: int | None = None
    eval_samples: int | None = None
    ranks: int | None = None
    compute_units: int | None = None
    init_s: float | None = None           # init_start..init_stop
    staging_s: float | None = None        # staging inside the clock
    staging_outside_s: float | None = None  # staging before run_start (not timed)
    eval_s: float = 0.0
    evaluations: int = 0
    train_s: float = 0.0
    total_s: float = 0.0
    epoch_s: float | None = None          # mean epoch time without its evaluation
    eval_each_s: float | None = None      # mean time of one evaluation
    epoch_throughput: float | None = None  # train samples / epoch_s
    eval_throughput: float | None = None   # eval samples / eval_each_s
    staging_epoch_ratio: float | None = None
    unit_hours: float | None = None
    to_first_epoch_s: float | None = None  # run_start to the first epoch_start (staging, set-up)
    cycles_s: list = field(default_factory=list)   # epoch_start to the next (last: to run_stop)
    epoch_times: list = field(default_factory=list)  # each epoch's training time, evaluations out
    cycle_times: list = field(default_factory=list)  # a no-epochs log's cycles' training time (as epoch_times)
    interval_samples: list = field(default_factory=list)  # the samples of each (epoch_times or cycle_times)
    samples_why: str = ""                  # why those samples are unknown (timeline.Timeline.samples_why)
    eval_beside_s: float = 0.0             # evaluations running beside the training (asynchronous), on the clock
    evaluations_beside: int = 0            # of the evaluations, those beside the training
    eval_mode: str = "none"                # blocking, asynchronous, mixed, none (timeline.Timeline.mode)
    timeline: object = None                # hpckit.results.timeline.Timeline
    samples_to_converge: int | None = None  # a no-epochs log: the training samples its last evaluation saw
    extra: dict = field(default_factory=dict)
    no_epochs: str | None = None           # why this benchmark's log counts no epochs (logs.NO_EPOCHS)

    # After the warm-up: the first epoch pays one-off costs (allocator, kernel selection,
    # cold page cache); a projection to E epochs pays them once, not E times.
    @property
    def steady_epoch_s(self) -> float | None:
        later = self.epoch_times[1:]
        return float(np.median(later)) if later else (self.epoch_times[0] if self.epoch_times else None)

    @property
    def steady_throughput(self) -> float | None:
        """Training samples/s after the first epoch; OpenFold (no epochs): the samples between
        evaluations over the cycles' training time, after the first cycle."""
        if self.no_epochs:
            done = [(n, t) for n, t in zip(self.interval_samples, self.cycle_times) if n and t > 0]
            later = done[1:] or done
            return sum(n for n, _ in later) / sum(t for _, t in later) if later else None
        e = self.steady_epoch_s
        return self.train_samples / e if self.train_samples and e else None

    @property
    def throughput_why(self) -> str:
        """Why steady_throughput is None, else ''."""
        if self.steady_throughput is not None:
            return ""
        if self.samples_why:
            return self.samples_why
        what = "cycle" if self.no_epochs else "epoch"
        return f"no whole {what} timed in the log" if not (self.cycle_times or self.epoch_times) else \
            f"no {what} with a training time"

    @property
    def epochs_to_converge(self) -> float | None:
        """The epochs the run trained (logs.RunLog.epochs); a log that counts no epochs
        (OpenFold): the training samples seen by its last evaluation, the official RCP
        checker's count for it (mlperf_logging 4.1.68 rcp_checker/rcp_checker.py:120-123: the
        last eval_accuracy's epoch_num), over train_samples: a fraction of an epoch."""
        if not self.no_epochs:
            return self.log.epochs
        if self.samples_to_converge and self.train_samples:
            return self.samples_to_converge / self.train_samples
        return None

    @property
    def steady_interval_s(self) -> float | None:
        """The median training time of an epoch (OpenFold: a cycle) after the first."""
        if not self.no_epochs:
            return self.steady_epoch_s
        later = self.cycle_times[1:]
        return float(np.median(later)) if later else (self.cycle_times[0] if self.cycle_times else None)

    @property
    def cycles_per_epoch(self) -> float | None:
        """Epoch_starts per epoch of train_samples: 1; OpenFold: train_samples over the samples
        of its median cycle (the samples between evaluations), None where those are unknown."""
        if not self.no_epochs:
            return 1.0
        per = [n for n in self.interval_samples if n]
        return self.train_samples / float(np.median(per)) if per and self.train_samples else None

    @property
    def eval_blocking_fraction(self) -> float:
        """Of the evaluations' time, the share the clock spent on them with no training
        running: 1 where they block the training, near 0 where they run beside it."""
        whole = (self.eval_each_s or 0.0) * self.evaluations
        if self.evaluations_beside == 0 or whole <= 0:
            return 1.0
        return min(1.0, self.eval_s / whole)

    @property
    def warmup_s(self) -> float:
        """What the first epoch (OpenFold: cycle) took beyond a steady one."""
        times = self.cycle_times if self.no_epochs else self.epoch_times
        if len(times) < 2:
            return 0.0
        return max(0.0, times[0] - self.steady_interval_s)

    @property
    def other_per_epoch_s(self) -> float:
        """Per epoch, the clock's time in neither training nor evaluation (the gaps between
        an epoch's end and the next one's start: logging, collectives, the loader's restart):
        a steady cycle less its training and the evaluations' time on the clock (OpenFold:
        per cycle, times its cycles per epoch)."""
        cycles = self.cycles_s[1:-1] or self.cycles_s[:1]
        per_epoch = self.cycles_per_epoch
        if self.no_epochs:
            count = len(self.cycles_s)
        else:
            count = self.log.epochs
        if not cycles or self.steady_interval_s is None or not count or not per_epoch:
            return 0.0
        evals = (self.eval_each_s or 0.0) * self.evaluations / count * self.eval_blocking_fraction
        return max(0.0, float(np.median(cycles)) - self.steady_interval_s - evals) * per_epoch

    @property
    def eval_share(self) -> float | None:
        """The share of the clock in evaluation with no training running (blocking
        evaluations; of an asynchronous one, what the training waited for)."""
        return self.eval_s / self.total_s if self.total_s > 0 else None

    @property
    def eval_beside_share(self) -> float | None:
        """The share of the clock with an evaluation running beside the training."""
        return self.eval_beside_s / self.total_s if self.total_s > 0 else None

    @property
    def local_batch(self) -> float | None:
        if self.global_batch_size and self.compute_units:
            return self.global_batch_size / self.compute_units
        return None

    def per_unit(self, value):
        return value / self.compute_units if value is not None and self.compute_units else None

    @property
    def steady_per_unit(self) -> float | None:
        """Training samples/s per compute unit after the warm-up: the figure that compares
        systems whatever the number of train samples their epochs hold (time to train does
        not: it is epochs of that data set)."""
        return self.per_unit(self.steady_throughput)

    @property
    def input_wait(self) -> float | None:
        """The share of the training loop's time spent waiting for the next batch (summary.json
        usage.input_wait_share); None where the run did not record it (published logs, runs of
        a kit from before it)."""
        return self.extra.get("usage_input_wait_share")

    @property
    def gpu_busy(self) -> float | None:
        """The share of the training loop's time the GPU computed (usage.gpu_busy_share: CUDA
        runs only)."""
        return self.extra.get("usage_gpu_busy_share")

    @property
    def dataset(self) -> str | None:
        """What the epochs of this run are epochs of: the config and its train samples
        (published: `official`, the count to 3 significant digits, as rounds differ by a few
        samples where a file was dropped)."""
        if not self.train_samples:
            return None
        n = int(self.train_samples)
        if self.config == "official":
            n = int(float(f"{n:.3g}"))
        return f"{self.config}/{n}"

    def breakdown(self) -> dict:
        return {"run": self.name, "origin": self.origin, "round": self.round, "benchmark": self.log.benchmark,
                "org": self.log.org, "system": self.log.platform, "division": self.log.division,
                "config": self.config, "dataset": self.dataset, "converged": self.log.converged,
                "epochs": self.log.epochs, "global_batch_size": self.global_batch_size,
                "compute_units": self.compute_units, "local_batch": self.local_batch,
                "time_to_train_s": self.total_s, "init_s": self.init_s, "staging_s": self.staging_s,
                "staging_outside_s": self.staging_outside_s, "train_s": self.train_s, "eval_s": self.eval_s,
                "evaluations": self.evaluations, "epoch_s": self.epoch_s, "eval_each_s": self.eval_each_s,
                "eval_share": self.eval_share, "eval_beside_s": self.eval_beside_s,
                "eval_beside_share": self.eval_beside_share, "evaluations_beside": self.evaluations_beside,
                "eval_mode": self.eval_mode, "staging_per_epoch": self.staging_epoch_ratio,
                "train_samples_per_s": self.epoch_throughput, "eval_samples_per_s": self.eval_throughput,
                "train_samples_per_s_per_unit": self.per_unit(self.epoch_throughput),
                "steady_samples_per_s_per_unit": self.steady_per_unit,
                "eval_samples_per_s_per_unit": self.per_unit(self.eval_throughput),
                "unit_hours": self.unit_hours, "to_first_epoch_s": self.to_first_epoch_s,
                "cycles_s": self.cycles_s, "epoch_times": self.epoch_times, "cycle_times": self.cycle_times,
                "interval_samples": self.interval_samples, "steady_epoch_s": self.steady_epoch_s,
                "warmup_s": self.warmup_s, "other_per_epoch_s": self.other_per_epoch_s, **self.extra}


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _overlap(a0, a1, b0, b1) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


_ROUND = re.compile(r"(?:^|[_/-])(v\d+\.\d+)$")


def round_of(path: Path) -> str | None:
    """The results round a published log's path names (a folder `v3.0` or
    `hpc_results_v3.0`), else None."""
    for part in Path(path).resolve().parts[::-1]:
        m = _ROUND.search(part)
        if m:
            return m.group(1)
    return None


def run_facts(path: Path, origin: str) -> RunFacts:
    from hpckit.results.logs import _records, parse_log

    log = parse_log(path)
    recs = _records(path)
    stop_i = next(i for i, r in enumerate(recs) if r["key"] == "run_stop")
    upto = recs[:stop_i + 1]
    t0, t1 = log.run_start_ms, log.run_stop_ms
    f = RunFacts(name=str(path), origin=origin, log=log, total_s=(t1 - t0) / 1000.0,
                 round=round_of(path) if origin == "published" else None)
    first, first_t = {}, {}
    for r in recs:
        first.setdefault(r["key"], r.get("value"))
        if _num(r.get("time_ms")) is not None:
            first_t.setdefault(r["key"], r["time_ms"])
    f.global_batch_size = _num(first.get("global_batch_size"))
    f.train_samples = _num(first.get("train_samples"))
    f.eval_samples = _num(first.get("eval_samples"))
    cfg = first.get("hpckit_config")
    if isinstance(cfg, dict):
        f.ranks = _num(cfg.get("ranks"))
        f.config = str(cfg.get("name") or "kit")
    if "init_start" in first_t and "init_stop" in first_t:
        f.init_s = max(0.0, (first_t["init_stop"] - first_t["init_start"]) / 1000.0)

    if log.staging_start_ms is not None and log.staging_stop_ms is not None:
        s0, s1 = log.staging_start_ms, log.staging_stop_ms
        f.staging_s = _overlap(s0, s1, t0, t1) / 1000.0
        f.staging_outside_s = (s1 - s0) / 1000.0 - f.staging_s

    # The timeline (hpckit.results.timeline): training intervals, evaluations blocking the
    # training or beside it, and what the clock spent in each.
    from hpckit.results.logs import NO_EPOCHS
    from hpckit.results.timeline import read_timeline
    f.no_epochs = NO_EPOCHS.get(str(log.benchmark or "").lower())
    tl = read_timeline(upto, t0, t1, f.train_samples, counts_samples=bool(f.no_epochs))
    f.timeline = tl
    f.evaluations = len(tl.evaluations)
    f.evaluations_beside = sum(e.asynchronous for e in tl.evaluations)
    f.eval_mode = tl.mode
    f.eval_s = tl.eval_on_clock_s
    f.eval_beside_s = tl.eval_beside_s
    f.train_s = max(0.0, f.total_s - (f.staging_s or 0.0) - f.eval_s)
    if tl.evaluations:
        f.eval_each_s = sum(e.seconds for e in tl.evaluations) / len(tl.evaluations)
        if f.eval_samples and f.eval_each_s > 0:
            f.eval_throughput = f.eval_samples / f.eval_each_s
    if tl.trainings:
        f.to_first_epoch_s = max(0.0, (tl.trainings[0].start_ms - t0) / 1000.0)
        f.cycles_s = tl.cycles_s
    whole = tl.whole    # a last epoch cut short by the run's stop is not an epoch's time
    times = [tr.train_s for tr in whole]
    f.interval_samples = [tr.samples for tr in whole]
    f.samples_why = tl.samples_why
    if f.no_epochs:
        # its epoch_start..epoch_stop are train/eval cycles, not epochs: no epoch time or
        # staging/epoch ratio is made up from them; its throughput is the samples between
        # evaluations (epoch_num's growth) over the cycles' training time
        f.cycle_times = times
        seen = [_epoch_num_of(r) for r in upto if r["key"] == log.metric]
        f.samples_to_converge = seen[-1] if seen and seen[-1] else None
        done = [(n, t) for n, t in zip(f.interval_samples, times) if n and t > 0]
        if done:
            f.epoch_throughput = sum(n for n, _ in done) / sum(t for _, t in done)
        return _units(f, log, path, origin)
    f.epoch_times = times
    if times:
        f.epoch_s = sum(times) / len(times)
        if f.train_samples and f.epoch_s > 0:
            f.epoch_throughput = f.train_samples / f.epoch_s
        if f.staging_s is not None and f.epoch_s > 0:
            staged = f.staging_s + (f.staging_outside_s or 0.0)
            f.staging_epoch_ratio = staged / f.epoch_s
    return _units(f, log, path, origin)


def _epoch_num_of(rec: dict) -> int | None:
    meta = rec.get("metadata")
    n = _num(meta.get("epoch_num")) if isinstance(meta, dict) else None
    return int(n) if n is not None else None


def _units(f: RunFacts, log, path: Path, origin: str) -> RunFacts:
    """The compute units, the budget in unit-hours, and a kit run's own usage figures."""
    nodes = log.number_of_nodes
    acc = log.accelerators_per_node
    if nodes is not None and acc:
        f.compute_units = nodes * acc
    elif f.ranks:
        f.compute_units = f.ranks
    elif nodes is not None:
        f.compute_units = nodes
    if f.compute_units:
        f.unit_hours = f.total_s / 3600.0 * f.compute_units
    if origin == "site":
        f.extra.update(_usage(Path(path)))
    return f


# The usage block's shares of the training loop's time (common/usage.py): waiting for the
# next batch, and the GPU computing (CUDA runs). Read here whether or not the summary reader's
# USAGE_FIGURES lists them, each a share: a number in 0..1 or null.
LOOP_SHARES = ("input_wait_share", "gpu_busy_share")


def _usage(log: Path) -> dict:
    """What a kit run measured about itself (summary.json's `usage` block beside its log:
    peak memory, bytes read, all-reduce share, FLOP/s, input wait; common/usage.py), flattened."""
    from hpckit.common.inputs import Num, Opt, conform
    from hpckit.common.summary import USAGE_FIGURES, read_summary
    summary = log.with_name("summary.json")
    if log.name != "mlperf.log" or not os.path.lexists(summary):
        return {}
    usage = read_summary(summary).get("usage") or {}    # checked: finite numbers >= 0 or null
    conform(usage, {k: Opt(Num(minimum=0, maximum=1)) for k in LOOP_SHARES}, f"summary.json {summary}", "usage")
    keys = USAGE_FIGURES + tuple(k for k in LOOP_SHARES if k not in USAGE_FIGURES)
    return {f"usage_{k}": usage[k] for k in keys if usage.get(k) is not None}


def wait_text(input_wait: float | None, gpu_busy: float | None) -> str:
    """`input wait 0.03, GPU busy 0.97`; a share not recorded is `n/a`, never 0 (GPU busy
    only where recorded: CUDA runs)."""
    text = f"input wait {'n/a' if input_wait is None else f'{input_wait:.2f}'}"
    return text + (f", GPU busy {gpu_busy:.2f}" if gpu_busy is not None else "")


def gather(args_paths: list[str], origin: str, seen: set) -> tuple[list[dict], dict]:
    """Score the logs as sets (hpckit.results.score: the same discovery and scores as
    `hpckit score`; a kit campaign's instances are a weak set, other logs outside the
    submission layout are taken as strong scaling) and read each run's facts. A log reached
    twice (the same bytes in another folder, or given as a site run and as a published one;
    a later round's repository re-including an earlier round's results, possibly under a
    renamed submitter: the same run_start and run_stop) is read once, the first time."""
    from hpckit.results.score import score_sets

    if not args_paths:
        return [], {}
    what = "run" if origin == "site" else "--published"
    for arg in map(Path, args_paths):
        if not arg.exists():
            from hpckit.common.inputs import absent
            raise KitError(f"{what} {arg}: {absent(arg)}")
    sets, _ = score_sets(args_paths, fallback="strong")   # a kit campaign stays a weak set
    facts = {}
    for s in sets:
        kept = []
        s["counted_paths"] = {r.path for (_, r), ok in zip(s["runs"], s["counts"]) if ok}
        for name, r in s["runs"]:
            if r.problem:
                continue
            digest = hashlib.sha256(Path(r.path).read_bytes()).hexdigest()
            clock = (r.benchmark, r.run_start_ms, r.run_stop_ms)
            if digest in seen or clock in seen:
                continue
            seen.update((digest, clock))
            kept.append((name, r))
            f = run_facts(Path(r.path), origin)
            f.set_label = _set_label(s, origin)
            facts[r.path] = f
        s["runs"] = kept
    return [s for s in sets if s["runs"]], facts


def _set_label(s: dict, origin: str) -> str:
    nodes = s["nodes"] if s["nodes"] is not None else "?"
    return f"{origin}: {s['org']} {s['platform']} {s['benchmark']} (nodes {nodes})"


def median(values) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.median(vals)) if vals else None


# ---- the convergence record -------------------------------------------------------------

@dataclass
class Point:
    """One set's convergence: the epochs of its converged runs at one global batch size."""
    benchmark: str
    dataset: str
    origin: str
    round: str | None
    org: str
    system: str
    division: str
    scaling: str
    global_batch_size: int
    epochs: list
    train_samples: int | None = None
    eval_samples: int | None = None

    @property
    def median_epochs(self) -> float:
        return float(np.median(self.epochs))


def record_points(sets: list[dict], facts: dict) -> list[Point]:
    points = []
    for s in sets:
        fs = [facts[r.path] for _, r in s["runs"] if r.path in facts]
        by = {}
        for f in fs:
            if (f.log.converged and f.epochs_to_converge and f.global_batch_size and f.dataset
                    and str(f.log.benchmark).lower() in KIT_BENCHMARKS):
                by.setdefault((f.dataset, int(f.global_batch_size)), []).append(f)
        for (dataset, batch), group in sorted(by.items()):
            g = group[0]
            points.append(Point(benchmark=str(g.log.benchmark).lower(), dataset=dataset, origin=g.origin,
                                round=g.round, org=str(s["org"]), system=str(s["platform"]),
                                division=str(g.log.division or ("closed" if g.origin == "site" else "")).lower(),
                                scaling=str(s["score"]["kind"]), global_batch_size=batch,
                                epochs=sorted(_epochs_value(f) for f in group),
                                train_samples=g.train_samples, eval_samples=g.eval_samples))
    return points


def _epochs_value(f: RunFacts):
    """A run's epochs in the record: a whole number; OpenFold's, a fraction of an epoch (its
    samples to converge over train_samples, RunFacts.epochs_to_converge), to 6 digits."""
    return float(f"{f.epochs_to_converge:.6g}") if f.no_epochs else int(f.epochs_to_converge)


def points_to_json(points: list[Point]) -> list[dict]:
    return [dict(p.__dict__) for p in points]


def _point_spec() -> dict:
    """The types `analyze --record` writes for a point (hpckit.common.inputs.conform)."""
    from hpckit.common.inputs import ListOf, Num, Opt
    count = Num(positive=True, integer=True, maximum=2 ** 53)
    # epochs to converge: never near a million; OpenFold's a fraction of one (samples / train_samples)
    epochs = Num(positive=True, maximum=10 ** 6)
    return {"benchmark": str, "dataset": str, "origin": str, "round": Opt(str), "org": str, "system": str,
            "division": str, "scaling": str, "global_batch_size": count, "epochs": ListOf(epochs),
            "train_samples": Opt(count), "eval_samples": Opt(count)}


def points_from_json(rows: list[dict], source: str) -> list[Point]:
    """The record's points, each checked: the keys a point needs, of the types the kit
    writes (epochs: a non-empty list of numbers > 0, whole but for OpenFold's), else one
    line naming the file and the point's key."""
    from hpckit.common.inputs import conform
    what = f"convergence record {source}"
    spec = _point_spec()
    required = [k for k, f in Point.__dataclass_fields__.items() if f.default is dataclasses.MISSING]
    points = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise KitError(f"{what}: points[{i}]: expected an object with the keys {', '.join(required)}")
        missing = [k for k in required if k not in r]
        if missing:
            raise KitError(f"{what}: points[{i}]: no '{missing[0]}' (a point has {', '.join(required)})")
        conform({k: r[k] for k in spec if k in r}, spec, what, f"points[{i}]")
        if not r["epochs"]:
            raise KitError(f"{what}: points[{i}].epochs: empty (a point holds the epochs of its runs)")
        points.append(Point(**{k: r[k] for k in Point.__dataclass_fields__ if k in r}))
    return points


def load_record(path: str | Path | None = None) -> tuple[list[Point], dict]:
    """The convergence record of the published rounds (the shipped one unless `path`)."""
    from hpckit.common.fileio import read_json
    path = Path(path) if path else RECORD_FILE
    doc = read_json(path, f"convergence record {path}")
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list):
        raise KitError(f"convergence record {path}: no `points` list")
    from hpckit.common.inputs import ListOf, Opt, conform
    conform(doc, {"sources": Opt(ListOf(str)), "what": Opt(str)}, f"convergence record {path}")
    return points_from_json(doc["points"], str(path)), {k: v for k, v in doc.items() if k != "points"}


@dataclass
class EpochCurve:
    """E(B) = E_min x (1 + B / B_noise): epochs to converge against the global batch size.

    The form is the large-batch model of McCandlish et al. (2018, "An Empirical Model of
    Large-Batch Training"): below the gradient noise scale B_noise a larger batch costs
    few extra epochs, above it the epochs grow linearly with B. It is fitted by least
    squares in log space to the closed-division sets, each set one point (its median run),
    so a submitter with many runs does not outweigh one with few. With one batch size in
    the record the curve is that batch's median (model `constant`), and says so.
    Uncertainty: the fit repeated on BOOTSTRAP resamples of the sets (the curve's), times
    the spread of a set around the curve and of a run around its set's median (log
    residuals, every set weighing the same whatever its number of runs: a weak set of 128
    instances would otherwise be the record), drawn DRAWS times: p10-p90 of a single run's
    epochs at B."""
    benchmark: str
    dataset: str
    e_min: float
    b_noise: float | None
    model: str
    sets: list                 # the points it rests on
    boot: np.ndarray           # (BOOTSTRAP, 2): e_min, b_noise (inf: constant)
    residuals: np.ndarray      # DRAWS log residuals: a set's from the curve + a run's from its set
    within: np.ndarray = None  # the second part alone: a run's from its set's median

    def at(self, batch: float, e_min=None, b_noise=None) -> float:
        e_min = self.e_min if e_min is None else e_min
        b_noise = self.b_noise if b_noise is None else b_noise
        if b_noise is None or not math.isfinite(b_noise):
            return e_min
        return e_min * (1.0 + batch / b_noise)

    def samples(self, batch: float) -> np.ndarray:
        """Epochs of one run at `batch`: every bootstrap curve x every run residual."""
        curves = np.array([self.at(batch, e, b) for e, b in self.boot])
        return (curves[:, None] * np.exp(self.residuals)[None, :]).ravel()

    def slowest_of(self, batch: float, m: int) -> float:
        """The epochs of the slowest of m runs of ONE set (a throughput campaign's
        instances share their hyper-parameters: they differ by the run-to-run spread within
        a set, not by the spread between submitters): the curve at B times the within-set
        residual's quantile m / (m + 1)."""
        return self.at(batch) * float(np.exp(np.quantile(self.within, m / (m + 1.0))))

    def quantiles(self, batch: float, qs=(0.1, 0.5, 0.9)) -> list[float]:
        return [float(v) for v in np.quantile(self.samples(batch), qs)]

    def curve_band(self, batch: float) -> tuple[float, float]:
        """p10-p90 of the curve itself (the fit's uncertainty, without run-to-run spread)."""
        vals = np.array([self.at(batch, e, b) for e, b in self.boot])
        return float(np.quantile(vals, 0.1)), float(np.quantile(vals, 0.9))

    def describe(self) -> str:
        batches = sorted({p.global_batch_size for p in self.sets})
        orgs = sorted({p.org for p in self.sets})
        rounds = sorted({p.round for p in self.sets if p.round})
        form = (f"E(B) = {self.e_min:.3g} x (1 + B/{self.b_noise:.4g})" if self.model == "noise-scale"
                else f"E = {self.e_min:.3g} (one batch size)")
        return (f"{self.benchmark} {self.dataset}: {form}; {len(self.sets)} sets of {len(orgs)} submitters"
                f"{' (' + ', '.join(rounds) + ')' if rounds else ''}, B {batches[0]}-{batches[-1]}")

    def to_json(self) -> dict:
        return {"benchmark": self.benchmark, "dataset": self.dataset, "model": self.model, "e_min": self.e_min,
                "b_noise": self.b_noise, "sets": len(self.sets), "runs": sum(len(p.epochs) for p in self.sets),
                "submitters": sorted({p.org for p in self.sets}), "description": self.describe(),
                "by_batch": spread_by_batch(self.sets)}


def _fit(batches: np.ndarray, epochs: np.ndarray) -> tuple[float, float]:
    """Least absolute deviations of log E = log E_min + log(1 + B/B_noise) over a grid of
    B_noise (log spaced; E_min in closed form at each: the median); inf where one batch size
    leaves B_noise free or a constant fits as well. Absolute, not squared: one submitter's
    hyper-parameters that need twice the epochs of everyone else's at its batch size (v1.0
    JUWELS Booster MXNet CosmoFlow, 43 and 69 epochs where others ran 21-37) moves the median
    curve less than it would a mean one."""
    y = np.log(epochs)
    if np.unique(batches).size < 2:
        return float(np.exp(np.median(y))), math.inf
    grid = np.exp(np.linspace(math.log(batches.min() / 100.0), math.log(batches.max() * 100.0), 600))
    g = np.log1p(batches[None, :] / grid[:, None])              # (grid, points)
    c = np.median(y[None, :] - g, axis=1)
    sad = np.sum(np.abs(y[None, :] - c[:, None] - g), axis=1)
    k = int(np.argmin(sad))
    const = float(np.median(y))
    if float(np.sum(np.abs(y - const))) <= sad[k]:
        return float(math.exp(const)), math.inf
    return float(math.exp(c[k])), float(grid[k])


def fit_epochs(points: list[Point], benchmark: str, dataset: str, exclude_org: str | None = None,
               divisions=("closed",), bootstrap: bool = True) -> EpochCurve | None:
    """The curve of one benchmark and dataset from the points of the given divisions (the
    closed one: open submissions change the hyper-parameters), leaving out one submitter's
    points when asked (the projection's validation). None where no point is left."""
    use = [p for p in points if p.benchmark == benchmark and p.dataset == dataset and p.division in divisions
           and (exclude_org is None or _org_key(p.org) != _org_key(exclude_org))]
    if not use:
        return None
    b = np.array([p.global_batch_size for p in use], dtype=float)
    e = np.array([p.median_epochs for p in use], dtype=float)
    e_min, b_noise = _fit(b, e)
    rng = np.random.default_rng(SEED)
    boot = np.empty((BOOTSTRAP if bootstrap else 0, 2))
    for k in range(len(boot)):
        idx = rng.integers(0, len(use), len(use))
        boot[k] = _fit(b[idx], e[idx])
    curve = EpochCurve(benchmark=benchmark, dataset=dataset, e_min=e_min,
                       b_noise=None if not math.isfinite(b_noise) else b_noise,
                       model="noise-scale" if math.isfinite(b_noise) else "constant", sets=use, boot=boot,
                       residuals=np.array([]))
    between = np.array([math.log(p.median_epochs) - math.log(curve.at(p.global_batch_size)) for p in use])
    within = [np.log(np.array(p.epochs, dtype=float)) - math.log(p.median_epochs) for p in use]
    i, j = rng.integers(0, len(use), DRAWS), rng.integers(0, len(use), DRAWS)
    u = rng.random(DRAWS)
    curve.within = np.array([within[b][int(x * len(within[b]))] for b, x in zip(j, u)])
    curve.residuals = between[i] + curve.within
    return curve


def _org_key(org: str) -> str:
    """A submitter across rounds (`Fujitsu/RIKEN` and `Fujitsu+RIKEN`, `LBNL` and
    `HPE+LBNL` are one): lower case, the parts after splitting on + and /."""
    parts = sorted(p.strip().lower() for p in re.split(r"[+/]", org) if p.strip())
    return "+".join(parts)


def same_submitter(a: str, b: str) -> bool:
    """Two org names share a submitter (any part in common: `LBNL` and `HPE+LBNL`)."""
    return bool(set(_org_key(a).split("+")) & set(_org_key(b).split("+")))


def spread_by_batch(points: list[Point]) -> list[dict]:
    """Per global batch size: sets, runs and the epochs' median, min and max."""
    out = []
    for batch in sorted({p.global_batch_size for p in points}):
        here = [p for p in points if p.global_batch_size == batch]
        runs = [x for p in here for x in p.epochs]
        out.append({"global_batch_size": batch, "sets": len(here), "runs": len(runs),
                    "median": float(np.median(runs)), "min": min(runs), "max": max(runs),
                    "submitters": sorted({p.org for p in here})})
    return out


def curves(points: list[Point], divisions=("closed",)) -> list[EpochCurve]:
    out = []
    for bench, dataset in sorted({(p.benchmark, p.dataset) for p in points}):
        c = fit_epochs(points, bench, dataset, divisions=divisions)
        if c is not None:
            out.append(c)
    return out


# ---- the command -----------------------------------------------------------------------

def _fmt(v, spec="{:.3g}") -> str:
    return "-" if v is None else spec.format(v)


def _e(epochs: float) -> str:
    """Epochs to one decimal; a fraction of an epoch (OpenFold's) to 3 digits."""
    return f"{epochs:.3g}" if epochs < 1 else f"{epochs:.1f}"


def _train_text(fs: list[RunFacts], value) -> str:
    """The training samples/s per unit, or n/a with the reason the logs give none."""
    if value is not None:
        return _fmt(value)
    why = next((f.throughput_why for f in fs if f.throughput_why), "")
    return f"n/a ({why})" if why else "-"


def _set_line(s: dict, fs: list[RunFacts]) -> str:
    m = {k: median([getattr(f, k) if k != "eval_share" else f.eval_share for f in fs]) for k in
         ("total_s", "init_s", "staging_s", "epoch_s", "eval_each_s", "eval_share", "staging_epoch_ratio",
          "epoch_throughput", "eval_throughput", "unit_hours", "compute_units", "global_batch_size")}
    beside = median([f.eval_beside_share for f in fs])
    units = m["compute_units"]
    per = (lambda v: v / units if v is not None and units else None)
    epochs = median([f.log.epochs for f in fs])
    origin = fs[0].origin + (f" {fs[0].round}" if fs[0].round else "")
    # a benchmark that counts no epochs (logs.NO_EPOCHS) has no per-epoch figures: n/a
    na = (lambda v, spec="{:.3g}": "n/a" if any(f.no_epochs for f in fs) else _fmt(v, spec))  # noqa: E731
    datasets = ", ".join(sorted({f.dataset or f"{f.config}/?" for f in fs}))   # what its epochs are epochs of
    return (f"{origin} | {s['org']} | {s['platform']} | {s['benchmark']} {s['score']['kind']} | data {datasets} | "
            f"runs {len(fs)} | "
            f"units {_fmt(units, '{:.0f}')} | B {_fmt(m['global_batch_size'], '{:.0f}')} | "
            f"epochs {na(epochs)} | T {_fmt(m['total_s'] and m['total_s'] / 60, '{:.2f}')} min | "
            f"init {_fmt(m['init_s'], '{:.1f}')} s | staging {_fmt(m['staging_s'], '{:.1f}')} s | "
            f"epoch {na(m['epoch_s'])} s | eval {_fmt(m['eval_each_s'])} s (share {_fmt(m['eval_share'], '{:.1%}')}"
            + (f", beside training {beside:.1%}" if beside else "") + ") | "
            f"staging/epoch {na(m['staging_epoch_ratio'], '{:.2f}')} | "
            f"train {_train_text(fs, per(m['epoch_throughput']))} "
            f"eval {_fmt(per(m['eval_throughput']))} samples/s/unit | "
            f"{_fmt(m['unit_hours'], '{:.1f}')} unit-h | "
            f"{wait_text(median([f.input_wait for f in fs]), median([f.gpu_busy for f in fs]))}")


def main(args) -> int:
    from hpckit.common.fileio import atomic_write_json

    if not args.runs and not args.published:
        raise KitError("nothing to analyze: give RUN paths and/or --published PATH")
    if args.json and args.record and os.path.abspath(args.json) == os.path.abspath(args.record):
        raise KitError(f"--json and --record name the same file {args.record}: give each its own")
    seen: set = set()
    site_sets, site_facts = gather(args.runs, "site", seen)
    pub_sets, pub_facts = gather(args.published, "published", seen)
    facts = {**site_facts, **pub_facts}
    sets = site_sets + pub_sets
    for s in sets:
        fs = [facts[r.path] for _, r in s["runs"] if r.path in facts]
        if args.per_run:
            for f in fs:
                b = f.breakdown()
                print(" | ".join(f"{k} {_fmt(b[k]) if isinstance(b[k], float) else b[k]}" for k in
                                 ("run", "dataset", "epochs", "global_batch_size", "compute_units", "time_to_train_s",
                                  "init_s", "staging_s", "epoch_s", "eval_each_s", "eval_share", "staging_per_epoch",
                                  "train_samples_per_s_per_unit", "eval_samples_per_s_per_unit", "unit_hours"))
                      + f" | {wait_text(f.input_wait, f.gpu_busy)}")
        else:
            print(_set_line(s, fs))
    points = record_points(site_sets, facts) + record_points(pub_sets, facts)
    fitted = curves(points)
    print("convergence record (closed division; p10-p90 of one run's epochs at the batch sizes seen):")
    for c in fitted:
        band = "; ".join(f"B {row['global_batch_size']}: {row['median']:g} [{row['min']:g}-{row['max']:g}] "
                         f"fit {_e(c.at(row['global_batch_size']))} "
                         f"({'-'.join(_e(q) for q in c.quantiles(row['global_batch_size'], (0.1, 0.9)))})"
                         for row in spread_by_batch(c.sets))
        print(f"  {c.describe()}\n    {band}")
    if args.json:
        atomic_write_json(args.json, option="--json", obj={
            "runs": [f.breakdown() for f in facts.values()],
            "sets": [{"origin": "site" if s in site_sets else "published", "org": s["org"], "system": s["platform"],
                      "benchmark": s["benchmark"], "scaling": s["score"]["kind"],
                      "runs": [r.path for _, r in s["runs"]]} for s in sets],
            "convergence_record": points_to_json(points),
            "curves": [c.to_json() for c in fitted]})
    if args.record:
        pub_points = record_points(pub_sets, facts)
        if not pub_points:
            raise KitError("--record: no converged published run to record (give --published trees)")
        atomic_write_json(args.record, option="--record", obj={
            "what": "epochs to converge per published set (hpckit analyze --record); one point per set and "
                    "global batch size, the epochs of its converged runs",
            "sources": [round_of(Path(a)) or Path(a).name for a in args.published], "points": points_to_json(pub_points)})
    return 0
