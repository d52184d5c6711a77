#!/usr/bin/env python3
"""Acceptance power on this machine: calibrate, rerun unchanged, inject faults, count verdicts.

What a centre wants to know before trusting the local profile's performance verdicts:

1. calibrate: --calibration-runs unjudged runs of the local profile's checks (`reframe
   -r`, every check), then `hpckit references calibrate` (the defaults of `make
   calibrate`: median, tolerance 2x the largest deviation, clamped to [--floor, --ceiling]);
2. --reruns unchanged runs judged against those references: every FAIL is a false FAIL;
3. faults, each run once against the same references and expected to FAIL:
   half-cores   ReFrame (and so every rank) under taskset on half of the usable CPUs;
   throttle     the checks read a copy of the datasets from an ext4 loop device whose reads
                are capped (blkio cgroup) so that staging the larger one takes ~8 s (root);
   shuffled     the datasets generated with --shuffle-labels (a sanity FAIL: not converged).

Per run it prints each check's variables with the measured value, the reference, the
allowed range and ReFrame's verdict; at the end the false-FAIL count over the reruns and
which variable caught each fault. Run it on an otherwise idle machine; its figures are
this machine's. Everything goes into a new directory inside --workdir (default: a new
temporary directory); what else --workdir holds is left alone.

    .venv/bin/python bench/acceptance_power.py                               # 3 + 5, three faults
    .venv/bin/python bench/acceptance_power.py --reruns 10 --faults half-cores
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "apps"))
SETTINGS = "site_profiles/local/settings.py"
FAULTS = ("half-cores", "throttle", "shuffled")


def reframe(workdir: Path, *args, env=None, wrapper=()) -> tuple[int, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RFM_")}
    full_env.update(HOME=str(workdir / "home"), RFM_PREFIX=str(workdir / "rfm"), RFM_COLORIZE="n",
                    TMPDIR=str(workdir), **(env or {}))
    (workdir / "home").mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "reframe"
    proc = subprocess.run([*wrapper, str(exe), "-C", SETTINGS, "-c", "reframe_checks/", "-r", *args], cwd=REPO,
                          env=full_env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def figures(workdir: Path) -> list[dict]:
    from hpckit.results.perflog import allowed_range, read_perflogs
    rows = read_perflogs([str(workdir / "rfm" / "perflogs")])
    for r in rows:
        r["range"] = allowed_range(r)
    return rows


def show(label: str, rc: int, rows: list[dict], out: str) -> set[tuple[str, str]]:
    """Print a run's figures; return the (check, variable) pairs ReFrame failed."""
    failed = {(r["check"], r["var"]) for r in rows if r["result"] == "fail"}
    sanity = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("* Reason:")]
    print(f"{label}: reframe exit {rc}, {len(failed)} variable(s) failed"
          + (f", sanity: {'; '.join(sanity)}" if sanity and not failed else ""))
    for r in rows:
        rng = r["range"]
        shown = "unjudged" if rng is None else \
            f"[{'-inf' if rng[0] is None else f'{rng[0]:.4g}'}, {'inf' if rng[1] is None else f'{rng[1]:.4g}'}]"
        print(f"  {r['check']:<38} {r['var']:<17} {r['value']:>10.4g} {r['unit']:<10} ref {r['ref_value'] or 0:<9.4g} "
              f"allowed {shown:<22} {r['result']}")
    return failed


