"""`hpckit report`: the time-to-solution report of a site's runs, beside published ones.

    hpckit report RUNS... --out DIR [--published PATH ...] [--perflog FILE_OR_DIR ...]
                  [--site PROFILE] [--runs-of SET ...]

Writes DIR/index.html (self-contained: tables and relative links to PNGs in DIR). Every
figure and table is per set (system x benchmark x scaling), never per run, so that a whole
published round (1,000+ logs) gives a page of bounded length:

* what each set's data is (tag_data): the closed division's data (published closed sets, the
  sizes of the shipped convergence record; a kit reference-config run of such a size), or
  another config or data size (the kit's mini ruleset), `table#sets` column `data`;
* time to solution per set, `tts.png` and `table#sets`: per benchmark and data set a panel of
  its own with its own time axis, titled with what the data is (a time to train is epochs of
  one data set: the mini ruleset's 0.3 min never shares an axis with a closed-division set's
  2 min), `ul#tts-panels`; in a panel the site's sets
  first, then the published ones (at most MAX_PUBLISHED_BARS drawn, the fastest); a strong
  set's median run (whisker: fastest to slowest run that counts), a weak set's
  time_to_train_all (one row, its instances' spread drawn), and the median run split into
  staging, training and evaluation (from the MLPerf log events staging_start/stop,
  eval_start/stop, inside run_start..run_stop); labels name submitter, system, scaling and
  nodes x accelerators; with --site the site's sets carry the profile's system name and node
  description (site_profiles/<site>/system.yaml);
* beside it, what compares across data sizes, `throughput.png` and `table#sets`: training
  samples/s per compute unit after the warm-up (the reference network's sets, published and
  kit reference runs of any size, on one axis; another config's apart), and for the kit's runs
  the input wait (summary.json usage.input_wait_share) and GPU busy share, n/a with the reason
  where not recorded, `ul#throughput-panels`;
* every run of one set only when asked (`--runs-of SET`): `runs-N.png` (a time line of fixed
  size) and `table#runs`;
* scores per set (`hpckit.results.score`: olympic mean / time_to_train_all), `table#scores`;
* epoch throughput and epochs to converge against global batch size and compute units, one
  point per set (median, whiskers min-max), `scaling.png`;
* the compute budget per set (unit-hours = time to train x compute units), `table#budget`;
* ReFrame's performance logs (the `filelog` perflog handler of a site profile, fields
  separated by '|', a header line first): each performance variable over time with the
  reference and allowed range it was judged against drawn in (failed figures circled in
  red), `history.png` (at most MAX_HISTORY_PANELS variables), and the latest figure per
  variable with its allowed range, `table#perflog`.

Compute units: nodes x accelerators per node; on CPU-only runs (0 accelerators) the
ranks of the kit's logged config, else the nodes. Numbers in the tables carry their
unrounded value in a `data-value` attribute.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hpckit.common.errors import KitError
from hpckit.results.logs import NO_EPOCHS
from hpckit.results.perflog import allowed_range, read_perflogs

PNGS = ("tts.png", "throughput.png", "scaling.png", "convergence.png", "projection.png", "history.png")


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="the site's runs: kit output directories (mlperf.log), result logs, or directories of them")
    from hpckit.common.fileio import output_dir
    p.add_argument("--out", required=True, type=output_dir("--out", "new"),
                   help="report directory (index.html and the PNGs go there): a new or empty directory in an "
                        "existing one; the report appears there whole or not at all")
    p.add_argument("--published", nargs="+", action="extend", default=[], metavar="PATH",
                   help="published result logs or directories of them (e.g. a results repository's sets)")
    p.add_argument("--perflog", nargs="+", action="extend", default=[], metavar="FILE_OR_DIR",
                   help="ReFrame performance logs (files, or a perflogs/ directory searched for *.log)")
    p.add_argument("--site", metavar="PROFILE",
                   help="the site profile the runs were made on (a name under site_profiles/ or a directory with "
                        "system.yaml): the site's sets carry its system name and node description")
    p.add_argument("--runs-of", action="append", default=[], metavar="SET",
                   help="also show every run of this set (its id in table#sets, or a part of it naming one set): "
                        "a per-run table and figure; repeatable")
    p.add_argument("--project", action="append", default=[], metavar="UNITS:LOCAL_BATCH",
                   help="also project the site's time to train at this scale (as hpckit project) and mark it on "
                        "the map; repeatable, e.g. --project 512:2")
    p.add_argument("--title", default="MLPerf HPC time-to-solution report")


from hpckit.results.analysis import RunFacts, gather, median, run_facts, _set_label  # noqa: F401  (re-exported)


# ---- sets: what the figures draw (one entry per system x benchmark x scaling) --------------

# Bounds that keep every figure readable whatever the input: a figure draws sets, never
# one mark per run, and at most this many published sets per benchmark (the fastest; all
# of them are in table#sets), the site's sets always.
MAX_PUBLISHED_BARS = 16
MAX_SITE_BARS = 8
MAX_HISTORY_PANELS = 12
COLORS = {"staging": "#d95f02", "training": "#1b9e77", "evaluation": "#7570b3", "waiting": "#cccccc"}
ORIGIN_COLORS = {"site": "#e7298a", "published": "#386cb0"}


@dataclass
class SetView:
    origin: str
    sid: str                      # origin:org/system/scaling/benchmark, what --runs-of names
    org: str
    system: str
    benchmark: str
    scaling: str
    node: str                     # node description (site profile / published system JSON)
    scale: str                    # nodes x accelerators (weak: models x instance)
    score: dict
    facts: list                   # RunFacts of every run shown
    counted: list                 # those that count for the score
    median: RunFacts | None = None
    total_s: float | None = None  # median run (strong) or time_to_train_all (weak)
    lo_s: float | None = None     # spread of the runs' times to train (weak: instances')
    hi_s: float | None = None
    division: str = ""
    # what its data is (tag_data): every run of a view has one config and data set
    config: str = "official"      # a kit run's config (mini, reference); `official`: a log without one
    dataset: str | None = None    # RunFacts.dataset: config/train samples
    train_samples: int | None = None
    axis: str = ""                # the time-to-train axis it shares: `official/N` (closed division's data), or its own
    closed_data: bool = False     # on the data of published closed-division sets
    data_text: str = ""           # the table's words for it
    model: str = "reference"      # the throughput axis: the reference network and samples, or the config's own
    # the figures that compare across data sizes (medians of the runs that count)
    per_unit: float | None = None    # steady training samples/s per compute unit
    per_unit_why: str = ""           # why per_unit is n/a
    unit: str = ""                   # what a compute unit is: accelerator, rank (CPU), node
    input_wait: float | None = None  # share of the training loop waiting for the next batch
    gpu_busy: float | None = None    # share of it the GPU computed (CUDA runs)
    wait_why: str = ""               # why input_wait is n/a
    busy_why: str = ""               # why gpu_busy is n/a

    @property
    def label(self) -> str:
        text = f"{_middle(self.org, 16)} {_middle(self.system, 30)} | {self.scaling}" \
            + (f" {self.division}" if self.division not in ("closed", "") else "") + f" | {self.scale}" \
            + (f" | {_middle(self.config, 12)}" if self.config != "official" else "")
        return ("[site] " if self.origin == "site" else "") + text

    @property
    def samples_text(self) -> str:
        return f"{self.train_samples:,} samples" if self.train_samples else "samples not logged"


def _middle(text: str, width: int) -> str:
    """text cut in the middle to width characters: both ends of a system name tell systems apart."""
    if len(text) <= width:
        return text
    keep = width - 3
    return text[:keep - keep // 2] + "..." + text[len(text) - keep // 2:]


def _median_of(fs: list, key):
    """The median run: a run that was made, so of an even number the faster middle one."""
    if not fs:
        return None
    ordered = sorted(fs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _node_description(desc: dict) -> str:
    """'2x AMD EPYC 7742, 8x NVIDIA A100-SXM4-80GB' from a system description."""
    if not desc:
        return ""
    host = str(desc.get("host_processor_model_name") or "").strip()
    per = str(desc.get("host_processors_per_node") or "").strip()
    acc = str(desc.get("accelerators_per_node") or "").strip()
    acc_model = str(desc.get("accelerator_model_name") or "").strip()
    parts = []
    if host:
        parts.append(f"{per}x {host}" if per and per != "1" else host)
    if acc and acc not in ("0", "") and acc_model:
        parts.append(f"{acc}x {acc_model}")
    return ", ".join(parts)


def _scale_text(nodes, acc, models=None) -> str:
    n = nodes if nodes is not None and not isinstance(nodes, list) else \
        ("/".join(map(str, nodes)) if isinstance(nodes, list) else "?")
    nodes_text = f"{n} node" if n == 1 else f"{n} nodes"
    if acc:
        unit = f"{nodes_text} x {acc} acc"
    elif acc == 0:
        unit = f"{nodes_text}, CPU"
    else:
        unit = nodes_text
    return f"{models} x ({unit})" if models is not None else unit


def set_views(sets: list[dict], facts: dict, origin: str, site_desc: dict | None = None) -> list[SetView]:
    views = []
    for s in sets:
        every = [facts[r.path] for _, r in s["runs"] if r.path in facts]
        # a set's runs of another config or data size (a folder of mini and reference runs)
        # are a view of their own: one median never mixes data sets
        parts: dict[tuple, list] = {}
        for f in every:
            parts.setdefault((f.config, f.dataset), []).append(f)
        for (config, dataset), fs in parts.items():
            views.append(_set_view(s, fs, origin, site_desc, config, dataset, split=len(parts) > 1))
    # sets of one system and benchmark on other data (hpckit score splits a kit folder by config
    # and train samples) are named by their data set, as a split set's views are
    same: dict[str, list[SetView]] = {}
    for v in views:
        same.setdefault(v.sid, []).append(v)
    for group in same.values():
        if len(group) > 1 and len({(v.dataset, v.config) for v in group}) == len(group):
            for v in group:
                v.sid += f"@{v.dataset or v.config}"
    # a set id appears once (two folders of one system and benchmark: numbered)
    seen: dict[str, int] = {}
    for v in views:
        seen[v.sid] = seen.get(v.sid, 0) + 1
        if seen[v.sid] > 1:
            v.sid += f"#{seen[v.sid]}"
    return views


def _set_view(s: dict, fs: list, origin: str, site_desc: dict | None, config: str, dataset: str | None,
              split: bool) -> SetView:
    """The view of a set's runs of one config and data set (split: the set has others)."""
    from hpckit.results.score import _system_desc
    counted = [f for f in fs if f.log.path in s.get("counted_paths", set())]
    sc = s["score"]
    if origin == "site" and site_desc:
        system, node = str(s["platform"]), _node_description(site_desc)
    else:
        system, node = str(s["platform"]), _node_description(_system_desc(s.get("org_dir"), s.get("system")))
    accs = sorted({f.log.accelerators_per_node for f in fs if f.log.accelerators_per_node is not None})
    acc = accs[0] if len(accs) == 1 else None
    if acc is None and origin == "site" and site_desc:
        try:
            acc = int(str(site_desc.get("accelerators_per_node")))
        except ValueError:
            acc = None
    weak = sc["kind"] == "weak"
    models = sc.get("number_of_models") if weak else None
    nodes = s["nodes"]
    if split:   # the nodes of this view's runs
        counts = sorted({f.log.number_of_nodes for f in fs if f.log.number_of_nodes is not None})
        nodes = counts[0] if len(counts) == 1 else (counts or None)
    v = SetView(origin=origin, sid=f"{origin}:{s['org']}/{system}/{s['scaling']}/{s['benchmark']}"
                + (f"@{dataset or config}" if split else ""),
                org=str(s["org"]), system=system, benchmark=str(s["benchmark"]), scaling=sc["kind"],
                node=node, scale=_scale_text(nodes, acc, models), score=sc, facts=fs, counted=counted,
                division=str(next((f.log.division for f in fs if f.log.division), "")).lower(),
                config=config, dataset=dataset)
    basis = counted or fs
    v.median = _median_of(basis, key=lambda f: f.total_s)
    v.lo_s = min(f.total_s for f in basis)
    v.hi_s = max(f.total_s for f in basis)
    if weak:
        if sc.get("time_to_train_all_min") is not None and not split:
            v.total_s = sc["time_to_train_all_min"] * 60.0
        else:
            v.total_s = (max(f.log.run_stop_ms for f in basis) - min(f.log.run_start_ms for f in basis)) / 1000.0
    else:
        v.total_s = v.median.total_s
    _throughput_of(v, basis)
    return v


