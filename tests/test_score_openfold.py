"""OpenFold result sets scored as the official result summarizer scores them: synthetic sets
of hpc 3.0.0 OpenFold logs, with the installed summarizer run beside the kit (CI), and the
published MLPerf HPC v3.0 OpenFold folders against the figures the summarizer printed for
them (HPCKIT_RESULTS_V3=<an extracted hpc_results_v3.0>; its logs are not in the kit)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import run_hpckit

pytest.importorskip("mlperf_logging")

# ---- synthetic OpenFold sets, the installed summarizer beside the kit -------------------

DESC = {"division": "closed", "status": "onprem", "submitter": "Org", "system_name": "box",
        "host_processor_model_name": "cpu", "host_processor_core_count": 16, "host_processors_per_node": 2,
        "number_of_nodes": 4, "accelerator_model_name": "gpu", "accelerators_per_node": 4,
        "framework": "PyTorch", "hw_notes": "", "sw_notes": ""}


def _line(t: int, key: str, value=None, etype="POINT_IN_TIME", **meta) -> str:
    rec = {"namespace": "", "time_ms": t, "event_type": etype, "key": key, "value": value,
           "metadata": {"file": "train.py", "lineno": 1, **meta}}
    return ":::MLLOG " + json.dumps(rec)


@pytest.fixture(scope="module")
def hyper():
    """The hyper-parameter keys `hpckit train openfold` logs, with the reference config's
    values (those closed_openfold.yaml fixes), at global batch 256, and the dataloader type it
    logs at staging."""
    from hpckit.common.config import load_config
    from hpckit.openfold.train import hyperparameters
    cfg = load_config("openfold", "reference")
    t = cfg["train"]
    return hyperparameters(cfg, 256, SimpleNamespace(sha256=t["init_checkpoint_sha256"]), t["model_parameters_count"]) \
        + [("initial_training_dataloader_type", t["dataloader_type"])]   # logged at staging (train.py)


def write_openfold_log(path: Path, hyper, *, start: int, minutes: float, cycles: int, reach: bool = True,
                       nodes: int = 4, instance: int | None = None, seed: int = 1) -> Path:
    """One run: submission and hyper-parameter keys, staging, `cycles` train/eval cycles of
    val_every_iters steps (epoch_num: the training samples seen, as the reference logs it),
    lDDT-Ca 0.8 reached at the last (or never), run_stop."""
    inst = {"instance": instance} if instance is not None else {}
    stop = start + int(minutes * 60000)
    t0 = start - 1000
    lines = [_line(t0, "cache_clear", True)]
    lines += [_line(t0, k, v) for k, v in (
        ("submission_benchmark", "openfold"), ("submission_org", "Org"), ("submission_division", "closed"),
        ("submission_status", "onprem"), ("submission_platform", "box"), ("number_of_nodes", nodes),
        ("accelerators_per_node", 4), ("seed", seed), ("gradient_accumulation_frequency", 1),
        ("train_samples", 594595), ("eval_samples", 180))]
    lines.append(_line(t0, "init_start", etype="INTERVAL_START"))
    lines += [_line(t0 + 1, k, v) for k, v in hyper]
    lines.append(_line(start - 1, "init_stop", etype="INTERVAL_END"))
    lines.append(_line(start, "run_start", etype="INTERVAL_START", **inst))
    lines += [_line(start + 1, "staging_start", etype="INTERVAL_START"),
              _line(start + 2, "staging_stop", etype="INTERVAL_END")]
    per = 256 * 40
    step = (stop - start - 10) // cycles
    for c in range(1, cycles + 1):
        t = start + 5 + (c - 1) * step
        lines += [_line(t, "epoch_start", etype="INTERVAL_START", epoch_num=c * per, **inst),
                  _line(t + step - 3, "epoch_stop", etype="INTERVAL_END", epoch_num=c * per, **inst),
                  _line(t + step - 3, "eval_start", etype="INTERVAL_START", epoch_num=c * per, **inst),
                  _line(t + step - 1, "eval_accuracy", 0.8 if (reach and c == cycles) else 0.7 + c / 1000,
                        epoch_num=c * per, **inst),
                  _line(t + step - 1, "eval_stop", etype="INTERVAL_END", epoch_num=c * per, **inst)]
    lines.append(_line(stop, "run_stop", etype="INTERVAL_END", status="success", **inst))
    path.write_text("\n".join(lines) + "\n")
    return path


def _official(org: Path) -> tuple:
    """The installed summarizer on a copy (it writes scaling.json into what it reads)."""
    from mlperf_logging.result_summarizer import result_summarizer as rs
    copy = org.parent / "official" / org.name
    shutil.copytree(org, copy)
    with contextlib.redirect_stdout(io.StringIO()):
        strong, weak, *_ = rs.summarize_results(str(copy), "hpc", "3.0.0")
    return strong, weak


def test_synthetic_openfold_sets_score_as_the_official_summarizer(tmp_path, hyper):
    """A strong set of 10 runs, one of which never reaches lDDT-Ca 0.8 (dropped as the slowest),
    and a weak set of 11 instances, one not converged: hpc 3.0.0 compliant logs that the
    official checker passes; the kit's figures equal the installed summarizer's. The runs
    converge in 14-15 cycles of 40 steps at batch 256 (143,360-153,600 samples), above the
    RCP mean, so no scaling factor enters either figure."""
    org = tmp_path / "tree" / "Org"
    (org / "systems").mkdir(parents=True)
    (org / "systems" / "box.json").write_text(json.dumps(DESC))
    strong = org / "results" / "box" / "strong" / "openfold"
    weak = org / "results" / "box" / "weak" / "openfold"
    strong.mkdir(parents=True)
    weak.mkdir(parents=True)
    minutes = (31.0, 29.5, 33.25, 30.0, 28.75, 35.5, 30.5, 32.0, 29.0, 40.0)
    for i, m in enumerate(minutes):
        write_openfold_log(strong / f"result_{i}.txt", hyper, start=1_700_000_000_000 + i * 3_600_000, minutes=m,
                           cycles=14 + i % 2, reach=(i != 3), seed=i + 1)
    for i in range(11):
        write_openfold_log(weak / f"result_{i}.txt", hyper, start=1_700_100_000_000 + i * 7_000, minutes=20.0 + i / 4,
                           cycles=15, reach=(i != 10), nodes=44, instance=i, seed=100 + i)
    js = tmp_path / "kit.json"
    proc = run_hpckit("score", org, "--ruleset", "hpc-3.0.0", "--json", js, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    kit = {Path(s["source"]).parent.name: s for s in json.loads(js.read_text())["sets"]}
    ks, kw = kit["strong"]["score"], kit["weak"]["score"]
    assert [r["counts"] for r in kit["strong"]["runs"]] == [i != 3 for i in range(10)]
    assert ks["scaling_factor"] == 1.0 and ks["runs_used"] == 8
    # the fastest (28.75) and the non-converged run (as the slowest) dropped
    assert ks["score_min"] == pytest.approx(sum(sorted(m for i, m in enumerate(minutes) if i != 3)[1:]) / 8)
    assert (kw["number_of_models"], kw["instance_scale"], kw["valid"]) == (10, 176, True)

    strong_df, weak_df = _official(org)
    assert ks["score_min"] == pytest.approx(float(strong_df.iloc[0]["openfold"]), abs=1e-9)
    row = weak_df.iloc[0]
    assert kw["number_of_models"] == row["openfold:number_of_models"]
    assert kw["instance_scale"] == row["openfold:instance_scale"]
    assert kw["time_to_train_all_min"] == pytest.approx(float(row["openfold:time_to_train_all"]), abs=1e-9)

    # the projection's validation: a row per OpenFold set, skipped here (one submitter: no
    # other submitter's record to predict it from), its measured figure the olympic mean of the
    # converged runs (project.validate's, which is the unscaled score where every run converged,
    # as in the published sets)
    vj = tmp_path / "val.json"
    proc = run_hpckit("project", "--validate", "--published", org, "--json", vj, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["scaling"]: r for r in json.loads(vj.read_text())["sets"] if r["benchmark"] == "openfold"}
    assert set(rows) == {"strong", "weak"} and all("no other submitter" in r["skipped"] for r in rows.values())
    converged = sorted(m for i, m in enumerate(minutes) if i != 3)
    assert rows["strong"]["measured_min"] == pytest.approx(sum(converged[1:-1]) / 7, abs=1e-9)
    assert rows["weak"]["measured_min"] == pytest.approx(kw["time_to_train_all_min"], abs=1e-9)


def test_synthetic_openfold_weak_set_short_of_ten_models(tmp_path, hyper):
    """OpenFold needs 10 models in a weak set (benchmark_meta.py, hpc: 10): with 9 converged
    the kit's set is invalid and the summarizer prints no figure for it."""
    org = tmp_path / "tree" / "Org"
    (org / "systems").mkdir(parents=True)
    (org / "systems" / "box.json").write_text(json.dumps(DESC))
    weak = org / "results" / "box" / "weak" / "openfold"
    weak.mkdir(parents=True)
    for i in range(10):
        write_openfold_log(weak / f"result_{i}.txt", hyper, start=1_700_100_000_000 + i * 7_000, minutes=20.0,
                           cycles=15, reach=(i != 0), nodes=44, instance=i, seed=100 + i)
    proc = run_hpckit("score", org, "--ruleset", "hpc-3.0.0", timeout=300)
    assert proc.returncode == 1 and "invalid (9 converged instance(s), at least 10 needed" in proc.stdout
    _, weak_df = _official(org)
    assert len(weak_df) == 0 or all(str(v) == "nan" or v is None for v in weak_df.iloc[0].filter(like="openfold:"))


