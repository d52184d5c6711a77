"""Result-log parsing and MLPerf HPC scoring, against real published logs and synthetic ones."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import run_hpckit
from hpckit.common.errors import KitError
from hpckit.results.logs import parse_log
from hpckit.results.score import collect_sets, strong_score

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "real_logs"
SET = REAL / "sets" / "v1.0__NVIDIA__dgxa100_n16_ngc21.09_mxnet__cosmoflow"
V07 = REAL / "v0.7__LBNL__corigpu_n64_tf1.15.0__cosmoflow__result_1.txt"
V10 = REAL / "v1.0__NVIDIA__dgxa100_n16_ngc21.09_mxnet__cosmoflow__result_1.txt"
V20 = REAL / "v2.0__HelmholtzAI__horeka_gpu_n512_pytorch1.13__deepcam__result_0.txt"

needs_real = pytest.mark.skipif(not SET.is_dir() or not V07.is_file(),
                                reason=f"real MLPerf logs not present under {REAL}")


def _raw_minutes(path: Path) -> float:
    """Time to train straight from the raw run_start/run_stop lines (no kit parser)."""
    times = {}
    for line in path.read_text().splitlines():
        m = re.search(r'"key": "(run_start|run_stop)"', line)
        if m:
            times.setdefault(m.group(1), int(re.search(r'"time_ms": (\d+)', line).group(1)))
    return (times["run_stop"] - times["run_start"]) / 60000.0


def _olympic(times):
    t = sorted(times)[1:-1]
    return sum(t) / len(t)


def _line(t, key, value=None, etype="POINT_IN_TIME", prefix="", **meta):
    rec = {"namespace": "", "time_ms": t, "event_type": etype, "key": key, "value": value,
           "metadata": {"file": "x.py", "lineno": 1, **meta}}
    return f"{prefix}:::MLLOG {json.dumps(rec)}"


def write_log(path: Path, *, benchmark="cosmoflow", start=1_000_000, minutes=10.0,
              evals=(0.3, 0.2, 0.12), status="success", staging_before=False,
              eval_stop_type="INTERVAL_END", after_stop=(), prefix="", nodes=4,
              instance=None, platform="synthetic") -> Path:
    metric = "eval_error" if benchmark == "cosmoflow" else "eval_accuracy"
    inst = {"instance": instance} if instance is not None else {}
    stop = start + int(minutes * 60000)
    lines = [_line(start - 100, k, v, prefix=prefix) for k, v in (
        ("submission_benchmark", benchmark), ("submission_org", "Test"),
        ("submission_division", "closed"), ("submission_status", "onprem"),
        ("submission_platform", platform))]
    if nodes is not None:
        lines.append(_line(start - 90, "number_of_nodes", nodes, prefix=prefix))
    if staging_before:
        lines += [_line(start - 50, "staging_start", etype="INTERVAL_START"),
                  _line(start - 10, "staging_stop", etype="INTERVAL_END")]
    lines.append(_line(start, "run_start", etype="INTERVAL_START", prefix=prefix, **inst))
    if not staging_before:
        lines += [_line(start + 1, "staging_start", etype="INTERVAL_START"),
                  _line(start + 2, "staging_stop", etype="INTERVAL_END")]
    for e, v in enumerate(evals, 1):
        t = start + 10 + e
        lines += [_line(t, "epoch_start", etype="INTERVAL_START", epoch_num=e),
                  _line(t, "eval_stop", etype=eval_stop_type, epoch_num=e),
                  _line(t, metric, v, epoch_num=e, **inst)]
    lines.append(_line(stop, "run_stop", etype="INTERVAL_END", prefix=prefix, status=status, **inst))
    for i, v in enumerate(after_stop, 1):
        lines.append(_line(stop + i, metric, v, epoch_num=len(evals) + i))
    path.write_text("\n".join(lines) + "\n")
    return path


def _bad_evals(path: Path) -> None:
    """Make every eval_error in a real log miss the 0.124 target."""
    text = re.sub(r'("key": "eval_error", "value": )[0-9.eE+-]+', r'\g<1>0.5', path.read_text())
    path.write_text(text)


# ---- real logs ----

@needs_real
def test_published_set_scores_25_78():
    runs = [parse_log(p) for p in sorted(SET.glob("result_*.txt"))]
    assert len(runs) == 10 and all(r.converged for r in runs)
    sc = strong_score(runs)
    assert sc["valid"] and sc["runs_used"] == 8
    assert round(sc["score_min"], 2) == 25.78


@needs_real
@pytest.mark.parametrize("n", range(1, 11))
def test_each_run_time_matches_raw_lines(n):
    p = SET / f"result_{n}.txt"
    assert parse_log(p).time_to_train_min == pytest.approx(_raw_minutes(p), abs=1e-9)


@needs_real
def test_cli_published_set(tmp_path):
    out = tmp_path / "s.json"
    proc = run_hpckit("score", SET, "--json", out)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("cosmoflow | org NVIDIA") and "nodes 16" in lines[0] and "10 runs" in lines[0]
    assert lines[-1] == "score: 25.78 min (olympic mean of 8 of 10 runs)"
    assert sum(" converged yes " in ln for ln in lines) == 10
    data = json.loads(out.read_text())
    assert data["valid"] and round(data["sets"][0]["score"]["score_min"], 2) == 25.78
    assert len(data["sets"][0]["runs"]) == 10


@needs_real
def test_v07_log_missing_nodes_zero_based_epochs():
    r = parse_log(V07)
    assert r.number_of_nodes is None and r.accelerators_per_node is None
    assert r.org == "LBNL" and r.benchmark == "cosmoflow"
    assert r.epochs == 49  # epoch_num 0..48
    assert r.converged and r.metric_value < 0.124


@needs_real
def test_v10_single_and_v20_deepcam():
    r = parse_log(V10)
    assert r.number_of_nodes == 16 and r.accelerators_per_node == 8 and r.epochs == 17
    d = parse_log(V20)
    assert d.benchmark == "deepcam" and d.converged and d.metric == "eval_accuracy"
    assert d.metric_value >= 0.82 and d.number_of_nodes == 128 and d.epochs == 14
    assert d.staging_start_ms is not None and d.staging_stop_ms is not None


@needs_real
def test_one_nonconverged_run_is_dropped_as_slowest(tmp_path):
    copy = tmp_path / "set"
    shutil.copytree(SET, copy)
    times = {p.name: _raw_minutes(p) for p in copy.glob("result_*.txt")}
    fastest = min(times, key=times.get)
    _bad_evals(copy / fastest)
    assert not parse_log(copy / fastest).converged
    others = sorted(t for n, t in times.items() if n != fastest)
    expected = sum(others[1:]) / len(others[1:])  # drop the fastest converged; bad run is the slowest
    assert round(expected, 2) != round(_olympic(times.values()), 2)

    proc = run_hpckit("score", copy)
    assert proc.returncode == 0, proc.stderr
    assert f"  {fastest}  " in proc.stdout and "converged no" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"score: {expected:.2f} min (olympic mean of 8 of 10 runs")
    sc = collect_sets([copy])[0]["score"]
    assert sc["score_min"] == pytest.approx(expected)
    assert str(copy / fastest) in sc["dropped"]


@needs_real
def test_two_nonconverged_runs_invalid(tmp_path):
    copy = tmp_path / "set"
    shutil.copytree(SET, copy)
    _bad_evals(copy / "result_2.txt")
    _bad_evals(copy / "result_5.txt")
    proc = run_hpckit("score", copy)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1].startswith("score: invalid (2 runs did not converge")


# ---- quirks, on synthetic logs ----

def test_events_after_run_stop_do_not_converge(tmp_path):
    p = write_log(tmp_path / "a.log", evals=(0.3, 0.2, 0.15), after_stop=(0.10,))
    r = parse_log(p)
    assert not r.converged and r.metric_value == 0.15 and r.epochs == 3
    # and a converged run stays converged with worse evals after run_stop
    q = parse_log(write_log(tmp_path / "b.log", evals=(0.3, 0.12), after_stop=(0.5, 0.6)))
    assert q.converged and q.metric_value == 0.12 and q.epochs == 2


def test_failed_run_stop_status_not_converged(tmp_path):
    assert not parse_log(write_log(tmp_path / "a.log", status="aborted")).converged


def test_staging_before_run_start_and_prefixed_lines(tmp_path):
    r = parse_log(write_log(tmp_path / "a.log", staging_before=True, prefix="0: [1,0]<stdout>:"))
    assert r.staging_start_ms < r.run_start_ms and r.staging_stop_ms < r.run_start_ms
    assert r.converged and r.time_to_train_min == pytest.approx(10.0)
    assert r.org == "Test" and r.number_of_nodes == 4


def test_eval_stop_logged_as_interval_start(tmp_path):
    r = parse_log(write_log(tmp_path / "a.log", eval_stop_type="INTERVAL_START", nodes=None))
    assert r.converged and r.epochs == 3 and r.number_of_nodes is None


def test_deepcam_target(tmp_path):
    assert parse_log(write_log(tmp_path / "a.log", benchmark="deepcam", evals=(0.5, 0.83))).converged
    assert not parse_log(write_log(tmp_path / "b.log", benchmark="deepcam", evals=(0.5, 0.81))).converged


def test_strong_set_of_synthetic_logs(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    for i, m in enumerate((10.0, 12.0, 11.0, 20.0, 9.0), 1):
        write_log(d / f"result_{i}.txt", minutes=m, start=i * 10_000_000)
    sets = collect_sets([d])
    assert len(sets) == 1 and sets[0]["score"]["score_min"] == pytest.approx(11.0)
    assert strong_score([parse_log(d / "result_1.txt")] * 2)["reason"].startswith("2 run(s)")


def test_weak_scaling_set(tmp_path):
    d = tmp_path / "weak"
    d.mkdir()
    for i in range(4):
        write_log(d / f"result_{i}.txt", minutes=10.0 + i, start=1_000_000 + i * 60000, instance=i)
    proc = run_hpckit("score", d)
    assert proc.returncode == 0, proc.stderr
    # min start = 1_000_000, max stop = 1_000_000 + 3 min + 13 min
    assert proc.stdout.strip().splitlines()[-1] == \
        "score: time_to_train_all 16.00 min for 4 models, instance scale 4 nodes"


def test_kit_written_logs_score(tmp_path):
    pytest.importorskip("mlperf_logging")
    from hpckit.common.mllog import C, HPC, MLLogger
    d = tmp_path / "kit"
    for i in range(3):
        (d / f"run{i}").mkdir(parents=True)
        log = MLLogger(d / f"run{i}" / "mlperf.log", echo=False)
        log.event(C.SUBMISSION_BENCHMARK, "cosmoflow")
        log.event(C.SUBMISSION_ORG, "hpckit")
        log.event(C.SUBMISSION_PLATFORM, "test")
        log.event(HPC.NUMBER_OF_NODES, 1)
        log.start(C.RUN_START)
        log.event(HPC.EVAL_ERROR, 0.3, metadata={"epoch_num": 1})
        log.event(HPC.EVAL_ERROR, 0.1, metadata={"epoch_num": 2})
        log.run_stop("success")
        log.close()
    proc = run_hpckit("score", d)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 runs" in proc.stdout and proc.stdout.count("converged yes  epochs 2") == 3
    assert proc.stdout.strip().splitlines()[-1].startswith("score: 0.00 min (olympic mean of 1 of 3 runs")


# ---- bad input: exit 2, one line naming the file ----

def test_garbage_file_exit_2(tmp_path):
    bad = tmp_path / "garbage.txt"
    bad.write_bytes(b"\x00\xff not a log\nrandom text\n")
    proc = run_hpckit("score", bad)
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "MLLOG" in err[0]


def test_missing_run_stop_exit_2(tmp_path):
    p = write_log(tmp_path / "result_1.txt")
    p.write_text("".join(ln + "\n" for ln in p.read_text().splitlines() if "run_stop" not in ln))
    with pytest.raises(KitError, match="no run_stop"):
        parse_log(p)
    proc = run_hpckit("score", tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and str(p) in err[0] and "run_stop" in err[0]


def test_missing_path_and_empty_dir_exit_2(tmp_path):
    proc = run_hpckit("score", tmp_path / "nope")
    assert proc.returncode == 2 and "nope" in proc.stderr
    proc = run_hpckit("score", tmp_path)
    assert proc.returncode == 2 and str(tmp_path) in proc.stderr
