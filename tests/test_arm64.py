"""The kit on arm64 with 512-bit SVE, under emulation: an arm64 Debian bookworm root file
system with the aarch64 wheels of the kit's pins (tests/arm64/build_rootfs.sh, run here
when missing), entered with chroot, every arm64 binary run by qemu-aarch64 (binfmt_misc)
as QEMU's A64FX model with a 512-bit vector length (QEMU_CPU).

What runs: what the kit reads of the machine (the emulated process sees the HOST's
/proc/cpuinfo: the kit must take the CPU from the auxiliary vector), the allocator it
finds, `hpckit describe`, datagen, a bounded CosmoFlow run (train.max_steps) per framework
and a DeepCAM one, their MLPerf logs and `hpckit check` (the trainings only with
HPCKIT_ARM64_ALL=1, as `make arm64` sets; CI runs the probe, describe and the allocator). Times under emulation are NOT
speed figures: QEMU translates every instruction, SVE included.

Needs root, Debian's qemu-user-static and binfmt-support, debootstrap, and network for the
first build (deb.debian.org, PyPI). Without them the tests skip saying why, except under
CI=true, where they fail. SLOW: minutes (see docs/targets.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import background
from conftest import REPO

pytestmark = pytest.mark.slow

BUILD = Path(os.environ.get("HPCKIT_ARM64_DIR", REPO / "build" / "arm64"))
ROOT = BUILD / "rootfs"
# QEMU 7.2's A64FX model (SVE 128/256/512, no BF16 as the chip), 64-byte vectors as A64FX
QEMU_CPU = "a64fx,sve-default-vector-length=64"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (binfmt_misc, chroot)"
    for tool in ("qemu-aarch64-static", "debootstrap", "update-binfmts"):
        if shutil.which(tool) is None:
            return f"no {tool} (apt-get install qemu-user-static binfmt-support debootstrap)"
    return None


def _build_rootfs() -> dict:
    """tests/arm64/build_rootfs.sh, in the background (tests/background.py): {"why": why it
    cannot run here, or None once the root file system is there, "times": what it took}."""
    why = _missing()
    if why:
        return {"why": why}
    t0 = time.monotonic()
    proc = background.run(["sh", "tests/arm64/build_rootfs.sh", BUILD], 3600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"why": None, "times": f"arm64 root file system: {time.monotonic() - t0:.0f} s "
                                  f"(in the background at nice {background.NICE})"}


BACKGROUND = {"rootfs": (_build_rootfs, None)}


@pytest.fixture(scope="module")
def rootfs():
    built = background.result("rootfs", *BACKGROUND["rootfs"])
    if built["why"]:
        if os.environ.get("CI") == "true":
            pytest.fail(f"arm64 emulation under CI: {built['why']}")
        pytest.skip(built["why"])
    print(f"\n{built['times']}")
    # this checkout's kit, fresh
    shutil.rmtree(ROOT / "opt" / "hpckit", ignore_errors=True)
    shutil.copytree(REPO / "apps", ROOT / "opt" / "hpckit" / "apps", ignore=shutil.ignore_patterns("__pycache__"))
    proc_dir = ROOT / "proc"
    mounted = os.path.ismount(proc_dir)
    if not mounted:
        subprocess.run(["mount", "-t", "proc", "proc", str(proc_dir)], check=True)
    work = ROOT / "tmp" / "hpckit-test"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    yield ROOT
    shutil.rmtree(work, ignore_errors=True)
    if not mounted:
        subprocess.run(["umount", str(proc_dir)], check=False)


def emulated(*args, qemu_cpu=QEMU_CPU, timeout=1800) -> subprocess.CompletedProcess:
    """Run `args` (a command inside the root file system) as an arm64 process."""
    env = [f"QEMU_CPU={qemu_cpu}", "PATH=/usr/bin:/bin", "HOME=/tmp", "LC_ALL=C.UTF-8", "PYTHONUNBUFFERED=1",
           "PYTHONPATH=/opt/site:/opt/hpckit/apps", "TF_CPP_MIN_LOG_LEVEL=3"]
    return subprocess.run(["chroot", str(ROOT), "/usr/bin/env", "-i", *env, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def hpckit(*args, **kw) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    proc = emulated("/usr/bin/python3.11", "-m", "hpckit", *args, **kw)
    # wall times of emulated commands, printed (pytest -s) labelled: NOT speed figures
    print(f"[emulated arm64, not a speed figure] hpckit {args[0]} {args[1] if len(args) > 1 else ''}: "
          f"{time.monotonic() - t0:.0f} s wall")
    return proc


def has_torch() -> bool:
    return (ROOT / "opt" / "site" / "torch").is_dir()


def assert_torch_recorded(out_in_root: str) -> None:
    """The run records the torch it ran with, and that is the one build_rootfs.sh installed
    (the kit's pin, or PyPI's aarch64 CPU build where PyTorch's index is unreachable: a
    deviation the results carry)."""
    installed = (ROOT / "opt" / "site" / ".torch").read_text().split()[0]   # torch==X[+cpu]
    summary = json.loads((ROOT / out_in_root.lstrip("/") / "summary.json").read_text())
    # PyPI's aarch64 wheel calls itself X+cpu (torch.__version__): a CPU build, as installed
    assert summary["software"]["torch"].split("+")[0] == installed.split("==")[1].split("+")[0], \
        (summary["software"], installed)


PROBE = """
import ctypes, json, os, platform
from hpckit.common import cores, memory
from hpckit.cosmoflow.train import choose_framework
i = cores.cpuinfo()
p = cores.plan(0, 1, None, 4)
print(json.dumps({"machine": platform.machine(), "proc_cpuinfo_arch": cores.parse_cpuinfo(open("/proc/cpuinfo").read()).arch,
    "arch": i.arch, "source": i.source, "flags": sorted(i.flags), "class": cores.cpu_class(i), "bf16": cores.has_bf16(i),
    "onednn": cores.onednn_isa(i), "key": cores.machine_key(), "tcmalloc": memory.find_tcmalloc(),
    "sve_vl_bytes": ctypes.CDLL(None).prctl(51, 0, 0, 0, 0) & 0xffff, "threads": p.threads, "cpus": len(p.cpus),
    "affinity": len(os.sched_getaffinity(0)), "framework_auto": choose_framework("auto", "cpu")}))