# ---- the published v3.0 OpenFold folders ------------------------------------------------

V3 = os.environ.get("HPCKIT_RESULTS_V3")
needs_v3 = pytest.mark.skipif(not V3 or not Path(V3).is_dir(),
                              reason="HPCKIT_RESULTS_V3 unset or not a folder: set it to an extracted "
                                     "mlcommons/hpc_results_v3.0 to score its published OpenFold folders")

# What mlperf_logging.result_summarizer 4.1.68 (`<org> hpc 3.0.0`, one run on each org folder
# of hpc_results_v3.0 as published, commit dfea490) printed for its OpenFold folders.
OFFICIAL_V3 = {
    "Clemson/results/18xR750-2xA100-PCIe-80GB/strong/openfold": 263.52031686921305,   # x its scaling.json 1.0231481
    "HPE+LBNL/results/perlmutter_224x4/strong/openfold": 14.64643125,
    "NVIDIA/results/eos_n260_ngc23.09_pytorch/strong/openfold": 7.5122375,
    "TACC/results/lonestar6-pytorch/strong/openfold": 157.2742666666667,
    "NVIDIA/results/eos_n256_ngc23.09_pytorch/weak/openfold": (16, 2048, 34.415),
}
# the scaling.json files the published OpenFold folders hold
PUBLISHED_SCALING = {"Clemson/results/18xR750-2xA100-PCIe-80GB/strong/openfold": 1.0231481481481484}
# The factor the RCP checker (4.1.68) writes for NVIDIA's eos_n260 set (mean 124,160 samples
# against the batch-256 RCP mean of 133,120): the package checker would apply it; the
# published tree holds no scaling.json there and the round published 7.51 min.
NVIDIA_RCP = 1.0721649484536082


