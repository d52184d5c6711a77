"""A run's timeline (hpckit/results/timeline.py): training intervals, evaluations that block
the training and evaluations beside it, as analyze, report and project read them.

Logs laid out as NVIDIA's v3.0 logs are (their event order from the code that wrote them,
cited at each helper), every published log under ../shared/real_logs, and, with
HPCKIT_RESULTS_V3=<an extracted mlcommons/hpc_results_v3.0>, the published eos_n80 OC20 and
eos_n260 OpenFold sets themselves (not in the kit). Expected figures come from the
timestamps the test wrote, or from bench/timeline_agreement.py's independent reading of the
raw lines, never from the kit's reader.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path

import pytest

from conftest import REAL_LOGS, REPO, run_hpckit

sys.path.insert(0, str(REPO / "bench"))
from timeline_agreement import independent  # noqa: E402

V3 = os.environ.get("HPCKIT_RESULTS_V3")
needs_v3 = pytest.mark.skipif(not V3 or not Path(V3).is_dir(),
                              reason="HPCKIT_RESULTS_V3 unset or not a folder: set it to an extracted "
                                     "mlcommons/hpc_results_v3.0 to read its NVIDIA OC20 and OpenFold sets")
EOS_N80 = "NVIDIA/results/eos_n80_ngc23.09_pytorch/strong/oc20"
EOS_N260 = "NVIDIA/results/eos_n260_ngc23.09_pytorch/strong/openfold"


def _rec(t, key, value=None, **meta):
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME", "key": key,
                                     "value": value, "metadata": {"file": "x.py", "lineno": 1, **meta}})


def _header(t, bench, org, platform, nodes, acc, batch, train, evals):
    return [_rec(t, k, v) for k, v in (("submission_benchmark", bench), ("submission_org", org),
                                       ("submission_division", "closed"), ("submission_status", "onprem"),
                                       ("submission_platform", platform), ("number_of_nodes", nodes),
                                       ("accelerators_per_node", acc), ("global_batch_size", batch),
                                       ("train_samples", train), ("eval_samples", evals))]


# NVIDIA's OC20 with --nodes_for_eval (mlcommons/hpc_results_v3.0@dfea490 NVIDIA/benchmarks/oc20/
# implementations/pytorch/ocpmodels/trainers/mlperf_forces_trainer.py:259-263, 315-319, 322-360):
# the training ranks log epoch_start N+1 as they hand epoch N's model over; the evaluation
# ranks then log eval_start N, eval_error, eval_stop N and epoch_stop N; run_stop comes from
# the training ranks when they learn the target was reached.
OC20_EPOCH_MS, OC20_EVAL_MS, OC20_EPOCHS = 19_000, 7_600, 6


def oc20_async_log(path: Path, start: int, org="NVIDIA", platform="10xDGX H100") -> Path:
    lines = _header(start - 1000, "oc20", org, platform, 10, 8, 256, 200_000, 99_986)
    lines.append(_rec(start, "run_start"))
    t = start
    lines.append(_rec(t, "epoch_start", epoch_num=1))
    for n in range(1, OC20_EPOCHS + 1):
        t += OC20_EPOCH_MS
        lines.append(_rec(t + 1, "epoch_start", epoch_num=n + 1))
        lines += [_rec(t, "eval_start", epoch_num=n),
                  _rec(t + OC20_EVAL_MS, "eval_error", 0.06 - 0.005 * n, epoch_num=n),
                  _rec(t + OC20_EVAL_MS, "eval_stop", epoch_num=n), _rec(t + OC20_EVAL_MS, "epoch_stop", epoch_num=n)]
    lines.append(_rec(t + OC20_EVAL_MS + 3_000, "run_stop", status="success"))
    path.write_text("\n".join(lines) + "\n")
    return path


# NVIDIA's OpenFold with --num_async_val_ranks (same commit, NVIDIA/benchmarks/openfold/
# implementations/pytorch/train.py:655-680, 1315-1336; its eos_n260 logs): the starting
# checkpoint is evaluated (epoch_num 0) while the first cycle trains, and each cycle's model
# while the next cycle trains; epoch_num counts the training samples seen.
OF_PER_CYCLE, OF_CYCLE_MS, OF_EVAL_MS, OF_CYCLES = 10_240, 26_500, 25_400, 8


def openfold_async_log(path: Path, start: int, org="NVIDIA", platform="260xDGX H100") -> Path:
    lines = _header(start - 1000, "openfold", org, platform, 260, 8, 256, 594_595, 180)
    lines.append(_rec(start, "run_start"))
    lines.append(_rec(start + 10_000, "eval_start", epoch_num=0))
    lines += [_rec(start + 17_000, "epoch_start", epoch_num=OF_PER_CYCLE),
              _rec(start + 57_000, "epoch_stop", epoch_num=OF_PER_CYCLE),
              _rec(start + 109_000, "eval_accuracy", 0.70, epoch_num=0), _rec(start + 109_000, "eval_stop", epoch_num=0)]
    t = start + 110_000
    for c in range(2, OF_CYCLES + 2):
        n, seen = c * OF_PER_CYCLE, (c - 1) * OF_PER_CYCLE
        # one evaluation ends as its cycle does (HPE+LBNL's perlmutter_224x4 result_6: 95,920)
        took = OF_CYCLE_MS - 240 if c == 3 else OF_EVAL_MS
        lines += [_rec(t, "epoch_start", epoch_num=n), _rec(t + 240, "eval_start", epoch_num=seen),
                  _rec(t + 240 + took, "eval_accuracy", 0.72 + 0.01 * c, epoch_num=seen),
                  _rec(t + 240 + took, "eval_stop", epoch_num=seen)]
        if c == OF_CYCLES + 1:    # the target reached by the evaluation beside this cycle: run_stop
            lines.append(_rec(t + 240 + took, "run_stop", status="success"))
            break
        lines.append(_rec(t + OF_CYCLE_MS, "epoch_stop", epoch_num=n))
        t += OF_CYCLE_MS + 1_000
    path.write_text("\n".join(lines) + "\n")
    return path


def _set(d: Path, make, n=3, **kw) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        make(d / f"result_{i}.txt", 10_000_000 * (i + 1) + 137 * i, **kw)
    return d


def test_epochs_overlapping_their_evaluation_train_until_the_next_epoch(tmp_path):
    """NVIDIA's OC20 order: an epoch trains until the next one starts, its evaluation runs
    beside the next epoch, the clock spends no time in evaluation alone (analyze said 23x
    the samples/s and a 40 % evaluation share)."""
    from hpckit.results.analysis import run_facts
    log = oc20_async_log(tmp_path / "result_0.txt", 10_000_000)
    f = run_facts(log, "published")
    units = 80
    assert f.steady_per_unit == pytest.approx(200_000 / (OC20_EPOCH_MS / 1000.0) / units, rel=1e-3)
    assert f.eval_share == pytest.approx(0.0, abs=1e-4)
    assert f.epoch_times == pytest.approx([OC20_EPOCH_MS / 1000.0] * OC20_EPOCHS, abs=0.002)
    assert f.eval_mode == "asynchronous" and f.evaluations == f.evaluations_beside == OC20_EPOCHS
    assert f.eval_beside_s == pytest.approx(OC20_EPOCHS * OC20_EVAL_MS / 1000.0, rel=1e-3)
    ind = independent(log)
    assert f.steady_per_unit == pytest.approx(ind["per_unit"], rel=1e-3)
    assert f.eval_share <= ind["allowed_eval_share"] + 1e-9


def test_openfold_evaluated_on_other_ranks_has_a_throughput(tmp_path):
    """NVIDIA's OpenFold order: each cycle's samples (epoch_num's growth) over its training
    time; only the first evaluation's time the training waited for is on the clock (analyze
    said throughput n/a and 90 % evaluation); its epochs to converge are the samples its last
    evaluation saw over train_samples."""
    from hpckit.results.analysis import run_facts
    log = openfold_async_log(tmp_path / "result_0.txt", 10_000_000)
    f = run_facts(log, "published")
    units = 260 * 8
    assert f.steady_per_unit == pytest.approx(OF_PER_CYCLE / (OF_CYCLE_MS / 1000.0) / units, rel=1e-6)
    assert f.eval_mode == "asynchronous" and f.evaluations_beside == f.evaluations == OF_CYCLES + 1
    assert f.cycle_times[0] == pytest.approx(40.0) and f.interval_samples == [OF_PER_CYCLE] * OF_CYCLES
    # on the clock: the first evaluation before the first cycle and after it, until the second
    waited = (17_000 - 10_000) + (109_000 - 57_000)
    total = f.total_s * 1000.0
    assert f.eval_share == pytest.approx(waited / total, rel=1e-6)
    assert f.epochs_to_converge == pytest.approx(OF_CYCLES * OF_PER_CYCLE / 594_595)
    ind = independent(log)
    assert f.steady_per_unit == pytest.approx(ind["per_unit"], rel=0.10)
    assert f.eval_share <= ind["allowed_eval_share"] + 1e-9


def test_analyze_and_project_read_the_asynchronous_sets(tmp_path):
    """The command line: analyze prints both sets' training samples/s per unit and the
    evaluation beside the training; `project` projects OpenFold from its runs' throughput."""
    oc20 = _set(tmp_path / "oc20", oc20_async_log)
    of = _set(tmp_path / "openfold", openfold_async_log)
    proc = run_hpckit("analyze", "--published", oc20, of, check=True)
    lines = {b: next(ln for ln in proc.stdout.splitlines() if f"| {b} strong" in ln) for b in ("oc20", "openfold")}
    train = {b: float(re.search(r"\| train ([0-9.e+]+) eval", ln).group(1)) for b, ln in lines.items()}
    assert train["oc20"] == pytest.approx(200_000 / 19.0 / 80, rel=0.01), lines["oc20"]
    # every cycle's samples over the cycles' training time, the first (40 s) included
    whole = OF_CYCLES * OF_PER_CYCLE / (40.0 + (OF_CYCLES - 1) * OF_CYCLE_MS / 1000.0) / 2080
    assert train["openfold"] == pytest.approx(whole, rel=0.01), lines["openfold"]
    assert "(share 0.0%, beside training" in lines["oc20"] and "beside training" in lines["openfold"]
    js = tmp_path / "p.json"
    proj = run_hpckit("project", "--benchmark", "openfold", "--units", 4160, "--local-batch", 1, "--from", of,
                      "--epochs-from", of, "--json", js, check=True)
    p = json.loads(js.read_text())
    assert p["throughput"]["per_unit"] == pytest.approx(OF_PER_CYCLE / (OF_CYCLE_MS / 1000.0) / 2080, rel=1e-6)
    assert p["epochs"]["p50"] == pytest.approx(OF_CYCLES * OF_PER_CYCLE / 594_595, rel=1e-5), proj.stdout