"""


def test_the_kit_reads_the_emulated_cpu(rootfs):
    proc = emulated("/usr/bin/python3.11", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a64fx = json.loads(proc.stdout.splitlines()[-1])
    # the emulated process is aarch64 and sees the x86 host's /proc/cpuinfo ...
    assert a64fx["machine"] == "aarch64" and a64fx["proc_cpuinfo_arch"] == "x86_64", a64fx
    # ... and the kit takes the CPU from the auxiliary vector: A64FX's SVE, no bf16
    assert a64fx["arch"] == "aarch64" and a64fx["source"].startswith("auxv"), a64fx
    assert {"sve", "asimd", "fphp", "asimdhp"} <= set(a64fx["flags"]) and "bf16" not in a64fx["flags"], a64fx
    assert (a64fx["class"], a64fx["bf16"], a64fx["onednn"], a64fx["sve_vl_bytes"]) == ("aarch64-sve", False, "sve", 64)
    assert a64fx["tcmalloc"] == "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4", a64fx
    assert a64fx["threads"] == a64fx["cpus"] == a64fx["affinity"] >= 1, a64fx
    assert a64fx["framework_auto"] == "pytorch"
    # QEMU's `max` CPU has FEAT_BF16: bf16 acceptance follows the CPU the process runs on
    proc = emulated("/usr/bin/python3.11", "-c", PROBE, qemu_cpu="max,sve512=on")
    assert proc.returncode == 0, proc.stderr[-3000:]
    neoverse = json.loads(proc.stdout.splitlines()[-1])
    assert "bf16" in neoverse["flags"] and neoverse["bf16"] is True and neoverse["key"] != a64fx["key"], neoverse


def _events(log: Path):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if ":::MLLOG " in line]


def _bounded_run_checked(out_in_root: str, n_train: int):
    out = ROOT / out_in_root.lstrip("/")
    events = _events(out / "mlperf.log")
    stop = events[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "aborted", stop
    assert stop["metadata"]["reason"].startswith("step-limited: train.max_steps 2 reached"), stop
    assert next(e for e in events if e["key"] == "train_samples")["value"] == n_train
    config = next(e for e in events if e["key"] == "hpckit_config")["value"]
    check = hpckit("check", f"{out_in_root}/mlperf.log", "--ruleset", "hpc-3.0.0")
    assert check.returncode == 1 and check.stdout.startswith("NOT COMPLIANT"), check.stdout + check.stderr
    return config


# CI runs the CPU probe under emulation (above). The bounded trainings, CosmoFlow with PyTorch
# (what --framework auto picks on A64FX; 164 s under emulation in the local CI-style run of
# 2026-11-28) and with TensorFlow, and DeepCAM's (614 s in the CI of 2026-11-27), run with
# `make arm64` (HPCKIT_ARM64_ALL=1) and `make arm64-image`: CI's time is near its limit.
ALL = os.environ.get("HPCKIT_ARM64_ALL") == "1"


@pytest.mark.parametrize("framework", [
    pytest.param("tensorflow", marks=pytest.mark.skipif(not ALL, reason="CosmoFlow/TensorFlow on arm64: "
                                                        "make arm64 (HPCKIT_ARM64_ALL=1) runs it, CI does not")),
    pytest.param("pytorch", marks=pytest.mark.skipif(not ALL, reason="CosmoFlow/PyTorch on arm64: make arm64 "
                                                     "(HPCKIT_ARM64_ALL=1) runs it, CI does not (164 s under "
                                                     "emulation on 2026-11-28, CI's 90-minute limit)"))])
def test_cosmoflow_bounded_run(rootfs, framework):
    if framework == "pytorch" and not has_torch():
        pytest.skip("no aarch64 CPU torch in the root file system (ARM64_TORCH_FALLBACK=none, or neither "
                    "download.pytorch.org/whl/cpu nor PyPI reachable: tests/arm64/build_rootfs.sh)")
    desc = hpckit("describe", "cosmoflow", "--config", "mini", "--framework", framework)
    assert desc.returncode == 0 and desc.stdout.splitlines()[0] == f"CosmoFlow, config mini, {framework}", \
        desc.stdout + desc.stderr[-2000:]
    data = f"/tmp/hpckit-test/cosmo-{framework}"
    gen = hpckit("datagen", "cosmoflow", "--config", "mini", "--out", data, "--train", "16", "--valid", "8",
                 "--seed", "7")
    assert gen.returncode == 0, gen.stderr[-2000:]
    out = f"/tmp/hpckit-test/cosmo-{framework}-out"
    run = hpckit("train", "cosmoflow", "--data", data, "--config", "mini", "--framework", framework,
                 "--output-dir", out, "--seed", "1", "--set", "train.max_steps=2", "--set", "data.n_train=16",
                 "--set", "data.n_valid=8")
    assert run.returncode == 3 and "Traceback" not in run.stderr, run.stderr[-3000:]
    config = _bounded_run_checked(out, 16)
    assert config["framework"] == framework
    if framework == "pytorch":
        assert_torch_recorded(out)


@pytest.mark.skipif(not ALL, reason="DeepCAM on arm64: make arm64 (HPCKIT_ARM64_ALL=1) runs it, CI does not "
                                    "(614 s under emulation in the CI of 2026-11-27, its longest test)")
def test_deepcam_bounded_run(rootfs):
    if not has_torch():
        pytest.skip("no aarch64 CPU torch in the root file system (ARM64_TORCH_FALLBACK=none, or neither "
                    "download.pytorch.org/whl/cpu nor PyPI reachable: tests/arm64/build_rootfs.sh)")
    data = "/tmp/hpckit-test/deepcam"
    gen = hpckit("datagen", "deepcam", "--config", "mini", "--out", data, "--train", "8", "--valid", "4", "--seed", "7")
    assert gen.returncode == 0, gen.stderr[-2000:]
    out = "/tmp/hpckit-test/deepcam-out"
    run = hpckit("train", "deepcam", "--data", data, "--config", "mini", "--output-dir", out, "--seed", "1",
                 "--set", "train.max_steps=2", "--set", "data.n_train=8", "--set", "data.n_valid=4")
    assert run.returncode == 3 and "Traceback" not in run.stderr, run.stderr[-3000:]
    _bounded_run_checked(out, 8)
    assert_torch_recorded(out)