@needs_v3
def test_published_v30_openfold_folders_give_the_official_figures(tmp_path):
    root = Path(V3)
    js = tmp_path / "pub.json"
    proc = run_hpckit("score", *[root / f for f in OFFICIAL_V3], "--ruleset", "hpc-3.0.0", "--as-published",
                      "--json", js, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    kit = {str(Path(s["source"]).relative_to(root)): s["score"] for s in json.loads(js.read_text())["sets"]}
    assert set(kit) == set(OFFICIAL_V3)
    for folder, official in OFFICIAL_V3.items():
        sc = kit[folder]
        assert sc["valid"], (folder, sc)
        if isinstance(official, tuple):
            assert (sc["number_of_models"], sc["instance_scale"]) == official[:2]
            assert sc["time_to_train_all_min"] == pytest.approx(official[2], abs=1e-9)
        else:
            assert sc["runs_used"] == 8 and sc["score_min"] == pytest.approx(official, abs=1e-9), folder

    # the projection's validation rows: one per OpenFold set, predicted (timeline.py gives its
    # cycles' samples; the record its epochs to converge), measured = the unscaled figure
    vj = tmp_path / "val.json"
    proc = run_hpckit("project", "--validate", "--published", root, "--json", vj, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["org"], r["system"], r["scaling"]): r for r in json.loads(vj.read_text())["sets"]
            if r["benchmark"] == "openfold"}
    assert len(rows) == len(OFFICIAL_V3)
    for folder, official in OFFICIAL_V3.items():
        org, _, system, scaling, _ = folder.split("/")
        (r,) = [r for (o, sy, sc), r in rows.items() if sy == system and sc == scaling]
        assert "error" in r and "skipped" not in r, r
        unscaled = official[2] if isinstance(official, tuple) else official / (PUBLISHED_SCALING.get(folder, 1.0))
        assert r["measured_min"] == pytest.approx(unscaled, abs=1e-9)

    # without --as-published: the factor the official package checker would write first
    nv = root / "NVIDIA/results/eos_n260_ngc23.09_pytorch/strong/openfold"
    js2 = tmp_path / "pipeline.json"
    proc = run_hpckit("score", nv, "--json", js2, timeout=300)
    assert proc.returncode == 0, proc.stderr
    sc = json.loads(js2.read_text())["sets"][0]["score"]
    assert sc["scaling_factor"] == pytest.approx(NVIDIA_RCP, abs=1e-12)
    assert sc["score_min"] == pytest.approx(OFFICIAL_V3[str(nv.relative_to(root))] * NVIDIA_RCP, abs=1e-9)