PUBLISHED_WAIT = "published MLPerf logs do not record it"
SITE_WAIT = ("not recorded: no summary.json with usage.input_wait_share beside the log (a log not written by the "
             "kit, or by a kit from before it)")


def _throughput_of(v: SetView, basis: list) -> None:
    """The figures that compare across data sizes, medians of the runs: training samples/s
    per compute unit after the warm-up, and the input wait and GPU busy shares the kit's runs
    recorded (n/a with the reason where none did, never 0)."""
    samples = median([f.train_samples for f in basis])
    v.train_samples = int(samples) if samples else None
    v.per_unit = median([f.steady_per_unit for f in basis])
    why = next((f.throughput_why for f in basis if f.throughput_why), "")
    v.per_unit_why = "" if v.per_unit is not None else why or "no compute units in the logs"
    f = v.median
    v.unit = ("accelerator" if f.log.number_of_nodes is not None and f.log.accelerators_per_node
              else "rank (CPU)" if f.ranks else "node" if f.log.number_of_nodes is not None else "")
    v.input_wait = median([f.input_wait for f in basis])
    v.gpu_busy = median([f.gpu_busy for f in basis])
    v.wait_why = v.busy_why = PUBLISHED_WAIT if v.origin == "published" else SITE_WAIT
    if v.input_wait is not None and v.gpu_busy is None:
        v.busy_why = "no CUDA device: GPU busy is measured on CUDA runs only"


# ---- what a set's data is: which time-to-train axis it may share -----------------------------

# The configs that train the reference network on full-size samples: a log without
# hpckit_config (a submission's, `official`) and the kit's reference config. Their samples/s
# compare whatever the number of train samples; another config (the kit's mini ruleset:
# smaller samples, a narrower network) has its own.
REFERENCE_MODEL = ("official", "reference")


def _official(n: int) -> str:
    """The data set name of n train samples on the closed division's data (RunFacts.dataset)."""
    return f"official/{int(float(f'{int(n):.3g}'))}"


def closed_datasets(views: list[SetView]) -> dict[str, set[str]]:
    """Per benchmark, the data sets of the published closed division: those of the
    --published closed-division sets and of the convergence record the kit ships (v0.7-v3.0)."""
    from hpckit.results.analysis import load_record
    out: dict[str, set[str]] = {}
    for v in views:
        if v.origin == "published" and v.division == "closed" and v.config == "official" and v.train_samples:
            out.setdefault(v.benchmark.lower(), set()).add(_official(v.train_samples))
    for p in load_record()[0]:
        if p.division == "closed" and p.dataset.startswith("official/"):
            out.setdefault(p.benchmark.lower(), set()).add(p.dataset)
    return out


def tag_data(views: list[SetView]) -> None:
    """Say what each set's data is, and so which axes it shares: its time to train only with
    sets on the same data set (the closed division's sizes: published closed sets, a kit
    reference-config run of that size; else its config and size alone), its samples/s per
    unit with every set of the same network and samples (the reference's, any data size)."""
    closed = closed_datasets(views)
    for v in views:
        n = v.train_samples
        samples = f"{n:,} train samples" if n else "train samples not logged"
        on_closed = v.config in REFERENCE_MODEL and bool(n) and _official(n) in closed.get(v.benchmark.lower(), ())
        v.closed_data = on_closed
        v.axis = _official(n) if on_closed else (v.dataset or f"{v.config}/?")
        v.model = "reference" if v.config in REFERENCE_MODEL else v.config
        if v.config == "official":
            v.data_text = f"{v.division or 'unknown'} division, {samples}" + (
                "" if on_closed or not n else " (no published closed-division set has this size)")
        elif v.config == "mini":
            v.data_text = f"mini ruleset (kit config mini), {samples}"
        else:
            v.data_text = f"kit config {v.config}, {samples}" + (
                " (the closed division's size)" if on_closed else "")


def panel_title(benchmark: str, axis: str, vs: list[SetView]) -> str:
    """What one time-to-train panel holds: the closed division's data, or which other."""
    sizes = sorted({v.train_samples for v in vs if v.train_samples})
    samples = (" / ".join(f"{n:,}" for n in sizes[:3]) + " train samples") if sizes else "train samples not logged"
    if all(v.closed_data for v in vs):
        return f"{benchmark}, closed-division data ({samples})"
    config = vs[0].config
    if not sizes:
        what = f"config {config}, train samples not logged"
    elif config == "mini":
        what = f"mini ruleset (kit config mini), {samples}"
    elif config == "official":
        what = f"{samples}, a size of no published closed-division set"
    else:
        what = f"kit config {config}, {samples}"
    return f"{benchmark}, {what}: not the closed division's data"


def _sets(n: int) -> str:
    return f"{n} set" if n == 1 else f"{n} sets"


def _bench_order(views: list[SetView]) -> list[str]:
    """The site's benchmarks first, then the others, each group by name."""
    site = sorted({v.benchmark for v in views if v.origin == "site"})
    return site + sorted({v.benchmark for v in views} - set(site))


def tts_panels(views: list[SetView]) -> list[tuple[str, str]]:
    """The time-to-train panels, (benchmark, axis): per benchmark one per data set, the
    closed division's first; a time to train is drawn only beside times on the same data."""
    out = []
    for bench in _bench_order(views):
        mine = [v for v in views if v.benchmark == bench]
        key = {a: (not any(v.closed_data for v in mine if v.axis == a),       # the closed division's data first,
                   not any(v.origin == "site" for v in mine if v.axis == a),  # the site's,
                   -max((v.train_samples or 0 for v in mine if v.axis == a), default=0), a)   # the largest
               for a in {v.axis for v in mine}}
        out += [(bench, a) for a in sorted(key, key=key.get)]
    return out


def throughput_panels(views: list[SetView]) -> list[tuple[str, str]]:
    """The samples/s panels, (benchmark, model): per benchmark the reference network's sets
    (published and kit reference runs, any data size) on one axis, another config's apart."""
    out = []
    for bench in _bench_order(views):
        models = {v.model for v in views if v.benchmark == bench}
        out += [(bench, m) for m in sorted(models, key=lambda m: (m != "reference", m))]
    return out


