"""Real DeepCAM mini runs made with the kit's CLI, shared by test_analysis, test_deepcam_train,
test_package and test_report through conftest's session fixture `deepcam_runs`.

`deepcam_mini_runs(root)` generates the mini DeepCAM dataset and trains the five runs of
a DeepCAM submission, seeds 1..5, under `root`, each logged with submission_org `hpckit` and
submission_platform `local_cpu` (the local profile's system). Runs already there are
reused; nothing is faked. conftest makes them in the background at the session's start
(tests/background.py), with one thread each, so that a run at the lowest priority uses an
idle core and does not wait for a second one.
HPCKIT_TEST_RUNS_CACHE names a directory to keep them in across sessions instead (a
developer's shortcut).

The kit's mini runs stop at the mini target (IoU 0.80, run_stop status success); `hpckit
score` judges the kit's runs by the target their hpckit_config logged, published ones by
the official target. `mini_score` is that score.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_hpckit

ORG = "hpckit"
PLATFORM = "local_cpu"
DATA_SEED = 7
N_RUNS = 5   # a DeepCAM submission's runs (the rules' strong-scaling count)
THREADS = 1  # a niced run uses one idle core, never waits for a second


def deepcam_mini_runs(root: Path) -> list[Path]:
    root = root / "deepcam-mini-runs"
    data = root / "data"
    if not (data / "stats.h5").is_file():
        run_hpckit("datagen", "deepcam", "--config", "mini", "--out", data, "--seed", DATA_SEED, check=True)
    runs = []
    for seed in range(1, N_RUNS + 1):
        out = root / f"run_seed{seed}"
        summary = out / "summary.json"
        if not summary.is_file():
            proc = run_hpckit("train", "deepcam", "--data", data, "--config", "mini", "--output-dir", out,
                              "--seed", seed, "--set", f"mlperf.org={ORG}", "--set", f"mlperf.platform={PLATFORM}",
                              "--threads", THREADS, timeout=1800)
            assert proc.returncode in (0, 3), proc.stderr[-3000:]   # 3: trained to the end, target missed
        assert json.loads(summary.read_text())["status"] in ("success", "aborted")
        runs.append(out)
    return runs


def mini_score(runs: list[Path]) -> dict:
    """score.strong_score of the runs, as `hpckit score` computes it (the kit's runs are
    judged against the target of the config they logged in hpckit_config)."""
    from hpckit.results.logs import parse_log
    from hpckit.results.score import strong_score
    return strong_score([parse_log(r / "mlperf.log") for r in runs])
