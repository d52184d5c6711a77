"""Result-log parsing and MLPerf HPC scoring, against real published logs and synthetic ones."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import REAL_LOGS, run_hpckit
from hpckit.common.errors import KitError
from hpckit.results.logs import parse_log
from hpckit.results.score import collect_sets, strong_score

REAL = REAL_LOGS
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
              instance=None, platform="synthetic", acc=None) -> Path:
    metric = "eval_error" if benchmark == "cosmoflow" else "eval_accuracy"
    inst = {"instance": instance} if instance is not None else {}
    stop = start + int(minutes * 60000)
    lines = [_line(start - 100, k, v, prefix=prefix) for k, v in (
        ("submission_benchmark", benchmark), ("submission_org", "Test"),
        ("submission_division", "closed"), ("submission_status", "onprem"),
        ("submission_platform", platform))]
    if nodes is not None:
        lines.append(_line(start - 90, "number_of_nodes", nodes, prefix=prefix))
    if acc is not None:
        lines.append(_line(start - 80, "accelerators_per_node", acc, prefix=prefix))
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
    proc = run_hpckit("score", SET, "--json", out, "--scaling", "strong")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("cosmoflow | org NVIDIA") and "nodes 16" in lines[0]
    assert "10 runs (strong scaling, from --scaling)" in lines[0]
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

    proc = run_hpckit("score", copy, "--scaling", "strong")
    assert proc.returncode == 0, proc.stderr
    assert f"  {fastest}  " in proc.stdout and "converged no" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"score: {expected:.2f} min (olympic mean of 8 of 10 runs")
    sc = collect_sets([copy], scaling="strong")[0]["score"]
    assert sc["score_min"] == pytest.approx(expected)
    assert str(copy / fastest) in sc["dropped"]


@needs_real
def test_two_nonconverged_runs_invalid(tmp_path):
    copy = tmp_path / "set"
    shutil.copytree(SET, copy)
    _bad_evals(copy / "result_2.txt")
    _bad_evals(copy / "result_5.txt")
    proc = run_hpckit("score", copy, "--scaling", "strong")
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
    sets = collect_sets([d], scaling="strong")
    assert len(sets) == 1 and sets[0]["score"]["score_min"] == pytest.approx(11.0)
    assert strong_score([parse_log(d / "result_1.txt")] * 2)["reason"].startswith("2 run(s)")


def test_weak_scaling_set(tmp_path):
    d = tmp_path / "weak"
    d.mkdir()
    for i in range(5):
        write_log(d / f"result_{i}.txt", benchmark="deepcam", evals=(0.5, 0.83), minutes=10.0 + i,
                  start=1_000_000 + i * 60000, instance=i, acc=4)
    proc = run_hpckit("score", d, "--scaling", "weak")
    assert proc.returncode == 0, proc.stderr
    # min start = 1_000_000, max stop = 1_000_000 + 4 min + 14 min; scale = 4 nodes x 4 accelerators
    assert proc.stdout.strip().splitlines()[-1] == \
        "score: 5 models, instance scale 16, time_to_train_all 18.00 min"


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
        log.event("hpckit_config", {"name": "mini"})   # what makes it the kit's own run
        log.start(C.RUN_START)
        log.event(HPC.EVAL_ERROR, 0.3, metadata={"epoch_num": 1})
        log.event(HPC.EVAL_ERROR, 0.1, metadata={"epoch_num": 2})
        log.run_stop("success")
        log.close()
    proc = run_hpckit("score", d)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 runs (strong scaling, from the kit's own runs)" in proc.stdout
    assert proc.stdout.count("converged yes  epochs 2") == 3
    assert proc.stdout.strip().splitlines()[-1].startswith("score: 0.00 min (olympic mean of 1 of 3 runs")


def test_kit_runs_of_two_configs_are_two_sets(tmp_path):
    """A site's mini and reference runs of one platform in one folder: a set each (one score
    over two data sets compared nothing); the same config at another train size too."""
    pytest.importorskip("mlperf_logging")
    from hpckit.common.mllog import C, HPC, MLLogger
    d = tmp_path / "kit"
    kinds = [("mini", 1024), ("reference", 524288), ("mini", 512)]
    for k, (name, samples) in enumerate(kinds):
        for i in range(3):
            (d / f"{name}-{samples}-{i}").mkdir(parents=True)
            log = MLLogger(d / f"{name}-{samples}-{i}" / "mlperf.log", echo=False)
            log.event(C.SUBMISSION_BENCHMARK, "cosmoflow")
            log.event(C.SUBMISSION_ORG, "hpckit")
            log.event(C.SUBMISSION_PLATFORM, "test")
            log.event(HPC.NUMBER_OF_NODES, 1)
            log.event("hpckit_config", {"name": name})
            log.event(C.TRAIN_SAMPLES, samples)
            log.start(C.RUN_START)
            for epoch in range(1, k + 3):
                log.event(HPC.EVAL_ERROR, 0.3 if epoch < k + 2 else 0.1, metadata={"epoch_num": epoch})
            log.run_stop("success")
            log.close()
    proc = run_hpckit("score", d)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("3 runs (strong scaling, from the kit's own runs)") == 3, proc.stdout
    for epochs in (2, 3, 4):   # each set's own runs, not a mix
        assert proc.stdout.count(f"converged yes  epochs {epochs}") == 3, proc.stdout


# ---- bad input: exit 2, one line naming the file ----

def test_garbage_file_exit_2(tmp_path):
    bad = tmp_path / "garbage.txt"
    bad.write_bytes(b"\x00\xff not a log\nrandom text\n")
    proc = run_hpckit("score", bad)
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "MLLOG" in err[0]


def test_unfinished_run_counts_as_not_converged(tmp_path):
    """A log without run_stop (a killed run) is a run that did not converge: it is dropped
    as the slowest and never stops the scoring of the others."""
    for i, m in enumerate((10.0, 12.0, 11.0, 20.0, 9.0), 1):
        write_log(tmp_path / f"result_{i}.txt", minutes=m, start=i * 10_000_000)
    p = tmp_path / "result_4.txt"
    p.write_text("".join(ln + "\n" for ln in p.read_text().splitlines() if "run_stop" not in ln))
    with pytest.raises(KitError, match="no run_stop"):
        parse_log(p)
    proc = run_hpckit("score", tmp_path, "--scaling", "strong")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result_4.txt  - min  converged no  epochs ?  (no run_stop line (run unfinished?))" in proc.stdout
    # 9 dropped as fastest, the unfinished one as slowest: mean of 10, 11, 12
    assert proc.stdout.strip().splitlines()[-1].startswith("score: 11.00 min (olympic mean of 3 of 5 runs")


def test_missing_path_and_empty_dir_exit_2(tmp_path):
    proc = run_hpckit("score", tmp_path / "nope")
    assert proc.returncode == 2 and "nope" in proc.stderr
    proc = run_hpckit("score", tmp_path)
    assert proc.returncode == 2 and str(tmp_path) in proc.stderr


# ---- the submission layout, published rounds and the official summarizer ----

V2 = REAL / "v2.0"
# ../shared/real_logs/README.md: what mlperf_logging.result_summarizer (4.1.68, hpc 2.0.0) computes
OFFICIAL_V2 = {
    "HelmholtzAI/results/horeka_gpu_n512_pytorch1.13/strong/cosmoflow": 5.4943375,
    "HelmholtzAI/results/horeka_gpu_n512_pytorch1.13/strong/deepcam": 4.566155556,
    "NVIDIA/results/dgxa100_n64_pytorch/strong/cosmoflow": 3.792889583,
    "NVIDIA/results/dgxa100_n256_pytorch/strong/deepcam": 1.572388889,
    "tacc/results/longhorn-tf/strong/cosmoflow": 140.45283125,
    "HelmholtzAI/results/horeka_gpu_n64_pytorch1.13/weak/deepcam": (8, 64, 23.9382333),
    "HelmholtzAI/results/juwelsbooster_gpu_n128_pytorch1.13/weak/deepcam": (24, 128, 13.8340833),
    "NVIDIA/results/dgxa100_n512_pytorch/weak/cosmoflow": (128, 32, 30.3805167),
}
needs_v2 = pytest.mark.skipif(not V2.is_dir(), reason=f"v2.0 result folders not present under {V2}")


def _check_official(sc: dict, official) -> None:
    assert sc["valid"], sc
    if isinstance(official, tuple):
        models, scale, minutes = official
        assert sc["kind"] == "weak"
        assert (sc["number_of_models"], sc["instance_scale"]) == (models, scale)
        assert sc["time_to_train_all_min"] == pytest.approx(minutes, abs=1e-6)
    else:
        assert sc["kind"] == "strong" and sc["score_min"] == pytest.approx(official, abs=1e-6)


@needs_v2
@pytest.mark.parametrize("folder", sorted(OFFICIAL_V2))
def test_v20_folder_gives_the_official_figure(folder):
    sets = collect_sets([V2 / folder])
    assert len(sets) == 1 and sets[0]["scaling_from"] == "layout"
    _check_official(sets[0]["score"], OFFICIAL_V2[folder])


@needs_v2
def test_v20_tree_one_table_and_the_official_summarizer_agrees(tmp_path):
    """The whole round at once (a folder of orgs), with the official checker per run, and
    mlperf_logging's own result summarizer run on the same org folders: same figures."""
    import contextlib
    import io
    import math
    from mlperf_logging.result_summarizer import result_summarizer as rs
    out = tmp_path / "scores.json"
    proc = run_hpckit("score", V2, "--ruleset", "hpc-2.0.0", "--json", out, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    table = proc.stdout[proc.stdout.index("submitter "):].splitlines()
    assert len(table) == 1 + len(OFFICIAL_V2)
    assert any(ln.split()[:4] == ["NVIDIA", "dgxa100_n64_pytorch", "cosmoflow", "strong"] and
               ln.endswith("3.79 min") for ln in table)
    data = json.loads(out.read_text())
    kit = {str(Path(s["source"]).relative_to(V2)): s["score"] for s in data["sets"]}
    assert set(kit) == set(OFFICIAL_V2)
    for folder, official in OFFICIAL_V2.items():
        _check_official(kit[folder], official)
    compared = 0
    for org in sorted(p for p in V2.iterdir() if (p / "results").is_dir()):
        with contextlib.redirect_stdout(io.StringIO()):
            strong, weak, *_ = rs.summarize_results(str(org), "hpc", "2.0.0")
        for df, kind in ((strong, "strong"), (weak, "weak")):
            if len(df) == 0:   # an org without weak scaling sets: an empty Summary, not a DataFrame
                continue
            for _, row in df.iterrows():
                system = row["details_url"].rsplit("/", 1)[-1][:-len(".json")]
                for bench in ("cosmoflow", "deepcam"):
                    value = row.get(bench if kind == "strong" else f"{bench}:time_to_train_all")
                    if value is None or (isinstance(value, float) and math.isnan(value)):
                        continue
                    sc = kit[f"{org.name}/results/{system}/{kind}/{bench}"]
                    if kind == "strong":
                        assert sc["score_min"] == pytest.approx(value, abs=1e-9)
                    else:
                        assert sc["time_to_train_all_min"] == pytest.approx(value, abs=1e-9)
                        assert sc["number_of_models"] == row[f"{bench}:number_of_models"]
                        assert sc["instance_scale"] == row[f"{bench}:instance_scale"]
                    compared += 1
    assert compared == len(OFFICIAL_V2)


def _system(org: Path, name: str) -> Path:
    (org / "systems").mkdir(parents=True, exist_ok=True)
    (org / "systems" / f"{name}.json").write_text(json.dumps({"submitter": org.name, "system_name": name}))
    return org / "results" / name


def test_layout_decides_scaling_and_pruned_runs_do_not_count(tmp_path):
    """Strong-scaling logs that carry instance metadata stay strong (the folder decides); a
    pruned_results/ folder beside a weak set is not part of it; a weak instance that missed
    the target or never finished is a model that does not count."""
    org = tmp_path / "Org"
    sysdir = _system(org, "box")
    strong = sysdir / "strong" / "cosmoflow"
    strong.mkdir(parents=True)
    for i, m in enumerate((10.0, 12.0, 11.0), 1):
        write_log(strong / f"result_{i}.txt", minutes=m, start=i * 10_000_000, instance=0, acc=4)
    weak = sysdir / "weak" / "deepcam"
    (weak / "pruned_results").mkdir(parents=True)
    for i in range(7):
        write_log(weak / f"result_{i}.txt", benchmark="deepcam", minutes=10.0, start=1_000_000 + i * 60000,
                  instance=i, acc=4, evals=(0.5, 0.81 if i == 5 else 0.83))
    p = weak / "result_6.txt"   # killed: no run_stop
    p.write_text("".join(ln + "\n" for ln in p.read_text().splitlines() if "run_stop" not in ln))
    write_log(weak / "pruned_results" / "result_9.txt", benchmark="deepcam", minutes=99.0, instance=9, acc=4,
              start=1_000_000, evals=(0.83,))
    out = tmp_path / "s.json"
    proc = run_hpckit("score", org, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sets = {s["scaling"]: s for s in json.loads(out.read_text())["sets"]}
    assert sets["strong"]["score"]["kind"] == "strong" and sets["strong"]["score"]["score_min"] == pytest.approx(11.0)
    w = sets["weak"]["score"]
    assert (w["number_of_models"], w["instance_scale"], w["valid"]) == (5, 16, True)
    assert w["time_to_train_all_min"] == pytest.approx(14.0)   # instances 0..4: starts 0..4 min, 10 min each
    assert len(sets["weak"]["runs"]) == 7   # pruned_results/ is not in the set
    why = {r["name"]: r["why"] for r in sets["weak"]["runs"]}
    assert why["result_5.txt"].startswith("target not reached") and "run_stop" in why["result_6.txt"]
    assert "pruned_results: not runs of the set" in proc.stdout
    assert re.search(r"\nOrg +box +deepcam +weak +7 +5 models, instance scale 16, time_to_train_all 14.00 min\n",
                     proc.stdout), proc.stdout


def test_weak_set_short_of_models_is_invalid(tmp_path):
    weak = _system(tmp_path / "Org", "box") / "weak" / "deepcam"
    weak.mkdir(parents=True)
    for i in range(5):
        write_log(weak / f"result_{i}.txt", benchmark="deepcam", instance=i, acc=4,
                  evals=(0.5, 0.70 if i < 2 else 0.83))
    proc = run_hpckit("score", weak)
    assert proc.returncode == 1
    assert "invalid (3 converged instance(s), at least 5 needed" in proc.stdout


def test_bare_folder_needs_scaling_and_mixed_benchmarks_split(tmp_path):
    for i in range(3):
        write_log(tmp_path / f"result_c{i}.txt", minutes=10.0 + i, start=i * 10_000_000)
        write_log(tmp_path / f"result_d{i}.txt", benchmark="deepcam", evals=(0.83,), minutes=5.0 + i,
                  start=i * 10_000_000)
    proc = run_hpckit("score", tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "cannot tell strong from weak scaling" in err[0]
    assert str(tmp_path) in err[0] and "Traceback" not in proc.stderr
    sets = collect_sets([tmp_path], scaling="strong")
    assert sorted((s["benchmark"], len(s["runs"]), round(s["score"]["score_min"], 2)) for s in sets) == \
        [("cosmoflow", 3, 11.0), ("deepcam", 3, 6.0)]


def test_byte_identical_copies_make_the_set_invalid(tmp_path):
    for i in range(3):
        write_log(tmp_path / f"result_{i}.txt", minutes=10.0 + i, start=i * 10_000_000)
    shutil.copy(tmp_path / "result_1.txt", tmp_path / "result_3.txt")
    proc = run_hpckit("score", tmp_path, "--scaling", "strong")
    assert proc.returncode == 1
    assert "invalid (result_3.txt is a byte-identical copy of result_1.txt)" in proc.stdout


def test_a_log_reached_twice_is_one_log(tmp_path):
    """Overlapping arguments (a set and its parent folder, a file and its folder) score each
    log once: the same 10 runs, the same figure as the set alone."""
    sets = REAL / "sets"
    one = REAL / "sets" / "v1.0__NVIDIA__dgxa100_n16_ngc21.09_mxnet__cosmoflow"
    if not one.is_dir():
        pytest.skip("real logs not present")
    js = tmp_path / "s.json"
    proc = run_hpckit("score", one, sets, one / "result_3.txt", "--scaling", "strong", "--json", js)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(js.read_text())["sets"]
    assert len(got) == 1 and len(got[0]["runs"]) == 10 and round(got[0]["score"]["score_min"], 2) == 25.78


def _rcp_tree(root: Path, stale: float | None) -> tuple[Path, Path]:
    """An org folder with one strong-scaling CosmoFlow set of ten real v2.0 logs, unmodified:
    five runs of the NVIDIA dgxa100_n512 weak-scaling instances that converged in 7 epochs and
    five in 8 (batch 32). Their mean epochs with fastest and slowest dropped, 7.5, lies below
    the hpc 2.0.0 RCP mean for batch 32 (7.87) and within its maximum speed-up, so the official
    package checker writes a scaling factor of 7.87 / 7.5 into the folder."""
    from mlperf_logging.rcp_checker import rcp_checker
    weak = V2 / "NVIDIA" / "results" / "dgxa100_n512_pytorch" / "weak" / "cosmoflow"
    picked: dict[int, list[Path]] = {7: [], 8: []}
    for log in sorted(weak.glob("result_*.txt"), key=lambda p: int(p.stem.split("_")[1])):
        _, epochs, _, _ = rcp_checker.read_submission_file(str(log), "2.0.0", False)
        if epochs in picked and len(picked[epochs]) < 5:
            picked[epochs].append(log)
    org = root / "NVIDIA"
    folder = org / "results" / "dgxa100_n512_pytorch" / "strong" / "cosmoflow"
    folder.mkdir(parents=True)
    (org / "systems").mkdir()
    shutil.copyfile(V2 / "NVIDIA" / "systems" / "dgxa100_n512_pytorch.json", org / "systems" / "dgxa100_n512_pytorch.json")
    for i, log in enumerate(picked[7] + picked[8]):
        shutil.copyfile(log, folder / f"result_{i}.txt")
    if stale is not None:   # a scaling.json the tree brought: the official pipeline recomputes it
        (folder / "scaling.json").write_text(json.dumps({"scaling_factor": stale}))
    return org, folder


@needs_v2
@pytest.mark.parametrize("stale", [None, 3.0])
def test_rcp_scaling_factor_as_the_official_pipeline(tmp_path, stale):
    """The official figure of a strong set is the olympic mean times the RCP factor that the
    package checker writes into scaling.json (removing one already there) and the summarizer
    reads: the kit computes it without writing into the tree and prints it beside the
    unscaled time; mlperf_logging's own package checker and summarizer run on a copy agree."""
    import contextlib
    import io
    from mlperf_logging.result_summarizer import result_summarizer as rs
    from hpckit.results.checkers import run_package_checker
    org, folder = _rcp_tree(tmp_path / "tree", stale)
    before = {p: p.read_bytes() for p in org.rglob("*") if p.is_file()}
    js = tmp_path / "kit.json"
    proc = run_hpckit("score", org, "--json", js)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sc = json.loads(js.read_text())["sets"][0]["score"]
    assert {p: p.read_bytes() for p in org.rglob("*") if p.is_file()} == before   # nothing written
    assert sc["scaling_factor"] == pytest.approx(7.870967741935484 / 7.5, abs=1e-9)
    assert f"unscaled {sc['unscaled_min']:.4f} min x scaling factor {sc['scaling_factor']:.5f}" in proc.stdout

    official = tmp_path / "official" / "NVIDIA"
    shutil.copytree(org, official)
    run_package_checker(official, "hpc-2.0.0")   # its verdict aside, it writes scaling.json
    assert json.loads((official / folder.relative_to(org) / "scaling.json").read_text())["scaling_factor"] == \
        pytest.approx(sc["scaling_factor"], abs=1e-12)
    with contextlib.redirect_stdout(io.StringIO()):
        strong, *_ = rs.summarize_results(str(official), "hpc", "2.0.0")
    assert sc["score_min"] == pytest.approx(float(strong.iloc[0]["cosmoflow"]), abs=1e-9)
    assert sc["score_min"] == pytest.approx(sc["unscaled_min"] * sc["scaling_factor"], abs=1e-12)
