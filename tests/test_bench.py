"""Bench scripts: they run and print every figure. Speed itself is never asserted here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import PUBLISHED_V2, REPO

pytestmark = pytest.mark.slow   # `make test-all` (CI) only: the bench scripts' smoke runs (minutes together)

NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"


def test_cosmoflow_throughput_prints_every_figure(tmp_path):
    out_json = tmp_path / "figures.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "cosmoflow_throughput.py"), "--sizes", "mini",
         "--steps", "2", "--warmup", "1", "--samples", "8", "--workdir", str(tmp_path),
         "--json", str(out_json)],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("cosmoflow_throughput host="), lines[0]
    for key in ("cpus=", "torch=", "tensorflow=", "precision=fp32", "device="):
        assert key in lines[0], (key, lines[0])

    expected = [rf"size=mini framework={fw} precision=fp32 device=\S+ train_step samples/s={NUMBER} \(step "
                for fw in ("pytorch", "tensorflow")]
    expected += [rf"size=mini format={fmt} loader={ld} precision=fp32 cache={cache} samples/s={NUMBER} \("
                 for fmt in ("tfrecord", "npy") for ld in ("pytorch", "tensorflow") for cache in ("cold", "warm")]
    expected += [rf"size=mini format=tfrecord {name} precision=fp32 cache={cache} MB/s={NUMBER} samples/s={NUMBER} \("
                 for name in ("raw_gunzip_read", "read_example_file") for cache in ("cold", "warm")]
    for pattern in expected:
        hits = [m for m in (re.fullmatch("cosmoflow " + pattern + r".*\)", line) for line in lines) if m]
        assert len(hits) == 1, f"expected one line matching {pattern!r} in:\n{proc.stdout}"
        assert all(float(v) > 0 for v in hits[0].groups()), hits[0].group(0)

    saved = json.loads(out_json.read_text())
    assert len(saved["figures"]) == len(expected) == 14
    assert all(f["samples/s"] > 0 for f in saved["figures"])
    assert list(tmp_path.iterdir()) == [out_json]          # temporary datasets removed


def test_side_by_side_prints_every_figure(tmp_path):
    """Without --reference only the kit's cases run (the reference is the user's own clone,
    never part of this project); every figure line is printed and saved."""
    out_json = tmp_path / "side.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "side_by_side.py"), "--size", "small", "--rounds", "1",
         "--steps", "1", "--warmup", "0", "--json", str(out_json)],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("side_by_side host=") and " flags=" in lines[0], lines[0]
    assert re.fullmatch(rf"gemm_peak fp32 torch.matmul={NUMBER} GFLOP/s 1x1_conv\(oneDNN\)={NUMBER} GFLOP/s "
                        rf"-> peak {NUMBER}", lines[1]), lines[1]
    for bench, case in (("cosmoflow", "kit/tensorflow"), ("cosmoflow", "kit/pytorch"), ("deepcam", "kit/pytorch")):
        pattern = (rf"{bench} {case} s/step={NUMBER} samples/s={NUMBER} GFLOP/s={NUMBER} "
                   rf"peak_fraction={NUMBER} vs_reference=n/a \(threads \d+, .*\)")
        assert sum(bool(re.fullmatch(pattern, line)) for line in lines) == 1, (pattern, proc.stdout)
    saved = json.loads(out_json.read_text())
    assert len(saved["figures"]) == 3 and all(f["seconds_per_step"] > 0 for f in saved["figures"])
    assert saved["flops"]["deepcam"] > saved["flops"]["cosmoflow"] > 0

    bad = subprocess.run([sys.executable, str(REPO / "bench" / "side_by_side.py"), "--reference", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert bad.returncode == 2 and str(tmp_path) in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_pass_stability_prints_every_figure():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "pass_stability.py"), "--procs", "1", "--passes", "2"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# cpus=") and "flags=" in lines[0], lines[0]
    cases = ["malloc_cosmoflow_glibc_default", "malloc_cosmoflow_tuned", "malloc_deepcam_glibc_default",
             "malloc_deepcam_tuned", "tf.data_cosmoflow-tfrecord_autotune_on", "tf.data_cosmoflow-tfrecord_autotune_off"]
    for case, line in zip(cases, lines[1:], strict=True):
        m = re.fullmatch(rf"case={re.escape(case)} ms_median={NUMBER} ms_min={NUMBER} ms_max={NUMBER} "
                         rf"max/min={NUMBER}  passes: {NUMBER} {NUMBER}", line)
        assert m and all(float(v) > 0 for v in m.groups()), line


def test_conv_efficiency_prints_every_figure(tmp_path):
    """Per-layer convolution rates of both kit models at the small size (fp32: every CPU has
    it); the convolutions' FLOPs, summed from their shapes, must be the model's as torch's
    FlopCounterMode counts them (a wrong formula or a missed layer kind shows here)."""
    out_json = tmp_path / "conv.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "conv_efficiency.py"), "--size", "small", "--precisions", "fp32",
         "--reps", "1", "--top", "2", "--json", str(out_json)],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("conv_efficiency cpu=") and " flags=" in lines[0] and " allocator=" in lines[0], lines[0]
    assert re.fullmatch(rf"gemm_peak fp32 torch.matmul={NUMBER} GFLOP/s 1x1_conv\(oneDNN\)={NUMBER} GFLOP/s "
                        rf"-> peak {NUMBER}", lines[1]), lines[1]
    for bench in ("cosmoflow", "deepcam"):
        heads = [line for line in lines if line.startswith(f"{bench} fp32 batch=")]
        assert len(heads) == 1, proc.stdout
        assert re.search(rf"step_s={NUMBER} convolutions_s={NUMBER} \({NUMBER}% of the step\) "
                         rf"conv_GFLOP={NUMBER} counted_GFLOP={NUMBER} ", heads[0]), heads[0]
        i = lines.index(heads[0])
        assert all(re.fullmatch(rf"  \S+->\d+ k\d.* x\d+: forward {NUMBER} ms {NUMBER} GFLOP/s \({NUMBER}\), "
                                rf"backward {NUMBER} ms {NUMBER} GFLOP/s \({NUMBER}\)", line)
                   for line in lines[i + 1:i + 3]), lines[i + 1:i + 3]
    saved = json.loads(out_json.read_text())
    by = {r["benchmark"]: r for r in saved["results"]}
    assert len(by["cosmoflow"]["layers"]) == 5
    assert any("transposed" in t["layer"] for t in by["deepcam"]["layers"])
    assert any("(no dx)" in t["layer"] for t in by["cosmoflow"]["layers"])
    for r in by.values():
        assert abs(r["conv_gflop"] - r["counted_gflop"]) <= 0.01 * r["counted_gflop"], r
        assert r["step_s"] > 0 and r["convolutions_s"] > 0


def test_multirank_keeps_everything_of_a_failed_run(tmp_path):
    """A run that fails mid-bench leaves its dataset, output directory and whole log for a
    post-mortem (a 2-rank abort seen once lost its logs with the bench's temporary directory)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "multirank_throughput.py"), "--cases", "deepcam/pytorch",
                           "--epochs", "0", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-2000:]
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("multirank-")]
    assert len(kept) == 1 and f"kept {kept[0]}" in proc.stderr, proc.stderr[-2000:]
    log = (kept[0] / "deepcam-pytorch-1.log").read_text()
    assert "train.n_epochs" in log and "--- stderr" in log
    assert (kept[0] / "deepcam" / "stats.h5").is_file()