def shown_sets(views: list[SetView], benchmark: str, axis: str | None = None,
               model: str | None = None) -> tuple[list[SetView], int]:
    """The sets a figure draws for one benchmark (and data set axis, or network; site first,
    then the fastest published ones) and how many published sets were left out."""
    mine = [v for v in views if v.benchmark == benchmark and (axis is None or v.axis == axis)
            and (model is None or v.model == model)]
    site = [v for v in mine if v.origin == "site"][:MAX_SITE_BARS]
    if model is None:    # the fastest to train
        key = (lambda v: v.total_s if v.total_s is not None else math.inf)   # noqa: E731
    else:                # the highest samples/s per unit
        key = (lambda v: -v.per_unit if v.per_unit is not None else math.inf)   # noqa: E731
    pub = sorted((v for v in mine if v.origin == "published"), key=key)
    return site + pub[:MAX_PUBLISHED_BARS], max(0, len(pub) - MAX_PUBLISHED_BARS)


# ---- plots -----------------------------------------------------------------------------

def _plain_ticks(fig) -> None:
    """Log axes labelled with plain numbers (0.06, 0.1, 200, 1e+06): the figures are drawn
    with text.parse_math off (write_report), and matplotlib's default log labels are math
    markup (`$\\mathdefault{10^{2}}$`). Which ticks get a label is LogFormatter's choice."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                base = getattr(axis.get_transform(), "base", 10.0)
                axis.set_major_formatter(Plain(base=base))
                axis.set_minor_formatter(Plain(base=base, labelOnlyBase=False))


def _layout(fig) -> None:
    _plain_ticks(fig)
    fig.tight_layout()


def _save(fig, path: Path, tight: bool = False) -> None:
    """tight: the PNG grows to hold labels longer than the layout left room for (labels are
    cut to a bounded length, so the figure stays bounded)."""
    from hpckit.common.fileio import atomic_path
    _plain_ticks(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90, **({"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}))


def _plot_tts(plt, views: list[SetView], out: Path) -> list[tuple[str, list[SetView]]]:
    """Per benchmark and data set (tts_panels: the closed division's data, the kit's mini
    ruleset's, ... each a panel of its own with its own time axis, titled with what it is),
    one row per set: left, the set's time to train on a log scale (strong: the median run, the
    whisker from its fastest to its slowest run; weak: time_to_train_all, the whisker over its
    instances' own times to train); right, the median run's time split into staging, training
    and evaluation (weak: the median instance, and the wait until the last instance finished).
    Returns each panel's title and sets."""
    panels = tts_panels(views)
    rows = [shown_sets(views, b, axis=a) for b, a in panels]
    titles = [panel_title(b, a, [v for v in views if v.benchmark == b and v.axis == a]) for b, a in panels]
    heights = [0.27 * len(vs) + 1.2 for vs, _ in rows]
    fig, axes = plt.subplots(len(panels), 2, figsize=(14, sum(heights) + 0.4), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "width_ratios": [5, 3]})
    for (left, right), title, (vs, hidden) in zip(axes, titles, rows):
        y = list(range(len(vs)))
        totals = [v.total_s / 60.0 for v in vs]
        lows = [max(0.0, t - v.lo_s / 60.0) if v.scaling == "strong" else 0.0 for t, v in zip(totals, vs)]
        highs = [max(0.0, v.hi_s / 60.0 - t) if v.scaling == "strong" else 0.0 for t, v in zip(totals, vs)]
        floor = min(totals + [v.lo_s / 60.0 for v in vs]) / 3.0
        left.barh(y, [t - floor for t in totals], left=floor, color=[ORIGIN_COLORS[v.origin] for v in vs],
                  alpha=0.85, height=0.7)
        for i, v in enumerate(vs):
            if v.scaling == "weak":   # instances' own times to train, inside the set's time
                left.plot([v.lo_s / 60.0, v.hi_s / 60.0], [i, i], color="black", linewidth=1.2)
                left.plot([v.lo_s / 60.0, v.hi_s / 60.0], [i, i], "|", color="black", markersize=7)
                left.barh([i], [totals[i] - floor], left=floor, color="none", edgecolor="white", hatch="//",
                          height=0.7, linewidth=0)
        left.errorbar(totals, y, xerr=[lows, highs], fmt="none", ecolor="black", capsize=3, linewidth=1)
        for i, (t, v) in enumerate(zip(totals, vs)):
            left.text(max(t, v.hi_s / 60.0) * 1.12, i, f"{t:.3g}", va="center", fontsize=7)
        left.set_xscale("log")
        left.set_xlim(floor, max(totals + [v.hi_s / 60.0 for v in vs]) * 3.0)
        left.set_yticks(y, [v.label for v in vs], fontsize=7)
        for tick, v in zip(left.get_yticklabels(), vs):
            if v.origin == "site":
                tick.set_color(ORIGIN_COLORS["site"])
                tick.set_fontweight("bold")
        left.invert_yaxis()
        left.set_xlabel("time to train (min, log): strong = median run, weak (hatched) = time_to_train_all; "
                        "whisker = runs' min-max", fontsize=7)
        more = f"; {hidden} slower published sets in the sets table" if hidden else ""
        apart = not all(v.closed_data for v in vs)
        left.set_title(f"{title}: {_sets(len(vs))}{more}", fontsize=9, loc="left",
                       color="#b2182b" if apart else "black", fontweight="bold" if apart else "normal")
        left.grid(axis="x", alpha=0.3)

        lefts = [0.0] * len(vs)
        for part in ("staging", "training", "evaluation", "waiting"):
            vals = []
            for v in vs:
                m = v.median
                parts = {"staging": m.staging_s or 0.0, "training": m.train_s, "evaluation": m.eval_s,
                         "waiting": max(0.0, v.total_s - m.total_s) if v.scaling == "weak" else 0.0}
                whole = sum(parts.values()) or 1.0
                vals.append(100.0 * parts[part] / whole)
            if part == "waiting" and not any(vals):
                continue
            label = "weak: waiting for the last instance" if part == "waiting" else part
            right.barh(y, vals, left=lefts, color=COLORS[part], label=label, height=0.7)
            lefts = [a + b for a, b in zip(lefts, vals)]
        right.set_yticks(y, [""] * len(vs))
        right.set_xlim(0, 100)
        right.invert_yaxis()
        right.set_xlabel("median run's time to train (%)", fontsize=7)
        right.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=6, frameon=False)
    _layout(fig)
    _save(fig, out / "tts.png", tight=True)
    plt.close(fig)
    return [(t, vs) for t, (vs, _) in zip(titles, rows)]


def _plot_throughput(plt, views: list[SetView], out: Path) -> list[tuple[str, list[SetView]]]:
    """What compares across data sizes, beside the time to solution: per benchmark and
    network (throughput_panels: the reference's, published and kit reference runs of any
    number of train samples, on one axis; another config's, the mini ruleset's smaller samples
    and narrower network, in a panel of its own), one row per set labelled with its data:
    left, steady training samples/s per compute unit (the median of its runs, the whisker
    their min-max); right, for the kit's runs, the share of the training loop spent waiting
    for the next batch (bar) and the GPU busy (diamond, CUDA runs), `n/a` where not recorded.
    Returns each panel's title and sets."""
    panels = throughput_panels(views)
    rows = [shown_sets(views, b, model=m) for b, m in panels]
    heights = [0.27 * len(vs) + 1.2 for vs, _ in rows]
    fig, axes = plt.subplots(len(panels), 2, figsize=(14, sum(heights) + 0.4), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "width_ratios": [5, 3]})
    titles = []
    for (left, right), (bench, model), (vs, hidden) in zip(axes, panels, rows):
        title = (f"{bench}, the reference network and samples, any data size" if model == "reference"
                 else f"{bench}, kit config {model}: its own network and samples, not the reference's")
        titles.append(title)
        y = list(range(len(vs)))
        vals = [v.per_unit for v in vs]
        spread = [[f.steady_per_unit for f in (v.counted or v.facts) if f.steady_per_unit is not None] for v in vs]
        drawn = [x for x in vals if x] + [x for sp in spread for x in sp if x]
        lo = min(drawn) / 3.0 if drawn else 0.1
        left.barh(y, [(x - lo) if x else 0.0 for x in vals], left=lo, color=[ORIGIN_COLORS[v.origin] for v in vs],
                  alpha=0.85, height=0.7)
        for i, (v, x, sp) in enumerate(zip(vs, vals, spread)):
            if not x:
                left.text(lo * 1.12, i, f"n/a: {v.per_unit_why.split(' (')[0]}", va="center", fontsize=7,
                          color="#777777")
                continue
            if sp:
                left.errorbar([x], [i], xerr=[[max(0.0, x - min(sp))], [max(0.0, max(sp) - x)]], fmt="none",
                              ecolor="black", capsize=3, linewidth=1)
            left.text(max([x] + sp) * 1.12, i, f"{x:.3g}", va="center", fontsize=7)
        left.set_xscale("log")
        left.set_xlim(lo, (max(drawn) if drawn else 1.0) * 3.0)
        left.set_yticks(y, [f"{v.label} | {v.samples_text}" for v in vs], fontsize=7)
        for tick, v in zip(left.get_yticklabels(), vs):
            if v.origin == "site":
                tick.set_color(ORIGIN_COLORS["site"])
                tick.set_fontweight("bold")
        left.invert_yaxis()
        left.set_xlabel("samples between evaluations / training s, per compute unit (log), after the first "
                        "cycle; whisker = runs' min-max" if bench.lower() in NO_EPOCHS else
                        "training samples/s per compute unit (log; accelerator, CPU runs: rank), after the "
                        "first epoch; whisker = runs' min-max", fontsize=7)
        more = f"; {hidden} more published sets in the sets table" if hidden else ""
        left.set_title(f"{title}: {_sets(len(vs))}{more}", fontsize=9, loc="left",
                       color="black" if model == "reference" else "#b2182b",
                       fontweight="normal" if model == "reference" else "bold")
        left.grid(axis="x", alpha=0.3)

        waits = [100.0 * v.input_wait if v.input_wait is not None else 0.0 for v in vs]
        right.barh(y, waits, color="#a6761d", height=0.7, label="input wait (share of the training loop)")
        busy = [(100.0 * v.gpu_busy, i) for i, v in enumerate(vs) if v.gpu_busy is not None]
        if busy:
            right.plot([b for b, _ in busy], [i for _, i in busy], "D", color="black", markersize=5,
                       label="GPU busy")
        for i, v in enumerate(vs):
            note = (f"{v.input_wait:.2f}" if v.input_wait is not None else
                    "n/a: published log" if v.origin == "published" else "n/a: not recorded")
            right.text(min(waits[i] + 2.0, 80.0), i, note, va="center", fontsize=7,
                       color="black" if v.input_wait is not None else "#777777")
        right.set_yticks(y, [""] * len(vs))
        right.set_xlim(0, 100)
        right.invert_yaxis()
        right.set_xlabel("share of the training loop's time (%)", fontsize=7)
        right.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=6, frameon=False)
    _layout(fig)
    _save(fig, out / "throughput.png", tight=True)
    plt.close(fig)
    return [(t, vs) for t, (vs, _) in zip(titles, rows)]