def test_the_report_draws_the_asynchronous_sets_and_log_text_as_plain_text(tmp_path):
    """The report's throughput chart and tables give both sets a training rate per unit (the
    OpenFold row said `n/a: OpenFold counts no epochs`), and an org or system name with
    matplotlib math markup (`$...$`, from an untrusted log: here a site's) is drawn as the
    text it is (it stopped the report with a ParseException)."""
    oc20 = _set(tmp_path / "oc20", oc20_async_log, org="Lab $\\nosuchcommand$", platform="sys$_{2$ x")
    of = _set(tmp_path / "openfold", openfold_async_log)
    out = tmp_path / "rep"
    proc = run_hpckit("report", oc20, "--published", of, "--out", out)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    page = (out / "index.html").read_text()
    assert "Lab $\\nosuchcommand$" in page and "sys$_{2$ x" in page
    sets = re.search(r'<table id="sets".*?</table>', page, re.S).group(0)
    for bench, want in (("oc20", 200_000 / 19.0 / 80), ("openfold", OF_PER_CYCLE / 26.5 / 2080)):
        row = re.search(rf'<tr class="set \w+" data-benchmark="{bench}">.*?</tr>', sets, re.S).group(0)
        per_unit = re.search(r'<td class="per-unit"[^>]*>([^<]+)</td>', row).group(1)
        assert float(per_unit) == pytest.approx(want, rel=0.01), row
    for png in ("tts.png", "throughput.png", "scaling.png"):
        assert (out / png).stat().st_size > 1000