def make_throttled_copy(workdir: Path, data: dict[str, Path]):
    """ext4 on a loop device holding a copy of the datasets; returns (mount, major:minor, bytes)."""
    img, mnt = workdir / "disk.img", workdir / "mnt"
    mnt.mkdir()
    size = sum(p.stat().st_size for d in data.values() for p in d.rglob("*") if p.is_file())
    subprocess.run(["truncate", "-s", str(max(1 << 30, 3 * size)), str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    for name, src in data.items():
        subprocess.run(["cp", "-a", str(src), str(mnt / name)], check=True)
    dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(mnt)], capture_output=True, text=True,
                         check=True).stdout.strip()
    st = os.stat(dev)
    return mnt, f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}", size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration-runs", type=int, default=3)
    ap.add_argument("--reruns", type=int, default=5)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--floor", type=float, default=0.20, help="as make calibrate (default 0.20)")
    ap.add_argument("--ceiling", type=float, default=0.50)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        sys.exit(f"--faults: unknown {', '.join(sorted(unknown))} (known: {', '.join(FAULTS)})")
    from benchlib import own_workdir
    work = own_workdir("acceptance_power", "--workdir", args.workdir, "hpckit-acceptance-")
    from hpckit.common.cores import cpu_flags
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma")))
    print(f"host {platform.node()} cpus {len(os.sched_getaffinity(0))} flags {' '.join(flags)} "
          f"load1 {os.getloadavg()[0]:.2f} workdir {work}")

    calib = work / "calibration"
    for i in range(args.calibration_runs):
        rc, out = reframe(calib, env={"RFM_REFERENCE_PREFIX": str(REPO / "site_profiles" / "local")})
        if rc != 0:
            sys.exit(f"calibration run {i + 1} failed:\n{out[-3000:]}")
    refs = work / "refs" / "references.yaml"
    refs.parent.mkdir(exist_ok=True)   # the command writes a file only into an existing directory
    proc = subprocess.run([sys.executable, "-m", "hpckit", "references", "calibrate", "--perflog",
                           str(calib / "rfm" / "perflogs"), "--out", str(refs), "--floor", str(args.floor),
                           "--ceiling", str(args.ceiling)], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    print(f"calibrated from {args.calibration_runs} runs: {refs}")
    judged = {"RFM_REFERENCE_PREFIX": str(refs.parent)}

    false_fails = 0
    for i in range(args.reruns):
        d = work / f"rerun-{i + 1}"
        rc, out = reframe(d, env=judged)
        failed = show(f"unchanged rerun {i + 1}", rc, figures(d), out)
        false_fails += bool(failed) or rc != 0

    caught = {}
    for fault in faults:
        d = work / f"fault-{fault}"
        if fault == "half-cores":
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                print("half-cores: skipped (one CPU)")
                continue
            rc, out = reframe(d, env=judged, wrapper=("taskset", "-c", ",".join(map(str, cpus[: len(cpus) // 2]))))
        elif fault == "shuffled":
            rc, out = reframe(d, "-S", "CosmoFlowData.shuffle_labels=true", "-S", "DeepCAMData.shuffle_labels=true",
                              "-S", "CosmoFlowCheck.overrides=train.n_epochs=8",
                              "-S", "DeepCAMCheck.overrides=train.n_epochs=8", env=judged)
        else:
            if os.geteuid() != 0 or not Path("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device").exists():
                print("throttle: skipped (needs root and the cgroup v1 blkio controller)")
                continue
            data = {}
            for bench in ("cosmoflow", "deepcam"):
                data[bench] = d / "src" / bench
                subprocess.run([sys.executable, "-m", "hpckit", "datagen", bench, "--config", "mini", "--out",
                                str(data[bench]), "--seed", "0"], cwd=REPO, check=True, capture_output=True)
            mnt, dev, nbytes = make_throttled_copy(d, data)
            group = Path("/sys/fs/cgroup/blkio") / f"hpckit-acceptance-{os.getpid()}"
            group.mkdir()
            try:
                largest = max(sum(p.stat().st_size for p in (mnt / b).rglob("*") if p.is_file()) for b in data)
                (group / "blkio.throttle.read_bps_device").write_text(f"{dev} {max(1 << 20, largest // 8)}\n")
                join = ("sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh")
                rc = 0
                outs = []
                for bench, check in (("cosmoflow", "CosmoFlowCheck"), ("deepcam", "DeepCAMCheck")):
                    r, out = reframe(d / bench, "-n", check, "-S", f"data_dir={mnt / bench}", env=judged,
                                     wrapper=join)
                    rc, outs = rc or r, outs + [out]
                out = "\n".join(outs)
                rows = figures(d / "cosmoflow") + figures(d / "deepcam")
            finally:
                subprocess.run(["umount", "-l", str(mnt)], check=False)
                group.rmdir()
            caught[fault] = show(f"fault {fault} ({nbytes / 1e6:.0f} MB of datasets, reads capped)", rc, rows, out)
            continue
        caught[fault] = show(f"fault {fault}", rc, figures(d), out)
        if fault == "shuffled" and rc != 0 and not caught[fault]:
            caught[fault] = {("sanity", "not converged")}

    print(f"false FAILs: {false_fails} of {args.reruns} unchanged reruns")
    for fault, failed in caught.items():
        print(f"fault {fault}: {'caught by ' + ', '.join(sorted({v for _, v in failed})) if failed else 'NOT caught'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