def _plot_runs(plt, v: SetView, out: Path, name: str) -> None:
    """Every run of one set in a figure of fixed size, whatever the number of runs. Strong
    scaling: a row per run from its own run_start, staging, training and evaluation stacked,
    slowest last (the runs were made one after another, possibly days apart). Weak scaling:
    the instances on one time line (minutes since the set's first run_start), staging first,
    so their overlap and the last one to finish show."""
    weak = v.scaling == "weak"
    fs = sorted(v.facts, key=(lambda f: f.log.run_start_ms) if weak else (lambda f: f.total_s))
    t0 = min(f.log.run_start_ms for f in fs)
    fig, ax = plt.subplots(figsize=(12, 5))
    y = list(range(len(fs)))
    starts = [(f.log.run_start_ms - t0) / 60000.0 if weak else 0.0 for f in fs]
    parts = [("staging", [(f.staging_s or 0.0) / 60.0 for f in fs])]
    if weak:
        parts.append(("training and evaluation", [f.total_s / 60.0 - (f.staging_s or 0.0) / 60.0 for f in fs]))
    else:
        parts += [("training", [f.train_s / 60.0 for f in fs]), ("evaluation", [f.eval_s / 60.0 for f in fs])]
    lefts = starts
    for label, vals in parts:
        color = COLORS.get(label, COLORS["training"])
        if label != "staging":   # a run that does not count for the score: grey
            color = [color if f in v.counted else "#999999" for f in fs]
        ax.barh(y, vals, left=lefts, color=color, label=label, height=0.8, linewidth=0)
        lefts = [a + b for a, b in zip(lefts, vals)]
    if len(fs) <= 40:
        ax.set_yticks(y, [_short(f) for f in fs], fontsize=7)
    else:
        ax.set_ylabel(f"{len(fs)} runs, by start time")
    ax.invert_yaxis()
    ax.set_xlabel(("minutes since the set's first run_start" if weak else "minutes since each run's run_start")
                  + " (grey: a run that does not count)")
    ax.set_title(f"{v.sid} ({v.data_text}): {len(fs)} runs", fontsize=9, loc="left")
    ax.set_xlim(left=0)
    ax.legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    _layout(fig)
    _save(fig, out / name)
    plt.close(fig)


def _short(f: RunFacts) -> str:
    """A compact run label: org/benchmark and the run's own name (file stem or folder)."""
    p = Path(f.name)
    run = p.parent.name if p.name == "mlperf.log" else p.stem.split("__")[-1]
    label = f"{f.log.org or '?'}/{f.log.benchmark or '?'} {run}"
    return label if len(label) <= 40 else label[:37] + "..."