@pytest.mark.parametrize("args,named", [(["--cases", "foo/bar"], "--cases foo/bar"),
                                        (["--deepcam-size", "12"], "--deepcam-size 12"),
                                        (["--samples", "5"], "--samples 5"), (["--ranks", "3"], "--ranks 3")])
def test_multirank_bad_argument_is_one_line(args, named):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "multirank_throughput.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and named in proc.stderr, proc.stderr


@pytest.mark.parametrize("args,named", [(["--nodes", "1,x"], "--nodes '1,x'"), (["--nodes", "5"], "--nodes '5'"),
                                        (["--epochs", "0"], "--epochs 0"),
                                        (["--benchmark", "deepcam", "--framework", "tensorflow"], "--framework")])
def test_multinode_scaling_bad_argument_is_one_line(args, named):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "multinode_scaling.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and named in proc.stderr, proc.stderr


@pytest.mark.parametrize("args,named", [(["--instances", "1,x"], "--instances '1,x'"),
                                        (["--instances", "0"], "--instances '0'"), (["--epochs", "0"], "--epochs 0")])
def test_campaign_throughput_bad_argument_is_one_line(args, named):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "campaign_throughput.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and named in proc.stderr, proc.stderr


def test_conv_efficiency_bad_argument_is_one_line():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "conv_efficiency.py"), "--precisions", "fp8"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "precisions" in proc.stderr, proc.stderr


