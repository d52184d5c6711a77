#!/usr/bin/env python3
"""A rank on a machine shared with another job: the epoch time of the mini DeepCAM alone and
beside one process spinning on a core, side by side, with the CPU wait the run measured.

    .venv/bin/python bench/shared_node.py                    # every case, 3 epochs, 120 s each
    .venv/bin/python bench/shared_node.py --epochs 2 --timeout 60 --cases alone,other-session

The CPU scheduler shares a core between scheduling groups (cgroups, e.g. a container or a
Slurm step; autogroups, one per login session, where the kernel has them) before it shares
it between their threads, and balances groups, not threads. Cases, each a fresh `hpckit
train deepcam --config mini` on one synthetic dataset (datagen, in a temporary directory):

  alone                      nothing else computes
  same-session               one spinning process of this script's own session
  other-session              one spinning process of another session (setsid: its own
                             autogroup, as a container's cgroup or another user's login)
  other-session+passive      the same, the training with OMP_WAIT_POLICY=PASSIVE (OpenMP
                             threads that wait at a barrier sleep at once)
  other-session+threads1     the same, the training with --threads 1
  alone+passive, alone+threads1   what those two cost on an idle machine

Per case: the epochs that finished within --timeout, the median epoch time after the
first (the first compiles and warms), the CPU wait share the run measured over its
finished epochs' training (the log's hpckit_epoch_usage lines, hpckit/common/usage.py),
the same share sampled from outside over the whole run from its 5th second (a run that
finishes no epoch has only this one), and the ratio to `alone`. The header says the machine,
its CPU flags, whether autogroups are on, and the load at start: run it on an idle machine.
Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, bad as _bad, finish, machine_line, records  # noqa: E402
from hpckit.common import usage  # noqa: E402

HPCKIT = [sys.executable, "-m", "hpckit"]
SPIN = "while True:\n    pass\n"
CASES = {   # name: (spinner: None | "same" | "other", extra environment, extra train arguments)
    "alone": (None, {}, []),
    "same-session": ("same", {}, []),
    "other-session": ("other", {}, []),
    "other-session+passive": ("other", {"OMP_WAIT_POLICY": "PASSIVE"}, []),
    "other-session+threads1": ("other", {}, ["--threads", "1"]),
    "alone+passive": (None, {"OMP_WAIT_POLICY": "PASSIVE"}, []),
    "alone+threads1": (None, {}, ["--threads", "1"]),
}


def bad(message: str) -> None:
    _bad("shared_node", message)


def autogroups() -> str:
    try:
        return "on" if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1" else "off"
    except OSError:
        return "not in this kernel"


def run_case(name: str, data: Path, out: Path, epochs: int, timeout: float) -> dict:
    spinner_kind, extra_env, extra_args = CASES[name]
    spinner = None
    if spinner_kind:
        spinner = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=spinner_kind == "other")
    env = {**{k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"},
           "PYTHONPATH": str(REPO / "apps"), **extra_env}
    try:
        proc = subprocess.Popen([*HPCKIT, "train", "deepcam", "--data", str(data), "--config", "mini",
                                 "--output-dir", str(out), "--seed", "1", "--set", f"train.n_epochs={epochs}",
                                 *extra_args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, process_group=0)   # this session: its autogroup
        # the CPU wait as seen from outside, over the whole run from its 5th second (the
        # run's own figure covers finished epochs only; a run that finishes none has none)
        first = last = None
        t0 = time.monotonic()
        stopped = False
        while proc.poll() is None:
            if time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGTERM)
                stopped = True
                break
            time.sleep(1)
            sample = usage.cpu_counters(proc.pid) if time.monotonic() - t0 >= 5 else None
            if sample:
                first, last = first or sample, sample
        _, err = proc.communicate(timeout=60)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    log = out / "mlperf.log"
    events = records(log) if log.is_file() else []
    starts = {e["metadata"]["epoch_num"]: e["time_ms"] for e in events if e["key"] == "epoch_start"}
    stops = {e["metadata"]["epoch_num"]: e["time_ms"] for e in events if e["key"] == "epoch_stop"}
    seconds = [(stops[k] - starts[k]) / 1000 for k in sorted(stops) if k in starts]
    waits = [e["value"].get("cpu_wait_share") for e in events if e["key"] == "hpckit_epoch_usage"]
    waits = [w for w in waits if w is not None]
    sampled = usage.cpu_delta(first, last) if first and last is not first else None
    if not stopped and proc.returncode not in (0, 3):
        print(f"# {name}: hpckit train exited {proc.returncode}: {err.strip().splitlines()[-1:] or ''}")
    return {"name": name, "epochs": len(seconds), "stopped": stopped,
            "epoch_s": statistics.median(seconds[1:] or seconds) if seconds else None,
            "cpu_wait": statistics.mean(waits) if waits else None,
            "sampled": usage.wait_share(sampled["ran_ns"], sampled["waited_ns"]) if sampled else None,
            "failed": not stopped and proc.returncode not in (0, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", default="3", help="epochs per case (default 3)")
    p.add_argument("--timeout", default="120", help="seconds per case before it is stopped (default 120)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    if not args.epochs.isdigit() or int(args.epochs) < 2:
        bad(f"--epochs {args.epochs!r}: a whole number, at least 2 (the first epoch is not timed)")
    args.epochs = int(args.epochs)
    try:
        args.timeout = float(args.timeout)
    except ValueError:
        bad(f"--timeout {args.timeout!r}: not a number of seconds")
    if not 10 <= args.timeout <= 3600:
        bad(f"--timeout {args.timeout}: between 10 and 3600 seconds")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        bad(f"--cases: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(CASES)}")
    if len(os.sched_getaffinity(0)) < 2:
        bad("needs 2 CPUs at least: one spinning process beside a rank that has them all")

    print(machine_line())
    print(f"# autogroups {autogroups()}; the mini DeepCAM, PyTorch, {len(os.sched_getaffinity(0))} CPUs, "
          f"{args.epochs} epochs or {args.timeout:.0f} s per case")
    work = Path(tempfile.mkdtemp(prefix="hpckit-shared-node-"))
    failed = False
    try:
        made = subprocess.run([*HPCKIT, "datagen", "deepcam", "--config", "mini", "--out", str(work / "data"),
                               "--seed", "1"], env={**os.environ, "PYTHONPATH": str(REPO / "apps")},
                              capture_output=True, text=True, timeout=600)
        if made.returncode != 0:
            print(f"# datagen failed: {made.stderr.strip()[-500:]}")
            return finish(work, args.keep, True)
        results = []
        for name in cases:
            t0 = time.monotonic()
            r = run_case(name, work / "data", work / name, args.epochs, args.timeout)
            failed |= r["failed"]
            results.append(r)
            base = next((x for x in results if x["name"] == "alone"), None)
            ratio = (f"{r['epoch_s'] / base['epoch_s']:.2f}x alone" if base and base["epoch_s"] and r["epoch_s"]
                     else "-")
            epoch = f"{r['epoch_s']:.1f} s" if r["epoch_s"] is not None else f"> {args.timeout:.0f} s (none)"
            wait = f"{r['cpu_wait']:.2f}" if r["cpu_wait"] is not None else "-"
            sampled = f"{r['sampled']:.2f}" if r["sampled"] is not None else "-"
            print(f"{name:24} epochs {r['epochs']}{' (stopped)' if r['stopped'] else ''}  epoch {epoch:>18}  "
                  f"cpu_wait_share {wait:>5} (sampled {sampled:>5})  {ratio}   ({time.monotonic() - t0:.0f} s)",
                  flush=True)
        return finish(work, args.keep, failed)
    except KeyboardInterrupt:
        return finish(work, True, True)


if __name__ == "__main__":
    sys.exit(main())
