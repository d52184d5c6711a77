#!/usr/bin/env python3
"""Where a mini run's wall time goes, end to end, and the loader's margin over the step.

    bench/mini_breakdown.py [--cases cosmoflow:pytorch,cosmoflow:tensorflow,deepcam:pytorch]
                            [--epochs 3] [--reframe] [--json FILE]

For each case: one mini dataset (`hpckit datagen --config mini`, seed 7), then one
`hpckit train --config mini --set train.n_epochs=E` as a user runs it (a fresh process,
seed 1, deterministic epoch count so cases compare), timed from outside. The wall time is
split with the MLPerf log's own timestamps:

    startup   process start -> first log line (interpreter, imports, launcher detection,
              dataset scan)
    init      first log line -> run_start (cache clear, model build, optimizer, tracing
              that happens at build time)
    staging   staging_start -> staging_stop (no --stage-dir here: the clock's overhead)
    train     sum of epoch_start -> eval_start
    eval      sum of eval_start -> eval_stop
    other     the rest inside run_start -> run_stop (logging, all-reduces, bookkeeping)
    exit      run_stop -> process exit (summary, teardown)

loader margin: the kit's own loader for the case (PyTorch DataLoader or tf.data with the
mini config's workers and prefetch) run alone over the training split, warm page cache,
in samples/s, divided by the run's training samples/s. Above 1 the loader keeps ahead of
the step; the figure says by how much. With PyTorch and loader_workers 0 loading is not
overlapped at all: then 1/margin is the share of the train time spent loading.

--reframe also runs the case's ReFrame check on the local profile (one check, `-n`) and
prints its wall time against the direct run's: ReFrame's own overhead (its start-up,
the dataset fixture, job script, sanity and performance parsing). The check trains to the
mini target, so its epoch count may differ: the line prints both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, cpu_flags  # noqa: E402

CASES = ("cosmoflow:pytorch", "cosmoflow:tensorflow", "deepcam:pytorch")


def hpckit(*args, env=None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "hpckit", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
    return t0, proc


def events(path: Path) -> list[dict]:
    """The log's events in order (kit logs are mlperf_logging's own format, one per line)."""
    out = []
    for line in path.read_text().splitlines():
        if line.startswith(":::MLLOG "):
            out.append(json.loads(line[len(":::MLLOG "):]))
    return out


def breakdown(start_s: float, end_s: float, evs: list[dict]) -> dict:
    t = lambda e: e["time_ms"] / 1000.0  # noqa: E731
    first = t(evs[0])
    by_key: dict[str, list[float]] = {}
    for e in evs:
        by_key.setdefault(e["key"], []).append(t(e))
    run_start, run_stop = by_key["run_start"][0], by_key["run_stop"][0]
    train = sum(b - a for a, b in zip(by_key.get("epoch_start", []), by_key.get("eval_start", [])))
    ev = sum(b - a for a, b in zip(by_key.get("eval_start", []), by_key.get("eval_stop", [])))
    staging = by_key["staging_stop"][0] - by_key["staging_start"][0] if "staging_stop" in by_key else 0.0
    parts = {"startup": first - start_s, "init": run_start - first, "staging": staging, "train": train,
             "eval": ev, "other": (run_stop - run_start) - staging - train - ev, "exit": end_s - run_stop}
    parts["wall"] = end_s - start_s
    return parts


def loader_rate(benchmark: str, framework: str, data_dir: Path) -> float:
    """Samples/s of the kit's training loader alone over the training split (warm cache)."""
    from hpckit.common.config import load_config
    cfg = load_config(benchmark, "mini")
    if benchmark == "cosmoflow":
        from hpckit.cosmoflow import data
        split = data.find_dataset(data_dir, cfg["data"]["n_train"], cfg["data"]["n_valid"])["train"]
        make = (lambda: data.torch_loader(split, cfg, train=True, seed=1)) if framework == "pytorch" \
            else (lambda: data.tf_dataset(split, cfg, train=True, seed=1))
    else:
        from hpckit.deepcam import data
        split = data.find_dataset(data_dir, cfg["data"]["n_train"], cfg["data"]["n_valid"])["train"]
        stats = data.load_stats(data_dir, cfg["data"]["n_channels"])
        make = lambda: data.torch_loader(split, stats, cfg, train=True, seed=1)  # noqa: E731
    for _ in make():          # warm the page cache and the loader's start-up
        pass
    t0, n = time.perf_counter(), 0
    for x, _ in make():
        n += int(x.shape[0])
    return n / (time.perf_counter() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reframe", action="store_true")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    from benchlib import output_path, write_output
    out_json = output_path("mini_breakdown", "--json", args.json)   # before any work
    cases = [c for c in args.cases.split(",") if c]
    if any(c not in CASES for c in cases) or args.epochs < 1:
        print(f"mini_breakdown: --cases from {', '.join(CASES)}; --epochs >= 1", file=sys.stderr)
        return 2
    print(f"mini_breakdown host={platform.node()} flags={cpu_flags()} cpus={len(os.sched_getaffinity(0))} "
          f"load1={os.getloadavg()[0]:.2f} epochs={args.epochs}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="hpckit-breakdown-") as tmp:
        tmp = Path(tmp)
        datasets: dict[str, Path] = {}
        for case in cases:
            benchmark, framework = case.split(":")
            if benchmark not in datasets:
                datasets[benchmark] = tmp / f"{benchmark}-data"
                _, proc = hpckit("datagen", benchmark, "--config", "mini", "--out", datasets[benchmark], "--seed", 7)
                if proc.returncode != 0:
                    print(f"mini_breakdown: datagen {benchmark} failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
                    return 1
            out = tmp / f"run-{benchmark}-{framework}"
            start, proc = hpckit("train", benchmark, "--data", datasets[benchmark], "--config", "mini",
                                 "--framework", framework, "--seed", 1, "--output-dir", out,
                                 "--set", f"train.n_epochs={args.epochs}")
            end = time.time()
            if not (out / "summary.json").is_file():
                print(f"mini_breakdown: {case} failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
                return 1
            summary = json.loads((out / "summary.json").read_text())
            parts = breakdown(start, end, events(out / "mlperf.log"))
            margin = loader_rate(benchmark, framework, datasets[benchmark]) / summary["train_samples_per_s"]
            from hpckit.common.config import load_config
            workers = load_config(benchmark, "mini")["data"]["loader_workers"]
            row = {"case": case, **{k: round(v, 2) for k, v in parts.items()}, "epochs": summary["epochs"],
                   "train_samples_per_s": round(summary["train_samples_per_s"], 1), "loader_margin": round(margin, 2)}
            if args.reframe:
                t0 = time.time()
                check = "DeepCAMCheck" if benchmark == "deepcam" else f"CosmoFlowCheck%framework={framework}"
                rfm = subprocess.run([str(Path(sys.executable).with_name("reframe")), "-C",
                                      "site_profiles/local/settings.py", "-c", "reframe_checks/", "-r", "-n", check,
                                      "--prefix", str(tmp / f"rfm-{benchmark}-{framework}")],
                                     capture_output=True, text=True, cwd=REPO)
                row["reframe_wall"] = round(time.time() - t0, 2)
                row["reframe_rc"] = rfm.returncode
            results.append(row)
            shares = " ".join(f"{k}={parts[k]:.1f}s({100 * parts[k] / parts['wall']:.0f}%)"
                              for k in ("startup", "init", "staging", "train", "eval", "other", "exit"))
            line = (f"{case} wall={parts['wall']:.1f}s {shares} epochs={summary['epochs']} "
                    f"train_samples/s={summary['train_samples_per_s']:.1f} loader_margin={margin:.2f}x")
            if framework == "pytorch" and workers == 0:
                line += f" (loader_workers 0: loading is inline, about {100 / margin:.0f}% of the train time)"
            if args.reframe:
                line += f" reframe_wall={row['reframe_wall']:.1f}s (rc {row['reframe_rc']}, trains to the target)"
            print(line, flush=True)
    if out_json:
        write_output("mini_breakdown", "--json", out_json, json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