def test_official_agreement_compares_every_set_of_an_org(tmp_path):
    """The official package checker + summarizer on a copy of one real v2.0 org, against
    hpckit score on the tree itself: one line per set, the count, and the tree untouched."""
    tree = PUBLISHED_V2
    if not (tree / "tacc").is_dir():
        pytest.skip(f"real v2.0 result folders not present under {tree}")
    before = sorted((p, p.stat().st_mtime_ns) for p in tree.rglob("*"))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "official_agreement.py"), tree,
                           "--ruleset", "hpc-2.0.0", "--orgs", "tacc"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "agree   tacc/longhorn-tf/strong/cosmoflow: kit 140.452831 official 140.452831",
        f"1 sets agree, 0 differ ({tree}, hpc-2.0.0)"]
    assert sorted((p, p.stat().st_mtime_ns) for p in tree.rglob("*")) == before
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "official_agreement.py"), tmp_path / "none",
                          "--ruleset", "hpc-2.0.0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == f"{tmp_path / 'none'}: no such directory"


def test_timeline_agreement_lists_every_set_with_both_readings(tmp_path):
    """bench/timeline_agreement.py on the real v2.0 folders: one row per set with the kit's
    and the independent training samples/s per unit side by side, all agreeing, and the count;
    a path that is not there: one line, exit 2."""
    tree = PUBLISHED_V2
    if not (tree / "tacc").is_dir():
        pytest.skip(f"real v2.0 result folders not present under {tree}")
    script = str(REPO / "bench" / "timeline_agreement.py")
    proc = subprocess.run([sys.executable, script, tree], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| v2.0 |")]
    folders = {p.parent for p in tree.rglob("result_*.txt")}
    assert len(rows) == len(folders) and all(ln.endswith("| agree |") for ln in rows), proc.stdout
    for ln in rows:
        kit, other, ratio = (float(x) for x in ln.split(" | ")[7:10])
        assert ratio == pytest.approx(kit / other, abs=0.002) and abs(ratio - 1) <= 0.10, ln
    assert proc.stdout.splitlines()[-1] == f"{len(rows)} sets agree, 0 differ (tolerance 10%)"
    bad = subprocess.run([sys.executable, script, tmp_path / "none"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == f"timeline_agreement.py: {tmp_path / 'none'}: " \
        "no such file or directory", bad.stderr


def test_provenance_cost_prints_every_part():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "provenance_cost.py"), "--repeat", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^# CPU: .* flags .*; load average ", proc.stdout, re.M), proc.stdout
    for part in ("installed_packages", "kit", "cpu", "gpu", "collect"):
        assert re.search(rf"^{part}\s+{NUMBER}\s+{NUMBER}$", proc.stdout, re.M), proc.stdout
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "provenance_cost.py"), "--repeat", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--repeat 0" in bad.stderr


@pytest.mark.parametrize("args,named", [(["--workers", "0"], "--workers '0'"), (["--workers", "a"], "--workers 'a'"),
                                        (["--cosmoflow", "2"], "--cosmoflow")])
def test_loader_rates_bad_argument_is_one_line(args, named):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "loader_rates.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and named in proc.stderr, proc.stderr


def test_loader_rates_prints_every_format():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "loader_rates.py"), "--cosmoflow", "4", "--deepcam", "2",
                           "--workers", "1"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("# host ") and " flags " in proc.stdout.splitlines()[0]
    for bench, fmt in (("cosmoflow", "gzip-tfrecord"), ("cosmoflow", "npy"), ("cosmoflow", "stage-decoded"),
                       ("deepcam", "hdf5")):
        assert re.search(rf"^{bench}\s+{fmt}\s+1\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+(fits|does NOT fit)",
                         proc.stdout, re.M), (bench, fmt, proc.stdout)
    assert re.search(rf"^cosmoflow\s+staging decode\s+1\s+{NUMBER}", proc.stdout, re.M), proc.stdout
    assert "stage-decoded against gzip-tfrecord, per core with 1 worker:" in proc.stdout


