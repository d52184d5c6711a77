"""`hpckit analyze` and `hpckit project` on real logs.

Published inputs are the unmodified v2.0 result folders and the v1.0 NVIDIA CosmoFlow set
under ../shared/real_logs; the kit's inputs are DeepCAM mini runs it trained
(tests/mini_runs.py). Expected figures are computed here from the logs' raw :::MLLOG lines by
code of the test's own, not by the kit's reader.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import REAL_LOGS, REPO, run_hpckit

REAL = REAL_LOGS
V20 = REAL / "v2.0"
NV_COSMO = V20 / "NVIDIA" / "results" / "dgxa100_n64_pytorch" / "strong" / "cosmoflow"
needs_real = pytest.mark.skipif(not NV_COSMO.is_dir(), reason=f"real MLPerf logs not present under {REAL}")


def raw(path):
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if ":::MLLOG " in line:
            out.append(json.loads(line.split(":::MLLOG ", 1)[1]))
    return out


@needs_real
def test_breakdown_of_a_published_run(tmp_path):
    log = NV_COSMO / "result_0.txt"
    js = tmp_path / "an.json"
    proc = run_hpckit("analyze", "--published", log, "--json", js, "--runs")
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(js.read_text())["runs"]
    recs = raw(log)
    t = {}
    for r in recs:
        t.setdefault(r["key"], []).append(r["time_ms"])
    value = {r["key"]: r["value"] for r in recs}
    stop = t["run_stop"][0]
    assert run["init_s"] == pytest.approx((t["init_stop"][0] - t["init_start"][0]) / 1000)
    assert run["time_to_train_s"] == pytest.approx((stop - t["run_start"][0]) / 1000)
    starts = [x for x in t["epoch_start"] if x <= stop]
    assert run["epochs"] == len(starts) == len(run["cycles_s"])
    assert run["cycles_s"][:-1] == pytest.approx([(b - a) / 1000 for a, b in zip(starts, starts[1:])])
    evals = [(a, b) for a, b in zip(t["eval_start"], t["eval_stop"]) if b <= stop]
    assert run["evaluations"] == len(evals)
    assert run["eval_each_s"] == pytest.approx(sum(b - a for a, b in evals) / len(evals) / 1000)
    units = value["number_of_nodes"] * value["accelerators_per_node"]
    assert run["compute_units"] == units == 512 and run["local_batch"] == 1
    assert run["train_samples_per_s_per_unit"] == pytest.approx(run["train_samples_per_s"] / units)
    assert run["eval_samples_per_s"] == pytest.approx(value["eval_samples"] / run["eval_each_s"])
    assert run["eval_share"] == pytest.approx(run["eval_s"] / run["time_to_train_s"])
    assert run["unit_hours"] == pytest.approx(run["time_to_train_s"] / 3600 * units)
    assert run["dataset"] == "official/524000" and run["round"] == "v2.0"
    assert "result_0.txt" in proc.stdout and "unit_hours" in proc.stdout
    # after the warm-up: train_samples over the median of the epochs after the first (each
    # epoch_start to its epoch_stop, less the evaluations inside), per unit
    spans = list(zip([x for x in t["epoch_start"] if x <= stop], [x for x in t["epoch_stop"] if x <= stop]))
    train = [(b - a - sum(max(0, min(b, d) - max(a, c)) for c, d in evals)) / 1000 for a, b in spans]
    assert len(train) == run["epochs"]
    assert run["steady_samples_per_s_per_unit"] == pytest.approx(
        value["train_samples"] / float(np.median(train[1:])) / units, rel=1e-9)
    # a published log records no input wait: n/a, never 0
    line = next(x for x in proc.stdout.splitlines() if "result_0.txt" in x)
    assert line.endswith(" | input wait n/a") and "usage_input_wait_share" not in run


@needs_real
def test_the_shipped_record_holds_the_shared_published_sets(tmp_path):
    """The shipped record (`hpckit analyze --record` on hpc_results_v0.7-v3.0) has every
    converged set of the shared v2.0 folders with the same epochs per run."""
    rec = tmp_path / "record.json"
    proc = run_hpckit("analyze", "--published", V20, "--record", rec)
    assert proc.returncode == 0, proc.stderr
    mine = json.loads(rec.read_text())["points"]
    shipped = json.loads((REPO / "apps/hpckit/results/convergence_record.json").read_text())["points"]
    assert len(mine) >= 7
    key = lambda p: (p["system"], p["benchmark"], p["global_batch_size"], tuple(p["epochs"]))  # noqa: E731
    assert {key(p) for p in mine} <= {key(p) for p in shipped}
    assert "convergence record" in proc.stdout and "deepcam official/121000" in proc.stdout


def test_the_curve_fit_recovers_a_known_curve():
    from hpckit.results.analysis import Point, fit_epochs
    rng = np.random.default_rng(3)
    pts = []
    for i, b in enumerate([64, 128, 256, 512, 1024, 2048, 4096] * 3):
        true = 10 * (1 + b / 500)
        pts.append(Point("deepcam", "official/121000", "published", "v9", f"org{i}", f"sys{i}", "closed", "strong",
                         b, sorted(int(round(true * math.exp(rng.normal(0, 0.05)))) for _ in range(5))))
    c = fit_epochs(pts, "deepcam", "official/121000")
    assert c.model == "noise-scale"
    assert c.e_min == pytest.approx(10, rel=0.15) and c.b_noise == pytest.approx(500, rel=0.25)
    p10, p50, p90 = c.quantiles(1024)
    assert p10 < c.at(1024) * 1.05 and p10 < p50 < p90 and p50 == pytest.approx(10 * (1 + 1024 / 500), rel=0.1)
    assert c.slowest_of(1024, 100) > c.at(1024)
    # an open-division point and another dataset never enter the closed curve
    pts.append(Point("deepcam", "official/121000", "published", "v9", "x", "y", "open", "strong", 64, [500]))
    pts.append(Point("deepcam", "mini/256", "site", None, "x", "y", "closed", "strong", 64, [3]))
    assert fit_epochs(pts, "deepcam", "official/121000").at(64) == pytest.approx(c.at(64))
    # one batch size: the constant model, and it says so
    one = fit_epochs(pts, "deepcam", "mini/256")
    assert one.model == "constant" and one.at(4096) == pytest.approx(3) and "one batch size" in one.describe()


@needs_real
def test_validation_on_the_shared_round(tmp_path):
    from hpckit.results.analysis import same_submitter
    """--validate predicts each closed set from its first epochs and the OTHER submitters'
    record: the time model alone (epochs known) is within 10 % on every strong set."""
    js = tmp_path / "val.json"
    proc = run_hpckit("project", "--validate", "--published", V20, REAL / "sets", "--json", js, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(js.read_text())
    rows = [r for r in doc["sets"] if "error" in r]
    assert len(rows) >= 6
    for r in rows:
        assert r["record_submitters"] and not any(same_submitter(o, r["org"]) for o in r["record_submitters"]), r
        if r["scaling"] == "strong":
            assert abs(r["error_epochs_known"]) < 0.10, r
    assert {g["benchmark"] for g in doc["summary"]} == {"cosmoflow", "deepcam"}
    assert "| benchmark | round | sets | median abs error |" in proc.stdout


@pytest.fixture(scope="module")
def mini_runs(deepcam_runs):
    return deepcam_runs[:2]


def test_project_from_the_kits_runs(mini_runs, tmp_path):
    run1, run2 = mini_runs
    js = tmp_path / "p.json"
    proc = run_hpckit("project", "--benchmark", "deepcam", "--units", "1", "--local-batch", "8",
                      "--from", run1, "--epochs-from", run1, run2, "--json", js)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(js.read_text())
    summary = json.loads((run1 / "summary.json").read_text())
    (measured,) = p["measured_runs"]
    # the model passes through the one measured point; what it could not fit is said
    assert measured["model_samples_per_s"] == pytest.approx(measured["samples_per_s"], rel=1e-6)
    assert "t0 = 0" in p["system_model"] and "c = 0" in p["system_model"]
    train_samples = next(r["value"] for r in raw(run1 / "mlperf.log") if r["key"] == "train_samples")
    assert p["dataset"] == f"{summary['config']}/{train_samples}"
    epochs = sorted(json.loads((r / "summary.json").read_text())["epochs"] for r in mini_runs)
    e, t = p["epochs"], p["time_to_train_min"]
    assert epochs[0] - 1e-9 <= e["p10"] <= e["p50"] <= e["p90"] <= epochs[-1] + 1e-9
    parts = p["parts_s"]
    assert t["p50"] * 60 == pytest.approx(parts["first_epoch_start"] + parts["warmup"] + e["p50"] * (
        parts["epoch"] + parts["eval_per_epoch"] + parts["other_per_epoch"]))
    # the parts are the run's own: its steady epochs' throughput, its first epoch's extra
    an = tmp_path / "an.json"
    assert run_hpckit("analyze", run1, "--json", an).returncode == 0
    (r,) = json.loads(an.read_text())["runs"]
    times = r["epoch_times"]
    assert parts["epoch"] == pytest.approx(float(np.median(times[1:])), rel=1e-6)
    assert parts["warmup"] == pytest.approx(max(0.0, times[0] - float(np.median(times[1:]))), abs=1e-6)
    assert t["p10"] <= t["p50"] <= t["p90"] and p["extrapolated"] == []
    assert "time to train:" in proc.stdout and str(run1) in proc.stdout

    # four units: beyond what was measured, and said so
    proc = run_hpckit("project", "--benchmark", "deepcam", "--units", "4", "--local-batch", "2",
                      "--from", run1, "--epochs-from", run1, run2)
    assert proc.returncode == 0 and "extrapolated beyond what was measured: units" in proc.stdout


def test_project_to_the_official_dataset_with_the_shipped_record(mini_runs, tmp_path):
    js = tmp_path / "p.json"
    proc = run_hpckit("project", "--benchmark", "deepcam", "--units", "512", "--local-batch", "2",
                      "--from", mini_runs[0], "--json", js)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(js.read_text())
    assert p["dataset"] == "official/121000" and p["train_samples"] == 121266 and p["global_batch_size"] == 1024
    assert len(p["convergence_record"]["submitters"]) >= 5
    assert set(p["convergence_record"]["rounds"]) == {"v0.7", "v1.0", "v2.0", "v3.0"}
    assert 8 < p["epochs"]["p50"] < 25


def test_bad_input_is_one_line(tmp_path, mini_runs):
    bad_record = tmp_path / "record.json"
    bad_record.write_text("{not json")
    cases = [
        (("analyze",), "nothing to analyze"),
        (("analyze", tmp_path / "missing"), "missing"),
        (("project", "--benchmark", "deepcam", "--units", "1", "--local-batch", "8",
          "--from", tmp_path / "nowhere"), "nowhere"),
        (("project", "--benchmark", "deepcam", "--units", "0", "--local-batch", "8", "--from", mini_runs[0]),
         "--units: 0"),
        (("project", "--benchmark", "deepcam", "--units", "2", "--local-batch", "8", "--from", mini_runs[0],
          "--record", bad_record), str(bad_record)),
        (("project", "--benchmark", "cosmoflow", "--units", "2", "--local-batch", "8", "--from", mini_runs[0]),
         "no cosmoflow run"),
        (("project", "--validate"), "--published"),
        (("report", mini_runs[0], "--out", tmp_path / "report", "--project", "4x2"), "--project 4x2"),
    ]
    for args, named in cases:
        proc = run_hpckit(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert not (tmp_path / "report").exists()   # refused before the report's directory is made


def test_flops_per_sample_against_the_layer_arithmetic():
    """CosmoFlow's count equals the layer list's arithmetic: a convolution's forward is
    2 x k^3 x c_in x c_out x S^3, its backward twice that (input and weight gradients; the
    first layer has no input gradient), a dense layer 2 x in x out, three times."""
    from hpckit.common.config import load_config
    from hpckit.common.flops import train_flops_per_sample
    cfg = load_config("cosmoflow", "reference", [])
    m, s = cfg["model"], cfg["data"]["sample_size"]
    total, c_in = 0, 4
    for i in range(m["n_conv_layers"]):
        c = m["conv_size"] * 2 ** i
        fwd = 2 * m["kernel_size"] ** 3 * c_in * c * s ** 3
        total += fwd * (3 if i else 2)
        c_in, s = c, s // 2
    for a, b in ((s ** 3 * c_in, m["fc1_size"]), (m["fc1_size"], m["fc2_size"]), (m["fc2_size"], 4)):
        total += 3 * 2 * a * b
    assert train_flops_per_sample("cosmoflow", cfg) == total
    assert round(total / 1e9, 1) == 192.1


def test_a_kit_run_records_its_flops(mini_runs):
    from hpckit.common.config import load_config
    from hpckit.common.flops import train_flops_per_sample
    summary = json.loads((mini_runs[0] / "summary.json").read_text())
    usage = summary["usage"]
    expected = train_flops_per_sample("deepcam", load_config("deepcam", summary["config"], []))
    assert usage["train_flops_per_sample"] == expected
    assert usage["train_flops_per_s_per_rank"] == pytest.approx(
        expected * summary["train_samples_per_s"] / summary["ranks"], rel=1e-9)
    line = next(r for r in raw(mini_runs[0] / "mlperf.log") if r["key"] == "hpckit_usage")
    assert line["value"]["train_flops_per_sample"] == expected


def test_analyze_prints_the_input_wait_where_recorded(tmp_path):
    """Per run, the share of the training loop spent waiting for the next batch and the GPU
    busy, from the summary.json beside the log (usage.input_wait_share, usage.gpu_busy_share);
    a run that recorded none says n/a, never 0; per set the median of the runs that did. A
    share that is not one (beyond 0..1, not a number) is one line naming the file and key."""
    from test_score import write_log
    usage = {"gpu": {"input_wait_share": 0.03, "gpu_busy_share": 0.97}, "cpu": {"input_wait_share": 0.25,
             "gpu_busy_share": None}, "old": {"cpu_wait_share": 0.1}}
    runs = []
    for i, (name, u) in enumerate(usage.items()):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        write_log(run / "mlperf.log", minutes=1.0 + i, start=10_000_000 * (i + 1), nodes=1)
        (run / "summary.json").write_text(json.dumps({"usage": u}))
        runs.append(run)
    js = tmp_path / "an.json"
    proc = run_hpckit("analyze", *runs, "--runs", "--json", js)
    assert proc.returncode == 0, proc.stderr
    lines = {name: next(x for x in proc.stdout.splitlines() if f"/{name}/mlperf.log" in x) for name in usage}
    assert lines["gpu"].endswith(" | input wait 0.03, GPU busy 0.97")
    assert lines["cpu"].endswith(" | input wait 0.25")
    assert lines["old"].endswith(" | input wait n/a")
    got = {r["run"].split("/")[-2]: r for r in json.loads(js.read_text())["runs"]}
    assert got["gpu"]["usage_input_wait_share"] == 0.03 and got["gpu"]["usage_gpu_busy_share"] == 0.97
    assert "usage_gpu_busy_share" not in got["cpu"] and "usage_input_wait_share" not in got["old"]
    # per set: the median of the runs that recorded it
    proc = run_hpckit("analyze", *runs)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("site |")]
    assert line.endswith(" | input wait 0.14, GPU busy 0.97") and " | data official/? | " in line

    for bad, named in ((1.5, "must be <= 1"), (-0.1, "must be >= 0"), ("0.2", "expected")):
        for key in ("input_wait_share", "gpu_busy_share"):
            (runs[0] / "summary.json").write_text(json.dumps({"usage": {key: bad}}))
            proc = run_hpckit("analyze", runs[0])
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, (bad, key, proc.stderr)
            assert str(runs[0] / "summary.json") in lines[0] and f"usage.{key}" in lines[0] and named in lines[0], \
                lines[0]


def test_analyze_prints_a_kit_runs_input_wait(mini_runs):
    """The kit's own runs: the input wait their summary.json recorded (a kit from before
    usage.input_wait_share: n/a), and their data set, the mini config's 256 samples."""
    proc = run_hpckit("analyze", *mini_runs, "--runs")
    assert proc.returncode == 0, proc.stderr
    for run in mini_runs:
        usage = json.loads((run / "summary.json").read_text())["usage"]
        line = next(x for x in proc.stdout.splitlines() if f"run {run}/mlperf.log |" in x)
        wait, busy = usage.get("input_wait_share"), usage.get("gpu_busy_share")
        assert busy is None    # a CPU run
        assert line.endswith(" | input wait n/a" if wait is None else f" | input wait {wait:.2f}"), line
        assert " | dataset mini/256 | " in line