def _plot_scaling(plt, views: list[SetView], out: Path) -> list[str]:
    """One point per set (the median of its runs, the whisker their min-max): epoch
    throughput and epochs to converge against compute units (per model instance for a weak
    set) and global batch size; a fixed size whatever the number of runs or sets. A set not
    on the closed division's data is a hollow marker with its data set in the legend.
    Returns the legends' labels."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    train = "training samples/s (an epoch's; OpenFold: a cycle's)"
    epochs = "epochs to converge (OpenFold: samples / train samples)"
    panels = [(axes[0][0], "compute_units", "epoch_throughput", "compute units (per instance)", train),
              (axes[0][1], "global_batch_size", "epoch_throughput", "global batch size", train),
              (axes[1][0], "compute_units", "epochs", "compute units (per instance)", epochs),
              (axes[1][1], "global_batch_size", "epochs", "global batch size", epochs)]
    markers = {"cosmoflow": "o", "deepcam": "s", "oc20": "D", "openfold": "^"}

    def value(f, attr):
        return f.epochs_to_converge if attr == "epochs" else getattr(f, attr)

    # a set not on the closed division's data is drawn hollow and named with its data set
    groups = sorted({(v.benchmark, v.closed_data, "" if v.closed_data else v.axis) for v in views},
                    key=lambda g: (_bench_order(views).index(g[0]), not g[1], g[2]))
    for ax, xa, ya, xl, yl in panels:
        for origin in ("published", "site"):
            for bench, closed, axis in groups:
                pts = []
                for v in views:
                    if v.origin != origin or v.benchmark != bench or v.closed_data != closed \
                            or (not closed and v.axis != axis):
                        continue
                    basis = v.counted or v.facts
                    xs = median([value(f, xa) for f in basis])
                    ys = [value(f, ya) for f in basis if value(f, ya)]
                    if xs and ys:
                        mid = median(ys)
                        pts.append((xs, mid, mid - min(ys), max(ys) - mid))
                if pts:
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[[p[2] for p in pts], [p[3] for p in pts]],
                                fmt=markers.get(bench, "v"), color=ORIGIN_COLORS[origin], alpha=0.8, capsize=2,
                                markersize=7 if origin == "site" else 5, markerfacecolor=None if closed else "none",
                                label=f"{origin} {bench}" + ("" if closed else f" ({axis}, not closed-division data)"))
        ax.set_xscale("log")
        ax.set_yscale("log")   # benchmarks differ by orders of magnitude (OpenFold: a fraction of an epoch)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("one point per set: median of its runs, whisker min-max", fontsize=9)
    _layout(fig)
    _save(fig, out / "scaling.png")
    labels = sorted({text for ax in fig.axes if ax.get_legend() for text in
                     (t.get_text() for t in ax.get_legend().get_texts())})
    plt.close(fig)
    return labels


def _plot_history(plt, rows: list[dict], out: Path) -> None:
    import matplotlib.dates as mdates
    variables = sorted({(r["var"], r["unit"]) for r in rows})
    hidden = max(0, len(variables) - MAX_HISTORY_PANELS)
    variables = variables[:MAX_HISTORY_PANELS]   # the rest: table#perflog
    if not variables:
        fig, ax = plt.subplots(figsize=(8, 2))
        ax.text(0.5, 0.5, "no ReFrame performance logs given (--perflog)", ha="center", va="center")
        ax.axis("off")
    else:
        ncols = 2 if len(variables) > 1 else 1
        nrows = math.ceil(len(variables) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(10, 2.8 * nrows), squeeze=False)
        for ax, (var, unit) in zip(axes.flat, variables):
            several = len({r["system"] for r in rows}) > 1
            for system, check in sorted({(r["system"], r["check"]) for r in rows if r["var"] == var}):
                series = [r for r in rows if r["var"] == var and r["check"] == check and r["system"] == system]
                line, = ax.plot([r["time"] for r in series], [r["value"] for r in series], marker="o",
                                label=f"{system} {check}" if several else check)
                _draw_references(ax, series, line.get_color())
            times = sorted({r["time"] for r in rows if r["var"] == var})
            if times[0] == times[-1]:  # one campaign: an hour around it, not years
                ax.set_xlim(times[0] - timedelta(minutes=30), times[0] + timedelta(minutes=30))
            ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
            ax.set_title(f"{var} ({unit})", fontsize=9)
            ax.tick_params(axis="x", labelsize=7, rotation=20)
            handles, labels = ax.get_legend_handles_labels()
            if len(handles) > 6:   # a legend of bounded size: the first six series named
                more = len(handles) - 6
                handles, labels = handles[:6], labels[:6]
                labels[-1] += f" (+{more} more)"
            ax.legend(handles, labels, fontsize=6)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(variables):]:
            ax.axis("off")
        if hidden:
            fig.suptitle(f"{hidden} more variables in the perflog table", fontsize=8)
    _layout(fig)
    _save(fig, out / "history.png")
    plt.close(fig)


def _draw_references(ax, series: list[dict], color: str) -> None:
    """The references the figures were judged against, drawn in: the reference as a dashed
    step line and the allowed range as a band (to the edge of the plot on an open side),
    both as they stood at each run (a recalibration moves them), and every figure ReFrame
    failed circled in red."""
    judged = [(r["time"], r["ref_value"], allowed_range(r)) for r in series if allowed_range(r)]
    if judged:
        times = [t for t, _, _ in judged]
        ax.step(times, [ref for _, ref, _ in judged], where="post", color=color, linestyle="--",
                linewidth=1, alpha=0.8)
        # an open side (a throughput has no upper bound) reaches past every figure drawn
        span = [r["value"] for r in series] + [ref for _, ref, _ in judged]
        top, bottom = max(span) * 1.05, min(0.0, min(span))
        lows = [lo if lo is not None else bottom for _, _, (lo, _) in judged]
        highs = [hi if hi is not None else top for _, _, (_, hi) in judged]
        if len(judged) == 1:   # one run: a short band around it, not an invisible line
            times = [times[0] - timedelta(minutes=5), times[0] + timedelta(minutes=5)]
            lows, highs = lows * 2, highs * 2
        ax.fill_between(times, lows, highs, step="post", color=color, alpha=0.15, linewidth=0)
    failed = [r for r in series if r["result"] == "fail"]
    if failed:
        ax.scatter([r["time"] for r in failed], [r["value"] for r in failed], s=80, facecolors="none",
                   edgecolors="red", linewidths=1.5, zorder=3)


# ---- HTML ------------------------------------------------------------------------------

# ---- the paper's analysis: convergence record (Fig. 2b), projection map (Fig. 2d) ------------

MAP_UNITS = [2 ** i for i in range(0, 13)]          # 1 .. 4096 compute units
MAP_BATCHES = [2 ** i for i in range(0, 14)]        # global batch 1 .. 8192


def parse_projection(text: str) -> tuple[int, int]:
    from hpckit.results.project import MAX_LOCAL_BATCH, MAX_UNITS
    try:
        n, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise KitError(f"--project {text[:40]}: UNITS:LOCAL_BATCH, e.g. 512:2") from None
    if not (1 <= n <= MAX_UNITS and 1 <= b <= MAX_LOCAL_BATCH):
        raise KitError(f"--project {text[:40]}: UNITS in 1..{MAX_UNITS}, LOCAL_BATCH in 1..{MAX_LOCAL_BATCH}")
    return n, b


def analysis_inputs(site_sets, pub_sets, facts) -> tuple[list, list, dict, list[str]]:
    """The convergence record (the published rounds the kit ships, the --published logs' and
    the site's converged runs) and one Projector per site benchmark: on the official dataset
    where the site ran the reference config (full-size samples), else on the site runs' own
    dataset and convergence. Returns (published points, site points, projectors, notes)."""
    from hpckit.results.analysis import load_record, record_points, same_submitter
    from hpckit.results.project import Projector
    shipped, _ = load_record()
    pub = record_points(pub_sets, facts)
    # a --published set the shipped record holds already (the same submitter's runs at the
    # same batch with the same epochs; the system may be named by its folder or by its logs)
    have = {(p.benchmark, p.dataset, p.global_batch_size, tuple(p.epochs)): p.org for p in pub}
    pub += [p for p in shipped
            if not same_submitter(have.get((p.benchmark, p.dataset, p.global_batch_size, tuple(p.epochs)), ""), p.org)]
    site = record_points(site_sets, facts)
    site_facts = [f for f in facts.values() if f.origin == "site"]
    projectors, notes = {}, []
    for bench in sorted({str(f.log.benchmark).lower() for f in site_facts}):
        runs = [f for f in site_facts if str(f.log.benchmark).lower() == bench]
        official = all(f.config == "reference" for f in runs)
        try:
            projectors[bench] = Projector.build(
                bench, runs, pub + site if official else site,
                "the published rounds" if official else "the site's converged runs",
                "official" if official else "runs")
        except KitError as e:
            notes.append(f"{bench}: no projection ({e})")
    return pub, site, projectors, notes


def _plot_convergence(plt, pub: list, site: list, out: Path) -> None:
    """Fig. 2b: epochs to converge against the global batch size, one point per set
    (median, whisker min-max), the fitted curve and the p10-p90 of one run; a panel per
    benchmark and dataset (the published official datasets, the site's own)."""
    import numpy as np
    from hpckit.results.analysis import fit_epochs
    panels = sorted({(p.benchmark, p.dataset) for p in pub + site if p.division == "closed"},
                    key=lambda k: (not k[1].startswith("official"), k))[:6]
    cols = min(3, max(1, len(panels)))
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    rounds = sorted({p.round for p in pub if p.round})
    cmap = plt.get_cmap("viridis", max(2, len(rounds)))
    for ax, (bench, dataset) in zip(axes.ravel(), panels):
        pts = [p for p in pub + site if p.benchmark == bench and p.dataset == dataset and p.division == "closed"]
        for p in pts:
            color = ORIGIN_COLORS["site"] if p.origin == "site" else cmap(rounds.index(p.round) if p.round in rounds
                                                                          else 0)
            med = p.median_epochs
            ax.errorbar([p.global_batch_size], [med], yerr=[[med - min(p.epochs)], [max(p.epochs) - med]],
                        fmt="s" if p.origin == "site" else "o", color=color, alpha=0.85, capsize=2,
                        markersize=7 if p.origin == "site" else 4)
        curve = fit_epochs(pts, bench, dataset)
        if curve is not None:
            bs = sorted({p.global_batch_size for p in pts})
            xs = np.geomspace(bs[0] / 1.5, bs[-1] * 1.5, 60)
            q = np.array([curve.quantiles(x) for x in xs])
            ax.fill_between(xs, q[:, 0], q[:, 2], color="#999999", alpha=0.25, linewidth=0,
                            label="one run, p10-p90")
            ax.plot(xs, [curve.at(x) for x in xs], color="black", linewidth=1.2, label=curve.describe().split(";")[0]
                    .split(": ", 1)[1])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch size")
        ax.set_ylabel("epochs to converge")
        ax.set_title(f"{bench} {dataset}: {len(pts)} sets", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for i, r in enumerate(rounds):
        axes.ravel()[0].plot([], [], "o", color=cmap(i), label=f"published {r}")
    if site:
        axes.ravel()[0].plot([], [], "s", color=ORIGIN_COLORS["site"], label="site")
    axes.ravel()[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Epochs to converge against global batch size (closed division; one point per set: median, "
                 "whisker min-max)", fontsize=9)
    _layout(fig)
    _save(fig, out / "convergence.png")
    plt.close(fig)


def _plot_map(plt, projectors: dict, projections: list[tuple[int, int]], out: Path) -> list[dict]:
    """Fig. 2d: the projected time to train (p50) of the site's system over compute units x
    global batch size (epochs from the convergence curve at B, throughput from the system
    model at N x B/N), the measured runs and the asked projections marked. Returns the
    projections' figures (table#projections)."""
    import numpy as np
    from matplotlib.colors import LogNorm
    rows = []
    benches = sorted(projectors)
    fig, axes = plt.subplots(1, max(1, len(benches)), figsize=(6.2 * max(1, len(benches)), 4.8), squeeze=False)
    if not benches:
        axes[0][0].text(0.5, 0.5, "no site run to project from", ha="center", va="center")
        axes[0][0].set_axis_off()
    for ax, bench in zip(axes[0], benches):
        pj = projectors[bench]
        grid = np.full((len(MAP_BATCHES), len(MAP_UNITS)), np.nan)
        for j, n in enumerate(MAP_UNITS):
            for i, batch in enumerate(MAP_BATCHES):
                if batch >= n:
                    grid[i, j] = pj.time_s(n, batch / n, pj.curve.at(batch)) / 60.0
        finite = grid[np.isfinite(grid)]
        mesh = ax.pcolormesh(range(len(MAP_UNITS) + 1), range(len(MAP_BATCHES) + 1), grid, cmap="magma_r",
                             norm=LogNorm(vmin=finite.min(), vmax=finite.max()), shading="flat")
        fig.colorbar(mesh, ax=ax, label="projected time to train, p50 (min)")
        cs = ax.contour(np.arange(len(MAP_UNITS)) + 0.5, np.arange(len(MAP_BATCHES)) + 0.5, grid,
                        levels=np.geomspace(finite.min(), finite.max(), 6)[1:-1], colors="white", linewidths=0.6)
        ax.clabel(cs, fmt=lambda v: f"{v:.3g} min", fontsize=6)
        pos = lambda v, axis: math.log2(v) + 0.5  # noqa: E731   cell centres on the log2 grid
        for u, lb, _, _, _ in pj.system.points:
            ax.plot(pos(u, 0), pos(u * lb, 1), "o", color=ORIGIN_COLORS["site"], markeredgecolor="white")
        for n, b in projections:
            r = pj.predict(n, b)
            rows.append(r)
            t = r["time_to_train_min"]
            if n <= MAP_UNITS[-1] and n * b <= MAP_BATCHES[-1]:
                ax.plot(pos(n, 0), pos(n * b, 1), "*", color="#00e5ff", markersize=14, markeredgecolor="black")
                ax.annotate(f"{n} x {b}: {t['p50']:.3g} min", (pos(n, 0), pos(n * b, 1)), xytext=(6, 6),
                            textcoords="offset points", fontsize=7, color="black",
                            bbox={"boxstyle": "round", "fc": "white", "alpha": 0.8})
        ax.set_xticks(np.arange(len(MAP_UNITS)) + 0.5, [str(u) for u in MAP_UNITS], fontsize=7)
        ax.set_yticks(np.arange(len(MAP_BATCHES)) + 0.5, [str(b) for b in MAP_BATCHES], fontsize=7)
        ax.set_xlabel("compute units")
        ax.set_ylabel("global batch size")
        ax.set_title(f"{bench}, dataset {pj.dataset} (models: the list under the figure)", fontsize=8)
    fig.suptitle("Projected time to train of the site's system (dots: measured runs, stars: --project)",
                 fontsize=9)
    _layout(fig)
    _save(fig, out / "projection.png")
    plt.close(fig)
    return rows


def _breakdown_rows(views: list[SetView]) -> list[str]:
    out = []
    for v in views:
        fs = v.counted or v.facts
        m = lambda attr: median([getattr(f, attr) for f in fs])  # noqa: E731
        units = m("compute_units")
        per = lambda x: x / units if x is not None and units else None  # noqa: E731
        cells = [v.label, m("init_s"), m("staging_s"), m("steady_epoch_s"), m("warmup_s"), m("eval_each_s"),
                 median([f.eval_share for f in fs]), m("staging_epoch_ratio"), per(m("steady_throughput")),
                 per(m("eval_throughput")), m("unit_hours")]
        no_epochs = next((f.no_epochs for f in fs if f.no_epochs), None)
        per_epoch = (3, 4, 7)     # epoch, warm-up, staging / epoch (OpenFold's throughput: its cycles')
        out.append(f'<tr class="{v.origin}"><td class="name">{html.escape(cells[0])}</td>'
                   + "".join(_na("", no_epochs) if no_epochs and i in per_epoch else _cell(c, "{:.3g}")
                             for i, c in enumerate(cells[1:], start=1))
                   + _data_cell(v) + _share_cell(v.input_wait, v.wait_why, "input-wait") + "</tr>")
    return out


def _projection_rows(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        t, e, p = r["time_to_train_min"], r["epochs"], r["parts_s"]
        cells = [r["benchmark"], r["dataset"], r["units"], r["local_batch"], r["global_batch_size"], t["p50"], t["p10"],
                 t["p90"], e["p50"], p["epoch"], p["eval_per_epoch"], r["throughput"]["per_unit"],
                 "; ".join(r["extrapolated"]) or "no"]
        out.append('<tr class="projection">' + "".join(_cell(c, "{:.3g}") if isinstance(c, float) else
                                                       f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return out


def analysis_section(pub, site, projectors, notes, views, projection_rows) -> str:
    from hpckit.results.analysis import fit_epochs
    fits = []
    for bench, dataset in sorted({(p.benchmark, p.dataset) for p in pub + site if p.division == "closed"}):
        c = fit_epochs(pub + site, bench, dataset)
        if c is not None:
            fits.append(f"<li>{html.escape(c.describe())}</li>")
    models = "".join(f"<li>{html.escape(b)}: {html.escape(p.system.describe())}; epochs from "
                     f"{html.escape(p.source)} ({html.escape(p.curve.describe())})</li>" for b, p in projectors.items())
    return "\n".join([
        "<h2>The paper's analysis</h2>",
        '<p class="note">After the MLPerf HPC paper (SC\'21 workshops, section 4): time to solution = staging + '
        "epochs(global batch) x (epoch + evaluation) + set-up. Fig. 1 is the time to solution breakdown above "
        "(<code>tts.png</code>); Fig. 2c the throughput against compute units (<code>scaling.png</code>). "
        "<code>hpckit analyze</code> and <code>hpckit project</code> print the same figures.</p>",
        "<h3>Breakdown per set</h3>",
        _table("breakdown", ["set", "init (s)", "staging (s)", "epoch, steady (s)", "warm-up (s)",
                             "one evaluation (s)", "eval share", "staging / epoch", "train samples/s per unit",
                             "eval samples/s per unit", "unit-hours per run", "data", "input wait"],
               _breakdown_rows(views)),
        "<h3>Epochs to converge against batch size (Fig. 2b)</h3>",
        '<img id="plot-convergence" src="convergence.png" alt="epochs to converge against global batch size '
        'with the fitted curve">',
        f'<ul id="curves">{"".join(fits)}</ul>',
        "<h3>Projected time to train of the site's system (Fig. 2d)</h3>",
        '<img id="plot-projection" src="projection.png" alt="projected time to train over compute units and '
        'global batch size">',
        f'<ul id="models">{models}</ul>' + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes),
        _table("projections", ["benchmark", "dataset", "units", "local batch", "global batch", "p50 (min)",
                               "p10 (min)", "p90 (min)", "epochs p50", "epoch (s)", "evaluation per epoch (s)",
                               "train samples/s per unit", "extrapolated"], _projection_rows(projection_rows)),
    ])


def _cell(value, fmt: str = "{:.2f}", cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    if value is None:
        return f"<td{c}>&ndash;</td>"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td{c} data-value="{value!r}">{html.escape(fmt.format(value))}</td>'
    return f"<td{c}>{html.escape(str(value))}</td>"


def _na(cls: str, why: str) -> str:
    """A cell of a figure the log does not have (not zero, not missing: none exists)."""
    return f'<td class="{(cls + " na").strip()}" title="{html.escape(why)}">n/a</td>'


def _epoch_cell(no_epochs: str | None, value, fmt: str, cls: str) -> str:
    return _na(cls, no_epochs) if no_epochs else _cell(value, fmt, cls)


def _table(tid: str, headers: list[str], rows: list[str]) -> str:
    """A table one line per row (cells never wrap: a row's height does not depend on its text),
    scrolled sideways inside the page's width when it is wider."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return (f'<div class="wide"><table id="{tid}"><thead><tr>{head}</tr></thead><tbody>\n'
            + "\n".join(rows) + "\n</tbody></table></div>")


def _score_rows(sets: list[dict], origin: str) -> list[str]:
    rows = []
    for s in sets:
        sc = s["score"]
        value = sc.get("score_min") if sc["kind"] == "strong" else sc.get("time_to_train_all_min")
        label = _set_label(s, origin)
        rows.append(
            f'<tr class="set {origin}" data-benchmark="{html.escape(str(s["benchmark"]))}">'
            + _cell(origin) + _cell(s["benchmark"]) + _cell(s["org"]) + _cell(s["platform"])
            + _cell(s["nodes"] if not isinstance(s["nodes"], list) else str(s["nodes"]), "{:d}")
            + _cell(len(s["runs"]), "{:d}") + _cell(sc["kind"])
            + _cell(sc.get("number_of_models"), "{:d}", "models") + _cell(sc.get("instance_scale"), "{:d}", "scale")
            + _cell(value, "{:.2f}", "score") + _cell("yes" if sc["valid"] else f"no: {sc['reason']}", cls="valid")
            + f'<td class="label">{html.escape(label)}</td></tr>')
    return rows


def _run_rows(facts: list[RunFacts]) -> list[str]:
    rows = []
    for f in facts:
        r = f.log
        why = (PUBLISHED_WAIT if f.origin == "published" else SITE_WAIT)
        rows.append(
            f'<tr class="run {f.origin}">' + _cell(f.origin) + f'<td class="name" title="{html.escape(f.name)}">'
            f"{html.escape(_short(f))}</td>" + _cell(r.benchmark) + _cell(f.dataset or f"{f.config}/?", cls="data")
            + _cell(r.number_of_nodes, "{:d}")
            + _cell(f.compute_units, "{:d}", "units") + _cell(f.global_batch_size, "{:d}", "batch")
            + _epoch_cell(f.no_epochs, r.epochs, "{:d}", "epochs") + _cell(r.time_to_train_min, "{:.2f}", "ttt")
            + _cell(f.staging_s, "{:.1f}", "staging") + _cell(f.train_s, "{:.1f}", "training")
            + _cell(f.eval_s, "{:.1f}", "evaluation") + _epoch_cell(f.no_epochs, f.epoch_s, "{:.2f}", "epoch")
            + _cell(f.epoch_throughput, "{:.1f}", "throughput")
            + _epoch_cell(f.no_epochs, f.staging_epoch_ratio, "{:.3f}", "ratio")
            + _cell(f.unit_hours, "{:.3f}", "unit-hours")
            + _cell("yes" if r.converged else "no", cls="converged")
            + _per_unit_cell(f.steady_per_unit, f.throughput_why if f.steady_throughput is None
                             else "no compute units in the log")
            + _share_cell(f.input_wait, why, "input-wait")
            + _share_cell(f.gpu_busy, "no CUDA device: GPU busy is measured on CUDA runs only"
                          if f.input_wait is not None else why, "gpu-busy") + "</tr>")
    return rows


def _set_rows(views: list[SetView]) -> list[str]:
    rows = []
    for v in views:
        m, basis = v.median, (v.counted or v.facts)
        spent = sum(f.unit_hours for f in v.facts if f.unit_hours is not None)
        no_epochs = next((f.no_epochs for f in basis if f.no_epochs), None)
        rows.append(
            f'<tr class="set {v.origin}" data-benchmark="{html.escape(v.benchmark)}">' + _cell(v.origin)
            + f'<td class="sid">{html.escape(v.sid)}</td>' + _cell(v.org, cls="org") + _cell(v.system, cls="system")
            + _cell(v.node or None, cls="node") + _cell(v.benchmark) + _data_cell(v) + _cell(v.scaling, cls="scaling")
            + _cell(v.scale, cls="scale") + _cell(len(v.facts), "{:d}", "runs") + _cell(len(v.counted), "{:d}", "counted")
            + _cell(v.total_s / 60.0, "{:.2f}", "ttt") + _cell(v.lo_s / 60.0, "{:.2f}", "ttt-min")
            + _cell(v.hi_s / 60.0, "{:.2f}", "ttt-max") + _cell(m.staging_s, "{:.1f}", "staging")
            + _cell(m.train_s, "{:.1f}", "training") + _cell(m.eval_s, "{:.1f}", "evaluation")
            + _epoch_cell(no_epochs, median([f.log.epochs for f in basis]), "{:g}", "epochs")
            + _cell(median([f.global_batch_size for f in basis]), "{:g}", "batch")
            + _cell(median([f.compute_units for f in basis]), "{:g}", "units")
            + _cell(median([f.epoch_throughput for f in basis]), "{:.1f}", "throughput")
            + _epoch_cell(no_epochs, median([f.staging_epoch_ratio for f in basis]), "{:.3f}", "ratio")
            + _cell(spent if any(f.unit_hours is not None for f in v.facts) else None, "{:.3f}", "unit-hours")
            + _per_unit_cell(v.per_unit, v.per_unit_why) + _cell(v.unit or None, cls="unit")
            + _share_cell(v.input_wait, v.wait_why, "input-wait") + _share_cell(v.gpu_busy, v.busy_why, "gpu-busy")
            + "</tr>")
    return rows


def _data_cell(v: SetView) -> str:
    """What the set's data is (tag_data), with its data set and time-to-train axis in the
    attributes; a set off the closed division's data is marked `apart`."""
    return (f'<td class="data{"" if v.closed_data else " apart"}" data-dataset="{html.escape(str(v.dataset))}" '
            f'data-axis="{html.escape(v.axis)}">{html.escape(v.data_text)}</td>')


def _per_unit_cell(value, why: str) -> str:
    return _cell(value, "{:.3g}", "per-unit") if value is not None else _na("per-unit", why)


def _share_cell(value, why: str, cls: str) -> str:
    """A share of the training loop's time; n/a with the reason where not recorded (never 0)."""
    return _cell(value, "{:.2f}", cls) if value is not None else _na(cls, why)


def _budget_rows(sets: list[dict], facts: dict, origin: str) -> list[str]:
    rows = []
    for s in sets:
        fs = [facts[r.path] for _, r in s["runs"] if r.path in facts]
        units = sorted({f.compute_units for f in fs if f.compute_units})
        unit = units[0] if len(units) == 1 else None
        sc = s["score"]
        score = sc.get("score_min") if sc["kind"] == "strong" else sc.get("time_to_train_all_min")
        per_result = score / 60.0 * unit if (score is not None and unit) else None
        spent = sum(f.unit_hours for f in fs if f.unit_hours is not None) if fs else None
        rows.append(f'<tr class="budget {origin}">' + _cell(_set_label(s, origin)) + _cell(unit, "{:d}", "units")
                    + _cell(score, "{:.2f}", "score") + _cell(per_result, "{:.3f}", "unit-hours-score")
                    + _cell(len(fs), "{:d}") + _cell(spent, "{:.3f}", "unit-hours-all") + "</tr>")
    return rows


def _perflog_rows(rows: list[dict]) -> list[str]:
    latest: dict[tuple, dict] = {}
    counts: dict[tuple, int] = {}
    for r in rows:
        k = (r["system"], r["check"], r["var"])
        latest[k] = r
        counts[k] = counts.get(k, 0) + 1
    out = []
    for k, r in sorted(latest.items()):
        out.append('<tr class="perf">' + _cell(r["system"]) + _cell(r["check"]) + _cell(r["var"])
                   + _cell(counts[k], "{:d}", "count") + _cell(r["value"], "{:.4g}", "value")
                   + _cell(r["unit"]) + _cell(r["ref"]) + _cell(r["result"], cls="result")
                   + _cell(r["time"].isoformat(timespec="seconds")) + _cell(_allowed_text(r), cls="allowed")
                   + "</tr>")
    return out


def _allowed_text(row: dict) -> str:
    band = allowed_range(row)
    if band is None:
        return "not judged"
    lo, hi = band
    return f"[{'-inf' if lo is None else f'{lo:.4g}'}, {'inf' if hi is None else f'{hi:.4g}'}]"


CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:12px}
div.wide{overflow-x:auto;max-width:100%}
th,td{border:1px solid #bbb;padding:2px 4px;text-align:right;white-space:nowrap}
th{background:#eee}td.name,td.label,td:first-child{text-align:left}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
p.note{font-size:13px;color:#555}"""


def _targets_text() -> str:
    from hpckit.results.logs import TARGETS
    return ", ".join(f"{b} {m} {op} {t}" for b, (m, op, t) in TARGETS.items())


def _panel_list(lid: str, panels: list[tuple[str, list[SetView]]]) -> str:
    """The panels a figure draws, each with its sets' ids (data-sets, separated by |): what
    each axis holds, in words."""
    items = "".join(f'<li data-sets="{html.escape("|".join(v.sid for v in vs))}">{html.escape(t)}: '
                    f"{_sets(len(vs))}</li>" for t, vs in panels)
    return f'<ul id="{lid}">{items}</ul>'


def render_html(title, site_sets, pub_sets, views, facts, perf_rows, inputs, runs_of=(), analysis="",
                tts=(), throughput=()) -> str:
    facts_list = list(facts.values())
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    hidden = sum(shown_sets(views, b, axis=a)[1] for b, a in tts_panels(views))
    apart = [v for v in views if not v.closed_data]
    per_run = []
    for i, v in enumerate(runs_of):
        per_run += [f'<h3 class="runs-of">Runs of {html.escape(v.sid)}</h3>',
                    f'<img id="plot-runs-{i}" src="runs-{i}.png" alt="the runs of {html.escape(v.sid)} on one time line">',
                    _table("runs" if i == 0 else f"runs-{i}",
                           ["origin", "run", "benchmark", "data set", "nodes", "compute units", "global batch",
                            "epochs", "time to train (min)", "staging (s)", "training (s)",
                            "evaluation (s)", "epoch (s)", "epoch throughput (samples/s)",
                            "staging / epoch", "unit-hours", "converged", "train samples/s per unit, steady",
                            "input wait", "GPU busy"], _run_rows(v.facts))]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">Generated {now} by hpckit report from {len(facts_list)} result logs '
        f"({sum(f.origin == 'site' for f in facts_list)} site, "
        f"{sum(f.origin == 'published' for f in facts_list)} published) in {len(views)} sets and "
        f"{len(perf_rows)} ReFrame performance records. Scores as <code>hpckit score</code>: "
        "strong scaling drops the fastest and the slowest run and averages the rest; a run "
        "converged when run_stop says success and the quality target was reached before it: "
        f"the official one for published logs ({html.escape(_targets_text())}), the target of "
        "the config a kit run logged (hpckit_config) for the kit's own runs.</p>",
        "<h2>Time to solution</h2>",
        '<p class="note" id="what-compares">A time to train is a number of epochs of one data set: it '
        "compares only between sets that trained on the same data. Each panel of the figure is one benchmark on "
        "one data set, with its own time axis, and its title says which: the closed division's data (the "
        "published closed-division sets, the data sizes of the record the kit ships; a kit run of the "
        "reference config on that many samples joins them), or another (the kit's mini ruleset, trained on a "
        "few hundred small synthetic samples in minutes on a CPU; another config or data size), drawn apart with "
        "its title in red. The column <em>data</em> of the sets table says the same for every set."
        + (f" Here {len(apart)} set{'s are' if len(apart) != 1 else ' is'} not on the closed division's data: "
           f"{html.escape('; '.join(f'{v.sid} ({v.data_text})' for v in apart[:6]))}"
           f"{'; ...' if len(apart) > 6 else ''}." if apart else "")
        + " What compares across data sizes is the throughput per compute unit (below).</p>",
        '<p class="note">One row per set (system x benchmark x scaling), the site\'s sets first. Strong scaling: '
        "the median run's time to train (run_start to run_stop), the whisker from the fastest to the slowest run "
        "that counts. Weak scaling (hatched): time_to_train_all, the black line the instances' own times to train. "
        "Right: the median run split into staging (staging_start..staging_stop inside the clock), evaluation "
        "(eval_start..eval_stop) and the rest, training; for a weak set also the wait until the last instance "
        f"finished. At most {MAX_PUBLISHED_BARS} published sets per benchmark are drawn, the fastest"
        + (f" ({hidden} more in the table below)" if hidden else "")
        + "; every run of one set: <code>--runs-of SET</code>.</p>",
        '<img id="plot-tts" src="tts.png" alt="time to train per set, a panel per benchmark and data set, split '
        'into staging, training and evaluation">',
        _panel_list("tts-panels", tts),
        "<h3>Throughput per compute unit and input wait</h3>",
        '<p class="note">Training samples/s per compute unit (an accelerator; on CPU runs a rank), the median of '
        "each set's runs after their first epoch (train_samples / epoch time without evaluation): the figure that "
        "compares a site's runs with published ones whatever the number of train samples, where both train the "
        "same network on samples of the same size. The reference network's sets (published, and the kit's "
        "reference config on any number of samples) share one axis; another config (the kit's mini ruleset: "
        "smaller samples, a narrower network) has its own. Beside it, for the kit's runs, the input wait: the "
        "share of the training loop's time spent waiting for the next batch (summary.json usage.input_wait_share; "
        "GPU busy, usage.gpu_busy_share, on CUDA runs). Published logs do not record them: n/a, never 0.</p>",
        '<img id="plot-throughput" src="throughput.png" alt="training samples/s per compute unit per set, and the '
        'input wait of the site\'s runs">',
        _panel_list("throughput-panels", throughput),
        "<h3>Every set</h3>",
        '<p class="note">Both figures\' numbers per set, every published set included: its data, time to train '
        "and its parts, throughput per compute unit and input wait.</p>",
        _table("sets", ["origin", "set", "submitter", "system", "node", "benchmark", "data", "scaling",
                        "nodes x accelerators", "runs", "counted", "time to train (min)", "min", "max",
                        "staging (s)", "training (s)", "evaluation (s)", "epochs", "global batch",
                        "compute units", "epoch throughput (samples/s)", "staging / epoch",
                        "unit-hours, all runs", "train samples/s per unit, steady", "compute unit",
                        "input wait", "GPU busy"], _set_rows(views)),
        *per_run,
        "<h2>Scores</h2>",
        _table("scores", ["origin", "benchmark", "org", "platform", "nodes", "runs", "scaling",
                          "models", "instance scale", "score (min)", "valid", "set"],
               _score_rows(site_sets, "site") + _score_rows(pub_sets, "published")),
        "<h2>Throughput and convergence against scale</h2>",
        '<p class="note">Epoch throughput = train_samples / mean epoch time without evaluation. '
        "Compute units = nodes x accelerators per node (CPU runs: ranks). One point per set.</p>",
        '<img id="plot-scaling" src="scaling.png" alt="epoch throughput and epochs to converge against batch size and compute units">',
        analysis,
        "<h2>Compute budget</h2>",
        '<p class="note">unit-hours = time to train x compute units; per result from the score, '
        "and spent by all runs of the set.</p>",
        _table("budget", ["set", "compute units", "score (min)", "unit-hours per result",
                          "runs", "unit-hours, all runs"],
               _budget_rows(site_sets, facts, "site") + _budget_rows(pub_sets, facts, "published")),
        "<h2>History (ReFrame performance logs)</h2>",
        '<img id="plot-history" src="history.png" alt="ReFrame performance variables over time">',
        _table("perflog", ["system/partition", "check", "variable", "records", "latest value",
                           "unit", "reference", "result", "latest time", "allowed range"],
               _perflog_rows(perf_rows)),
        provenance_section(facts_list),
        "<h2>Inputs</h2><ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in inputs) + "</ul>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def provenance_section(facts: list) -> str:
    """Per site run, the software stack and machine it recorded (hpckit.common.provenance:
    summary.json beside the log, else the log's hpckit_provenance line), `table#provenance`;
    runs whose stacks differ are told apart by the stack digest."""
    from hpckit.common.provenance import differences, of_run, stack, stack_digest
    rows, digests, stacks = [], set(), {}
    for f in facts:
        if f.origin != "site":
            continue
        prov = of_run(f.name) or {}
        kit, pk, c = prov.get("kit") or {}, prov.get("packages") or {}, prov.get("container") or {}
        s = stack(prov)
        digests.add(stack_digest(s) if s else None)
        if s:
            stacks.setdefault(stack_digest(s), s)
        fw = prov.get("frameworks") or {}
        commit = kit.get("commit")
        cells = [_short(f), (stack_digest(s) if s else "not recorded"),
                 f"{kit.get('version')} {commit[:12] if commit else ''}{' dirty' if kit.get('dirty') else ''}"
                 if prov else None,
                 (prov.get("python") or {}).get("version"),
                 ", ".join(f"{d} {fw[d]}" for d in ("torch", "tensorflow", "tensorflow-cpu") if fw.get(d)) or None,
                 f"{pk.get('count')}, sha256 {str(pk.get('sha256'))[:12]}" if pk else None,
                 str((prov.get("spack") or {}).get("lock_sha256") or "")[:12] or None,
                 " ".join(str(x) for x in (c.get("runtime"), c.get("image"), c.get("digest")) if x) or None,
                 (prov.get("host") or {}).get("name"), (prov.get("cpu") or {}).get("model"),
                 ", ".join((prov.get("gpu") or {}).get("models") or []) + (
                     f" (driver {prov['gpu'].get('driver')})" if prov.get("gpu") else "") or None]
        rows.append(f'<tr class="provenance"><td class="name" title="{html.escape(f.name)}">{html.escape(cells[0])}'
                    "</td>" + "".join(_cell(v) for v in cells[1:]) + "</tr>")
    distinct = digests - {None}
    first = next(iter(stacks), None)
    changes = "".join(f'<li>{html.escape(d)} against {html.escape(first)}: '
                      f'{html.escape("; ".join(differences(stacks[first], s)) or "digests differ")}</li>'
                      for d, s in list(stacks.items())[1:])
    return ("<h2>Provenance</h2>"
            f'<p class="note">The software stack and machine each site run recorded when it ran '
            f"(hpckit_provenance); {len(distinct)} distinct stack(s) among {len(rows)} runs"
            f"{'' if None not in digests else ' (some recorded none: logs from before hpckit_provenance)'}.</p>"
            + _table("provenance", ["run", "stack", "kit", "python", "frameworks", "packages", "spack.lock",
                                    "container", "host", "CPU", "GPU"], rows)
            + (f'<ul id="stack-changes">{changes}</ul>' if changes else ""))


def pick_set(views: list[SetView], want: str) -> SetView:
    """The set --runs-of names: its id, or a part of one id only."""
    exact = [v for v in views if v.sid == want]
    if exact:
        return exact[0]
    hits = [v for v in views if want in v.sid]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise KitError(f"--runs-of {want}: no set's id contains it (ids are listed in table#sets, "
                       f"e.g. {views[0].sid})")
    raise KitError(f"--runs-of {want}: {len(hits)} sets match ({', '.join(v.sid for v in hits[:3])}"
                   f"{', ...' if len(hits) > 3 else ''}); name one")


def main(args) -> int:
    from hpckit.common.fileio import check_new_dir

    projections = [parse_projection(t) for t in args.project]
    site_yaml = site_desc = None
    if args.site:
        from hpckit.results.package import load_system_yaml, resolve_site
        site_yaml = resolve_site(args.site)
        site_desc = load_system_yaml(site_yaml)
    # a report goes into a new (or empty) directory: an earlier report is never replaced
    check_new_dir(args.out, "--out", "hpckit report writes")
    seen: set = set()
    site_sets, site_facts = gather(args.runs, "site", seen)
    if not site_sets:
        raise KitError("no site runs left to report (every RUN repeats a --published log?)")
    if site_desc and site_desc.get("system_name"):
        # the site's runs were made on the profile's system, whatever platform they logged
        # (runs made by hand, or before the checks passed it, log the configs' `unknown`):
        # every table, figure and scores.json names it
        for s in site_sets:
            s["logged_platform"], s["platform"] = s["platform"], site_desc["system_name"]
            for _, r in s["runs"]:
                site_facts[r.path].set_label = _set_label(s, "site")
    pub_sets, pub_facts = gather(args.published, "published", seen)
    perf_rows = read_perflogs(args.perflog)
    facts = {**site_facts, **pub_facts}

    views = set_views(site_sets, facts, "site", site_desc) + set_views(pub_sets, facts, "published")
    tag_data(views)
    runs_of = [pick_set(views, want) for want in args.runs_of]
    from hpckit.common.fileio import staged_dir
    # built in a directory beside --out and renamed to it: whole or not at all
    with staged_dir(args.out, "--out", "hpckit report writes") as out:
        write_report(args, out, site_sets, pub_sets, facts, views, runs_of, perf_rows, projections, site_yaml)
    out = Path(args.out)
    for s in site_sets + pub_sets:
        sc = s["score"]
        from hpckit.results.score import figure
        shown = figure(sc) if sc["valid"] else f"invalid ({sc['reason']})"
        print(f"{s['benchmark']} | {s['org']} | {s['platform']} | {len(s['runs'])} runs | score {shown}")
    print(f"report -> {out / 'index.html'}")
    return 0


def _figures(plt, out: Path, views, site_sets, pub_sets, facts, perf_rows, projections, runs_of):
    """Every figure into `out`; what the page says of them."""
    tts = _plot_tts(plt, views, out)
    throughput = _plot_throughput(plt, views, out)
    _plot_scaling(plt, views, out)
    pub_points, site_points, projectors, notes = analysis_inputs(site_sets, pub_sets, facts)
    _plot_convergence(plt, pub_points, site_points, out)
    projection_rows = _plot_map(plt, projectors, projections, out)
    analysis = analysis_section(pub_points, site_points, projectors, notes, views, projection_rows)
    _plot_history(plt, perf_rows, out)
    for i, v in enumerate(runs_of):
        _plot_runs(plt, v, out, f"runs-{i}.png")
    return tts, throughput, analysis


def write_report(args, out: Path, site_sets, pub_sets, facts, views, runs_of, perf_rows, projections,
                 site_yaml) -> None:
    """Every file of the report, into `out` (the staged directory)."""
    from hpckit.common.fileio import atomic_write_json, atomic_write_text
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # every text drawn is plain text: org, system and check names come from logs and perflogs
    # (untrusted), and a `$` pair in one would be read as math markup (a ParseException)
    with matplotlib.rc_context({"text.parse_math": False}):
        tts, throughput, analysis = _figures(plt, out, views, site_sets, pub_sets, facts, perf_rows, projections,
                                             runs_of)
    inputs = [f"site: {a}" for a in args.runs] + [f"published: {a}" for a in args.published] \
        + [f"perflog: {a}" for a in args.perflog] + ([f"site profile: {site_yaml}"] if site_yaml else [])
    atomic_write_text(out / "index.html", render_html(args.title, site_sets, pub_sets, views, facts, perf_rows,
                                                      inputs, runs_of, analysis, tts, throughput))
    from hpckit.results.score import to_json
    atomic_write_json(out / "scores.json", {"site": to_json(site_sets), "published": to_json(pub_sets)})