@pytest.mark.parametrize("args,named", [(["--runs", "0"], "--runs 0"), (["--capped-epochs", "0"], "--capped-epochs 0")])
def test_projection_onmachine_bad_argument_is_one_line(args, named):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "projection_onmachine.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and named in proc.stderr, proc.stderr


NO_TENSORFLOW = ("import runpy, sys; sys.modules['tensorflow'] = None; sys.argv = sys.argv[1:]; "
                 "runpy.run_path(sys.argv[0], run_name='__main__')")


def test_feed_rate_prints_every_figure_without_tensorflow(tmp_path):
    """The whole data path beside the loader alone at tiny sizes, TensorFlow unimportable (the
    lent GPU machine has none): a row per format and reader count (loader, path, ratio, input
    wait, the step's busy share, CPU per sample, the loop's and the readers' shares), where
    each format stops scaling and why, and the JSON. OpenFold (train.py's Samples, its mini
    config) at step rate 0: no GPU rate of its step is measured."""
    out = tmp_path / "feed.json"
    proc = subprocess.run([sys.executable, "-c", NO_TENSORFLOW, str(REPO / "bench" / "feed_rate.py"), "--tiny",
                           "--readers", "1,2", "--files", "16", "--seconds", "0.3", "--rounds", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# host ") and " flags " in lines[0] and "device none: the meta device" in lines[1]
    share = rf"(?:{NUMBER}| n/a)"
    for fmt, batch, rate in (("hdf5", 8, 83), ("gzip-tfrecord", 1, 289), ("tfrecord", 1, 289),
                             ("stage-decode", 1, 289), ("lmdb", 8, 81), ("openfold", 1, 0)):
        for w in (1, 2):
            row = (rf"{fmt}\s+{batch}\s+{w}\s+{rate}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{share}\s+{share}\s+{NUMBER}\s+"
                   rf"{NUMBER}%\s+{NUMBER}%\s+(?:{NUMBER}%|n/a)")
            assert sum(bool(re.fullmatch(row, line.strip())) for line in lines) == 1, (row, proc.stdout)
        assert sum(bool(re.fullmatch(rf"# {fmt}: (stops scaling at \d reader\(s\), {NUMBER} samples/s: .+|still "
                                     rf"scaling at 2 reader\(s\) \({NUMBER} samples/s\))", line))
                   for line in lines) == 1, proc.stdout
    saved = json.loads(out.read_text())
    assert len(saved["rows"]) == 12 and all(r["loader"] > 0 and r["path"] > 0 and r["scaling"] for r in saved["rows"])
    assert all(r["path_fig"]["input_wait"] is not None for r in saved["rows"])


@pytest.mark.parametrize("args,named", [(["--readers", "0"], "--readers '0'"), (["--formats", "csv"], "--formats 'csv'"),
                                        (["--batch", "deepcam=x"], "--batch 'x'"), (["--batch", "bert=1"], "bert=1"),
                                        (["--rate", "-1"], "--rate -1"), (["--rate", "nan"], "--rate nan"),
                                        (["--seconds", "0"], "--seconds 0"), (["--files", "3"], "--files 3"),
                                        (["--rounds", "0"], "--rounds 0"), (["--json", "README.md"], "--json README.md")])
def test_feed_rate_bad_argument_is_one_line(args, named):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "feed_rate.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and named in proc.stderr, proc.stderr


def test_gpu_check_dry_runs_every_part(tmp_path):
    """`make gpu-check DRY=1`: every part of the GPU check (the step, OpenFold's last, from
    files, OpenFold's last too, the mini trainings deterministic twice, torchrun, the ReFrame
    checks as --dry-run, OpenFold's among them) on the CPU at tiny sizes, so that the command a
    lent GPU runs does not rot; no figure is judged. GPU_WORKDIR: it works in a new directory
    inside the one named and removes only that; GPU_OUT: the table it writes is new files
    (issue 41)."""
    work, out = tmp_path / "mine", tmp_path / "out"
    work.mkdir()
    (work / "keep.txt").write_text("the user's")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(["make", "-s", "--no-print-directory", "gpu-check", "DRY=1", f"GPU_PYTHON={sys.executable}",
                           f"GPU_WORKDIR={work}", f"GPU_OUT={out}"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"] and (work / "keep.txt").read_text() == "the user's"
    assert "| step | deepcam kit fp32 b1" in (out / "gpu_check.txt").read_text()
    assert json.loads((out / "gpu_check.json").read_text())
    # the final table: | part | case | status | figures |
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| part ")]
    assert {r[0] for r in rows} == {"step", "e2e", "mini", "torchrun", "reframe"}, proc.stdout
    assert not [r for r in rows if r[2] in ("ERROR", "FAIL")], proc.stdout
    text = proc.stdout
    assert text.startswith("# gpu_check host ") and "DRY RUN on the CPU" in text.splitlines()[0], text[:500]
    assert re.search(r"step +deepcam kit fp32 b1 .* ok +" + NUMBER + " samples/s", text), text
    assert re.search(r"step +deepcam kit fp16 b1 +REFUSED|step +deepcam kit fp16 b1 .* ok", text), text
    # OpenFold's own step (Trainer.step, its recycling schedule) last in the part: the mini config here
    assert re.search(rf"step +openfold kit fp32 b1 +ok +{NUMBER} samples/s, {NUMBER} ms/step \(crop 16, 2 Evoformer "
                     r"blocks, recycling 0-1 drawn per step, each once a period; 2 warm-up, 1 x 2 timed\)", text), text
    steps = [r[1].split()[0] for r in rows if r[0] == "step"]
    assert steps[-1] == "openfold" and steps.count("openfold") == 1, steps
    assert re.search(r"mini +deepcam deterministic twice: same curve +PASS", text), text
    assert re.search(r"reframe +CosmoFlowCheck %framework=pytorch +DRY", text), text
    assert re.search(r"reframe +DeepCAMCheck %framework=pytorch +DRY", text), text
    assert re.search(r"reframe +OpenFoldCheck %framework=pytorch +DRY", text), text
    # the whole path from files: sustained rate, first epoch, the loop's input wait (no GPU: no busy share)
    for case in ("cosmoflow fp32 b1", "deepcam fp32 b2"):
        assert re.search(rf"e2e +{case} from files +ok +{NUMBER} samples/s sustained \(median of epochs 2-4\), "
                         rf"{NUMBER} with evaluation, first epoch {NUMBER} s, whole run {NUMBER}; input wait {NUMBER}, "
                         r"GPU busy n/a", text), text
    # OpenFold's, last: no epochs, 4 train/eval cycles (its log's own figures: run_facts makes none)
    assert re.search(rf"e2e +openfold fp32 b1 from files +ok +{NUMBER} samples/s sustained \(median of cycles 2-4\), "
                     rf"{NUMBER} with evaluation, first cycle {NUMBER} s, whole run {NUMBER}; input wait {NUMBER}, "
                     r"GPU busy n/a", text), text
    e2e = [r[1] for r in rows if r[0] == "e2e"]
    assert e2e[-1] == "openfold fp32 b1 from files" and len(e2e) == 3, e2e
    assert [r["benchmark"] for r in json.loads((out / "gpu_check.json").read_text())["e2e"]][-1] == "openfold"


def test_gpu_check_refuses_what_it_would_overwrite(tmp_path):
    """--out DIR that already holds a table, --out or --workdir naming a file: one line, exit 2,
    before any work, and the table is left as it was (the dry run above writes a new one)."""
    work, out = tmp_path / "mine", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "keep.txt").write_text("the user's")
    (out / "gpu_check.txt").write_text("an earlier check's table\n")
    for args in (["--out", str(out)], ["--out", str(work / "keep.txt")], ["--workdir", str(work / "keep.txt")]):
        proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--dry", "--parts", "step", *args],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and args[1] in proc.stderr, proc.stderr
        assert not proc.stdout, proc.stdout
    assert (out / "gpu_check.txt").read_text() == "an earlier check's table\n"
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"] and sorted(p.name for p in out.iterdir()) == [
        "gpu_check.txt"]


@pytest.mark.parametrize("args,named", [(["--epochs", "1"], "--epochs '1'"), (["--epochs", "a"], "--epochs 'a'"),
                                        (["--timeout", "nan"], "--timeout nan"), (["--timeout", "x"], "--timeout 'x'"),
                                        (["--cases", "alone,foo"], "unknown foo")])
def test_shared_node_bad_argument_is_one_line(args, named):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "shared_node.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and named in proc.stderr, proc.stderr


def test_shared_node_prints_every_case():
    """Two cases (the figures are the bench's to report, not this test's): a line each with
    the epochs, the epoch time or none, the CPU wait the run measured, the ratio to alone."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "shared_node.py"), "--cases", "alone,other-session+threads1",
                           "--epochs", "2", "--timeout", "40"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("# host ") and "# autogroups " in proc.stdout
    for case in ("alone", r"other-session\+threads1"):
        assert re.search(rf"^{case}\s+epochs [0-2].*epoch\s+({NUMBER} s|> 40 s \(none\))\s+cpu_wait_share\s+({NUMBER}|-) \(sampled\s+({NUMBER}|-)\)",
                         proc.stdout, re.M), (case, proc.stdout)
    assert "work directory kept" not in proc.stdout


def test_feed_diag_compares_both_readers(tmp_path):
    """bench/feed_diag.py (the issue-40 investigation): the loader alone with the legacy reader
    and the kit's, a row each, on the CPU (--quick); --out refuses an existing directory."""
    out = tmp_path / "diag"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "feed_diag.py"), "--quick", "--parts", "loader",
                           "--threads", "1", "--seconds", "0.3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for bench in ("deepcam", "cosmoflow"):
        for reader in ("legacy", "raw"):
            assert re.search(rf"^loader {bench} +{reader} +threads  1: +{NUMBER} samples/s; per sample user +{NUMBER} ms",
                             proc.stdout, re.M), proc.stdout
    rows = json.loads((out / "feed_diag.json").read_text())
    assert len(rows) == 4 and all(r["samples_per_s"] > 0 for r in rows)
    again = subprocess.run([sys.executable, str(REPO / "bench" / "feed_diag.py"), "--quick", "--out", str(out)],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert again.returncode == 2 and again.stderr.strip().count("\n") == 0 and str(out) in again.stderr, again.stderr



# ---- what the bench scripts write (issue 41): a new work directory, new output files -------

JSON_SCRIPTS = {   # script -> arguments that would make it run (it must refuse before)
    "conv_efficiency.py": ["--size", "small", "--precisions", "fp32", "--reps", "1"],
    "mini_breakdown.py": ["--cases", "deepcam:pytorch", "--epochs", "1"],
    "side_by_side.py": ["--size", "small", "--rounds", "1", "--steps", "1", "--warmup", "0"],
    "cosmoflow_throughput.py": ["--sizes", "mini", "--parts", "raw", "--formats", "tfrecord", "--samples", "2"],
}


def bench(script: str, *args, timeout=120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(REPO / "bench" / script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def refused(proc, *needles) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, \
        (proc.returncode, proc.stderr[-2000:])
    assert not proc.stdout.strip(), f"refused after starting its work: {proc.stdout[-1000:]}"
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize("script", sorted(JSON_SCRIPTS))
def test_a_bench_json_that_exists_is_refused_before_any_work(tmp_path, script):
    """--json FILE that is there (the user's, an earlier run's) is one line, exit 2, and stays
    as it was; a directory or a missing directory likewise. It was overwritten (or, through
    the kit's writer without a check first, a traceback after all the work)."""
    mine = tmp_path / "figures.json"
    mine.write_text("the user's\n")
    refused(bench(script, *JSON_SCRIPTS[script], "--json", mine), "--json", mine, "exists")
    assert mine.read_text() == "the user's\n"
    refused(bench(script, *JSON_SCRIPTS[script], "--json", tmp_path), "--json", tmp_path, "is a directory")
    refused(bench(script, *JSON_SCRIPTS[script], "--json", tmp_path / "nope" / "f.json"), "--json",
            tmp_path / "nope", "no such directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]


WORKDIR_SCRIPTS = {   # script -> (option, arguments that would make it run)
    "acceptance_power.py": ("--workdir", ["--calibration-runs", "1", "--reruns", "0", "--faults", ""]),
    "cosmoflow_throughput.py": ("--workdir", JSON_SCRIPTS["cosmoflow_throughput.py"]),
    "fullsize_step.py": ("--workdir", ["--steps", "1", "--paths", "kit-pytorch-cosmoflow"]),
    "multirank_throughput.py": ("--workdir", ["--cases", "deepcam/pytorch", "--launcher", "torchrun"]),
    "mutation.py": ("--work", ["--cases", "1"]),
    "oc20_breakdown.py": ("--workdir", ["--epochs", "1"]),
}


@pytest.mark.parametrize("script", sorted(WORKDIR_SCRIPTS))
def test_a_bench_workdir_that_cannot_be_one_is_one_line(tmp_path, script):
    """A file given as the work directory, or a name longer than the file system takes: one
    line naming the option, exit 2, before any work (a file was mkdir's FileExistsError or
    NotADirectoryError traceback)."""
    option, args = WORKDIR_SCRIPTS[script]
    mine = tmp_path / "file"
    mine.write_text("the user's\n")
    refused(bench(script, *args, option, mine), option, mine, "not a directory")
    refused(bench(script, *args, option, tmp_path / ("n" * 300)), option, "longer than the 255")
    assert mine.read_text() == "the user's\n" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_the_bench_work_directory_is_a_new_one_inside_workdir(tmp_path, monkeypatch, capsys):
    """benchlib.own_workdir, which every bench script with a --workdir takes its directory
    from: a new directory inside the one given (made when missing); what else is there stays."""
    sys.path.insert(0, str(REPO / "bench"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    from benchlib import own_workdir
    given = tmp_path / "mine"
    given.mkdir()
    (given / "keep.txt").write_text("the user's")
    work = own_workdir("x", "--workdir", str(given), "hpckit-x-")
    assert work.parent == given and work.name.startswith("hpckit-x-") and list(work.iterdir()) == []
    again = own_workdir("x", "--workdir", str(given), "hpckit-x-")
    assert again != work and (given / "keep.txt").read_text() == "the user's"
    made = own_workdir("x", "--workdir", str(tmp_path / "new" / "deeper"), "hpckit-x-")
    assert made.parent == tmp_path / "new" / "deeper"
    with pytest.raises(SystemExit) as e:
        own_workdir("x", "--workdir", str(given / "keep.txt"), "hpckit-x-")
    assert e.value.code == 2 and capsys.readouterr().err == f"x: --workdir {given / 'keep.txt'}: not a directory\n"


def test_cosmoflow_throughput_keeps_the_workdirs_content_and_writes_a_new_json(tmp_path):
    """A run with --workdir DIR holding the user's file: the datasets go into a new directory
    inside DIR, removed at the end, the user's file stays; --json is written new, and the
    same --json again is refused (the script never rewrites a file, its own earlier one
    included)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("the user's")
    out = tmp_path / "raw.json"
    proc = bench("cosmoflow_throughput.py", *JSON_SCRIPTS["cosmoflow_throughput.py"], "--workdir", work, "--json", out,
                 timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"] and (work / "keep.txt").read_text() == "the user's"
    figures = json.loads(out.read_text())["figures"]
    assert len(figures) == 4 and all(f["samples/s"] > 0 for f in figures)
    written = out.read_text()
    refused(bench("cosmoflow_throughput.py", *JSON_SCRIPTS["cosmoflow_throughput.py"], "--json", out), "--json", out)
    assert out.read_text() == written


def test_multirank_works_in_a_new_directory_and_keeps_the_users(tmp_path):
    """A failed multirank run keeps its own directory for a post-mortem: a new one inside
    --workdir, beside the user's files, which stay."""
    (tmp_path / "keep.txt").write_text("the user's")
    proc = bench("multirank_throughput.py", "--cases", "deepcam/pytorch", "--epochs", "0", "--workdir", tmp_path,
                 timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0] == "keep.txt" and names[1].startswith("multirank-"), names
    assert (tmp_path / "keep.txt").read_text() == "the user's"