def test_log_axes_say_plain_numbers():
    """With math markup off (text from logs is drawn as written), the report's log axes are
    labelled 0.06, 0.1, 0.2, not matplotlib's `$\\mathdefault{10^{-1}}$` drawn raw."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from hpckit.results.report import _plain_ticks
    with matplotlib.rc_context({"text.parse_math": False}):
        fig, ax = plt.subplots()
        ax.barh([0, 1], [0.18, 0.16])
        ax.set_xscale("log")
        ax.set_xlim(0.05, 0.5)
        _plain_ticks(fig)
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels(which="both") if t.get_text()]
        plt.close(fig)
    assert labels and not any("$" in t for t in labels) and "0.1" in labels, labels


def _every_shared_log() -> list[Path]:
    return sorted(p for p in REAL_LOGS.rglob("*.txt") if p.is_file() and p.name != "README.md") \
        if REAL_LOGS.is_dir() else []


@pytest.mark.skipif(not _every_shared_log(), reason=f"published logs not present under {REAL_LOGS}")
def test_every_shared_published_log_against_an_independent_reading():
    """Every published log beside the repository (CosmoFlow and DeepCAM of v0.7-v2.0, all
    evaluating on the training ranks): the kit's training samples/s per unit within 10 % of
    the independent reading, its evaluation share within what the log allows."""
    from hpckit.results.analysis import run_facts
    from hpckit.results.logs import parse_log
    checked = 0
    for path in _every_shared_log():
        if parse_log(path, strict=False).problem:
            continue
        f, ind = run_facts(path, "published"), independent(path)
        assert (f.steady_per_unit is None) == (ind["per_unit"] is None), (path, f.steady_per_unit, ind)
        if f.steady_per_unit is not None:
            assert f.steady_per_unit == pytest.approx(ind["per_unit"], rel=0.10), path
        assert f.eval_share <= ind["allowed_eval_share"] + 0.005, (path, f.eval_share, ind)
        assert f.eval_mode in ("blocking", "none"), (path, f.eval_mode)
        checked += 1
    assert checked >= 50, checked


@needs_v3
def test_the_published_nvidia_oc20_and_openfold_sets():
    """eos_n80 OC20 (640 H100) and eos_n260 OpenFold (2080 H100), v3.0: analyze's training
    samples/s per accelerator within 10 % of the independent reading (about 167 and 0.18;
    analyze said 4.3e3 and n/a) and an evaluation share within what each log allows."""
    from hpckit.results.analysis import run_facts
    root = Path(V3)
    for folder, lo, hi in ((EOS_N80, 150, 185), (EOS_N260, 0.15, 0.20)):
        logs = sorted((root / folder).glob("result_*.txt"))
        assert logs, folder
        kit, ind = [], []
        for log in logs:
            f, i = run_facts(log, "published"), independent(log)
            assert f.eval_share <= i["allowed_eval_share"] + 0.005, (log, f.eval_share, i)
            kit.append(f.steady_per_unit)
            ind.append(i["per_unit"])
        assert None not in kit, (folder, kit)
        k, r = statistics.median(kit), statistics.median(ind)
        assert k == pytest.approx(r, rel=0.10) and lo < k < hi, (folder, k, r)
        assert run_facts(logs[0], "published").eval_mode == "asynchronous"


@needs_v3
def test_validation_predicts_the_published_openfold_sets(tmp_path):
    """`project --validate` on v3.0's OC20 and OpenFold folders: every OpenFold set has a
    prediction (it had `skipped: no epochs to predict`); NVIDIA's eos_n260, whose evaluation
    runs beside the training, within 10 % with its own epochs (the time model alone), and
    the projection from its runs gives its training samples/s per accelerator."""
    root = Path(V3)
    folders = sorted({p.parent for bench in ("oc20", "openfold") for p in root.glob(f"*/results/*/*/{bench}/result_*.txt")})
    js = tmp_path / "v.json"
    run_hpckit("project", "--validate", "--published", *folders, "--json", js, check=True, timeout=900)
    doc = json.loads(js.read_text())
    openfold = [r for r in doc["sets"] if r["benchmark"] == "openfold"]
    assert len(openfold) >= 4 and all("error" in r for r in openfold), openfold
    (eos,) = [r for r in openfold if r["system"] == "eos_n260_ngc23.09_pytorch"]
    assert abs(eos["error_epochs_known"]) < 0.10, eos
    assert {g["benchmark"] for g in doc["summary"]} >= {"oc20", "openfold"}
    runs = root / EOS_N260
    pj = tmp_path / "p.json"
    run_hpckit("project", "--benchmark", "openfold", "--units", 2080, "--local-batch", 1, "--from", runs,
               "--epochs-from", runs, "--json", pj, check=True, timeout=600)
    per_unit = json.loads(pj.read_text())["throughput"]["per_unit"]
    ind = statistics.median(independent(p)["per_unit"] for p in sorted(runs.glob("result_*.txt")))
    assert per_unit == pytest.approx(ind, rel=0.10), (per_unit, ind)
