"""A run's timeline as its MLPerf log tells it: when the ranks trained, which evaluations
stopped the training and which ran beside it. `analyze`, `report`, `project` and
bench/gpu_check.py read a run's time through `read_timeline`, and nothing else.

Three shapes are in the published logs (hpc_results_v1.0-v3.0) and the kit's own:

* blocking (every reference implementation, the kit): epoch_start, the training,
  eval_start..eval_stop on the same ranks, epoch_stop (or epoch_stop before eval_start);
  an evaluation inside its own epoch's span pauses that epoch's training.
* epochs overlapping their evaluation (NVIDIA's v3.0 OpenCatalyst with --nodes_for_eval:
  the training ranks log epoch_start and hand the model to evaluation nodes, which log
  eval_start..eval_stop and epoch_stop of that epoch while the training ranks already train
  the next one; mlcommons/hpc_results_v3.0@dfea490 NVIDIA/benchmarks/oc20/implementations/
  pytorch/ocpmodels/trainers/mlperf_forces_trainer.py:259-263, 315-319, 322-360;
  ocpmodels/common/distutils.py:51-61, 177-182). Epoch N's epoch_stop comes after epoch
  N+1's epoch_start: epoch N trained until epoch N+1 started.
* evaluation on separate ranks (NVIDIA's and HPE+LBNL's v3.0 OpenFold,
  --num_async_val_ranks: same commit, NVIDIA/benchmarks/openfold/implementations/pytorch/
  README.md:164, train.py:655-680, 1315-1336; HPE+LBNL/benchmarks/openfold/implementations/
  openfold-pytorch/configs/config_pm_224x4x1x4_dap.sh:12): the evaluation of one cycle's
  model runs while the next cycle trains.

Told apart from the log alone: an evaluation is asynchronous where the training of another
epoch went on while it ran (it started before that training, or the training went on after
it, or had run for less time before it than it took; a blocking evaluation ends its epoch's
training, after that training), by metadata.epoch_num, which every
such log carries (without one: where two epochs' spans overlap); every other evaluation ran
on the training ranks (blocking), and its time inside an epoch is not that epoch's training.
On the clock, evaluation is the time an evaluation ran and no training did: the blocking
evaluations, and the part of an asynchronous one the training waited for (NVIDIA's first
OpenFold evaluation, of the starting checkpoint, outlasts the first cycle).

Samples per training interval: train_samples (an epoch); OpenFold counts no epochs, its
epoch_num is the training samples seen by the end of each train/eval cycle, so a cycle's
samples are the difference to the previous cycle's (mlcommons/hpc@2c627d4
openfold/train.py:730-734). Where a log cannot say (no epoch_num on OpenFold's cycles,
numbers that do not grow), the samples are None and `samples_why` says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# an overlap of intervals shorter than this is the logging's own jitter (ranks log without a
# barrier, sync=False: NVIDIA's eval_start comes 1-2 ms before the next epoch_start)
JITTER_MS = 50


@dataclass
class Training:
    """One epoch (or OpenFold train/eval cycle): from its epoch_start until its training
    ended (its epoch_stop, or the next epoch_start where that came first)."""
    start_ms: float
    end_ms: float
    epoch_num: int | None
    samples: float | None = None
    blocked_ms: float = 0.0       # blocking evaluations inside it
    overlapped: bool = False      # its epoch_stop came after the next epoch_start
    stopped: bool = True          # it ended at its own epoch_stop (not the next start, not run_stop)
    cut: bool = False             # still training at run_stop while the run stopped on an
                                  # evaluation beside it: not a whole epoch (cycle)

    @property
    def train_s(self) -> float:
        return max(0.0, (self.end_ms - self.start_ms - self.blocked_ms) / 1000.0)

    @property
    def throughput(self) -> float | None:
        return self.samples / self.train_s if self.samples and self.train_s > 0 else None


@dataclass
class Evaluation:
    start_ms: float
    stop_ms: float
    epoch_num: int | None
    asynchronous: bool = False    # ran beside the training of another epoch

    @property
    def seconds(self) -> float:
        return max(0.0, (self.stop_ms - self.start_ms) / 1000.0)


@dataclass
class Timeline:
    run_start_ms: float
    run_stop_ms: float
    trainings: list = field(default_factory=list)     # Training, by start
    evaluations: list = field(default_factory=list)   # Evaluation, in file order
    samples_why: str = ""         # why a training's samples are None
    eval_on_clock_s: float = 0.0  # evaluation running while no training ran, inside the clock
    eval_beside_s: float = 0.0    # asynchronous evaluation running while training ran, inside the clock
    training_s: float = 0.0       # training running (its blocking evaluations out), inside the clock

    @property
    def whole(self) -> list:
        """The trainings that trained a whole epoch (cycle): all but one cut at run_stop."""
        return [t for t in self.trainings if not t.cut]

    @property
    def starts(self) -> list:
        return [t.start_ms for t in self.trainings]

    @property
    def asynchronous(self) -> bool:
        return any(e.asynchronous for e in self.evaluations)

    @property
    def mode(self) -> str:
        """`blocking`, `asynchronous`, `mixed` or `none` (no evaluation in the log)."""
        kinds = {e.asynchronous for e in self.evaluations}
        return "none" if not kinds else "mixed" if len(kinds) == 2 else \
            "asynchronous" if True in kinds else "blocking"

    @property
    def cycles_s(self) -> list:
        """One epoch_start to the next (the last: to run_stop): training, blocking
        evaluation and the rest."""
        s = self.starts
        return [max(0.0, (b - a) / 1000.0) for a, b in zip(s, s[1:] + [self.run_stop_ms])]


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _epoch_num(rec: dict):
    meta = rec.get("metadata")
    n = _num(meta.get("epoch_num")) if isinstance(meta, dict) else None
    return int(n) if n is not None else None


def _overlap(a0, a1, b0, b1) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _union(intervals) -> list:
    out = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _minus(intervals, cut) -> list:
    """The union of `intervals` less the union of `cut`."""
    out = []
    cut = _union(cut)
    for a, b in _union(intervals):
        pieces = [(a, b)]
        for c, d in cut:
            pieces = [p for x, y in pieces for p in ((x, min(y, c)), (max(x, d), y)) if p[1] > p[0]]
        out += pieces
    return out


def _length(intervals) -> float:
    return sum(b - a for a, b in _union(intervals))


def _spans(upto: list, run_stop_ms: float) -> list:
    """(start, stop, epoch_num, stopped: by its epoch_stop) of every epoch, by start. In file order, as the blocking logs
    need: an epoch_start closes the epoch still open, an epoch_stop the latest one; except
    where the open epoch's own epoch_stop (by epoch_num) comes later in the log: then the
    epochs overlap (their evaluation runs on other ranks) and it stays open until that
    epoch_stop. An epoch still open at run_stop ends there."""
    last_stop = {}
    for i, r in enumerate(upto):
        if r["key"] == "epoch_stop" and _epoch_num(r) is not None:
            last_stop[_epoch_num(r)] = i
    spans, open_ = [], []           # open_: (start, epoch_num) in the order opened
    for i, r in enumerate(upto):
        t = _num(r.get("time_ms"))
        if t is None or r["key"] not in ("epoch_start", "epoch_stop"):
            continue
        n = _epoch_num(r)
        if r["key"] == "epoch_start":
            if open_ and not (open_[-1][1] is not None and open_[-1][1] != n
                              and last_stop.get(open_[-1][1], -1) > i):
                a, m = open_.pop()
                spans.append((a, t, m, False))
            open_.append((t, n))
        elif open_:
            k = next((k for k, o in enumerate(open_) if n is not None and o[1] == n), len(open_) - 1)
            a, m = open_.pop(k)
            spans.append((a, t, m, True))
    spans += [(a, run_stop_ms, m, False) for a, m in open_]
    return sorted(spans, key=lambda s: (s[0], s[1]))


def read_timeline(upto: list, run_start_ms: float, run_stop_ms: float, train_samples=None,
                  counts_samples: bool = False) -> Timeline:
    """The timeline of the records up to the first run_stop (hpckit.results.logs records).
    counts_samples: the log's epoch_num counts training samples (OpenFold, logs.NO_EPOCHS),
    a cycle's samples are read from it; else each epoch trains train_samples."""
    tl = Timeline(run_start_ms=run_start_ms, run_stop_ms=run_stop_ms)

    # evaluations: each eval_start up to the next eval_stop (any event type), in file order
    open_at = None
    for r in upto:
        t = _num(r.get("time_ms"))
        if t is None:
            continue
        if r["key"] == "eval_start":
            open_at = (t, _epoch_num(r))
        elif r["key"] == "eval_stop" and open_at is not None:
            tl.evaluations.append(Evaluation(open_at[0], t, open_at[1]))
            open_at = None

    spans = _spans(upto, run_stop_ms)
    for i, (a, b, n, stopped) in enumerate(spans):
        nxt = spans[i + 1][0] if i + 1 < len(spans) else math.inf
        end = min(b, nxt)
        tl.trainings.append(Training(a, max(a, end), n, overlapped=b > nxt + JITTER_MS,
                                     stopped=stopped and b <= nxt + JITTER_MS))

    # which evaluations ran beside the training of another epoch: the training went on
    # during it (it started after the evaluation, or went on after it, or no epoch_stop ended
    # it, or it had trained for less time before the evaluation than the evaluation took: a
    # blocking evaluation ends its epoch's training, after that training) and the epoch numbers say another epoch's (where
    # the log has none: the evaluation lies where two epochs' spans overlap)
    for e in tl.evaluations:
        for i, tr in enumerate(tl.trainings):
            if _overlap(e.start_ms, e.stop_ms, tr.start_ms, tr.end_ms) <= JITTER_MS:
                continue
            beside = (e.start_ms < tr.start_ms - JITTER_MS or e.stop_ms < tr.end_ms - JITTER_MS
                      or not tr.stopped or e.start_ms - tr.start_ms < e.stop_ms - e.start_ms)
            if e.epoch_num is not None and tr.epoch_num is not None:
                other = e.epoch_num != tr.epoch_num
            else:
                other = any(j < i and s[1] > tr.start_ms + JITTER_MS and s[1] >= e.start_ms
                            for j, s in enumerate(spans))
            if beside and other:
                e.asynchronous = True
                break
    for tr in tl.trainings:
        tr.cut = (tr is tl.trainings[-1] and not tr.stopped and tr.end_ms >= run_stop_ms
                  and any(e.asynchronous and _overlap(e.start_ms, e.stop_ms, tr.start_ms, tr.end_ms) > JITTER_MS
                          for e in tl.evaluations))
        tr.blocked_ms = _length([(max(e.start_ms, tr.start_ms), min(e.stop_ms, tr.end_ms))
                                 for e in tl.evaluations if not e.asynchronous])

    # samples per training interval
    if counts_samples:
        nums = [tr.epoch_num for tr in tl.trainings]
        if any(n is None for n in nums):
            tl.samples_why = "its cycles carry no epoch_num (the training samples seen), so their samples are unknown"
        elif any(b <= a for a, b in zip([0] + nums, nums)):
            tl.samples_why = "its cycles' epoch_num (the training samples seen) does not grow from cycle to cycle"
        else:
            for prev, tr in zip([0] + nums, tl.trainings):
                tr.samples = tr.epoch_num - prev
    elif train_samples:
        for tr in tl.trainings:
            tr.samples = train_samples
    else:
        tl.samples_why = "no train_samples in the log"

    # the clock: training running, and evaluation with no training running
    training = _minus([(tr.start_ms, tr.end_ms) for tr in tl.trainings],
                      [(e.start_ms, e.stop_ms) for e in tl.evaluations if not e.asynchronous])
    training = [(max(a, run_start_ms), min(b, run_stop_ms)) for a, b in training]
    evals = [(max(e.start_ms, run_start_ms), min(e.stop_ms, run_stop_ms)) for e in tl.evaluations]
    tl.training_s = _length(training) / 1000.0
    tl.eval_on_clock_s = _length(_minus(evals, training)) / 1000.0
    tl.eval_beside_s = (_length(evals) - _length(_minus(evals, training))) / 1000.0
    return tl
