"""Provenance (hpckit/common/provenance.py): what a run records about its software stack and
machine, and how two stacks are compared. The runtime parsers read files and variables in
the formats the runtimes write them; a real package change is made with pip (--target on
PYTHONPATH, as a site's upgrade shadows a package). The end-to-end path (run -> perflog ->
references header -> a FAILing check naming the change) is in test_reframe_checks.py; the
log line's compliance in test_deepcam_train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from hpckit.common import provenance as prov

REPO = Path(__file__).resolve().parents[1]
# a small pure-Python distribution of the stack that neither the kit nor ReFrame imports
SHADOWED = "iniconfig"


def other_version(dist: str) -> str:
    return "2.0.0" if metadata.version(dist) != "2.0.0" else "1.1.1"


def pip_target(target: Path, spec: str) -> None:
    """`pip install --target` from the package index; skipped where it is unreachable
    (CI must reach it: it installs the stack from there)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                           "--target", str(target), spec], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pip install {spec}: {proc.stderr[-2000:]}")
        pytest.skip(f"pip install {spec} failed (no package index?): {proc.stderr.strip()[-300:]}")


def test_collect_records_this_process():
    p = prov.collect("pytorch")
    installed = {}
    for d in metadata.distributions():   # the first of each name on sys.path, as import finds it
        installed.setdefault(prov._canonical(d.metadata["Name"]), d.version)
    assert p["packages"]["list"] == sorted(f"{n}=={v}" for n, v in installed.items())
    assert p["packages"]["count"] == len(installed)
    assert p["packages"]["sha256"] == prov.packages_digest(p["packages"]["list"])
    assert p["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert p["frameworks"]["numpy"] == __import__("numpy").__version__
    assert p["kit"]["version"] == __import__("hpckit").__version__
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True)
        if head.returncode == 0:
            assert p["kit"]["commit"] == head.stdout.strip()
            # without git (or where git refuses the checkout) HEAD is read from the files
            # (a worktree's .git file, loose or packed refs)
            assert prov._head_from_files(REPO / ".git") == head.stdout.strip()
            assert p["kit"]["dirty"] is bool(status.stdout.strip())
            assert ("dirty_sha256" in p["kit"]) is p["kit"]["dirty"]
    from hpckit.common import cores
    assert p["cpu"]["model"] == cores.cpu_model() and p["cpu"]["flags"] == sorted(cores.cpu_flags())
    assert p["cpu"]["machine_key"] == cores.machine_key()
    markers = [Path("/run/.containerenv"), Path("/.dockerenv")]
    env_markers = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "CH_RUNNING", "container",
                   "HPCKIT_CONTAINER_RUNTIME", "HPCKIT_CONTAINER_IMAGE")
    natively = not any(m.exists() for m in markers) and not any(os.environ.get(v) for v in env_markers) \
        and not any(k.startswith(("ENROOT_", "PYXIS_")) for k in os.environ)
    assert (p["container"] is None) is natively
    assert (p["gpu"] is None) is (not Path("/proc/driver/nvidia/version").exists()
                                  and not Path("/dev/nvidiactl").exists())
    # the log line drops only the package list
    line = prov.log_value(p)
    assert "list" not in line["packages"] and line["packages"]["sha256"] == p["packages"]["sha256"]
    assert {k: v for k, v in line.items() if k != "packages"} == {k: v for k, v in p.items() if k != "packages"}
    json.dumps(line)   # an MLPerf log value


def test_a_package_shadowed_on_pythonpath_is_recorded_and_named(tmp_path):
    """A different version of a real distribution, installed with pip --target and put
    first on PYTHONPATH (what `import` then gets), is what the record lists; the
    comparison with this process's stack names the package and both versions."""
    old, new = metadata.version(SHADOWED), other_version(SHADOWED)
    pip_target(tmp_path / "t", f"{SHADOWED}=={new}")
    code = "import json; from hpckit.common import provenance as p; print(json.dumps(p.collect()))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "t"), str(REPO / "apps")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    shadowed = json.loads(out.stdout)
    assert f"{SHADOWED}=={new}" in shadowed["packages"]["list"]
    assert f"{SHADOWED}=={old}" not in shadowed["packages"]["list"]
    here = prov.stack(prov.collect())
    there = prov.stack(shadowed)
    assert prov.stack_digest(here) != prov.stack_digest(there)
    assert prov.differences(here, there) == [f"{SHADOWED} {old} -> {new}"]
    assert prov.describe_change(here, there).endswith(f": {SHADOWED} {old} -> {new}")
    assert prov.differences(here, here) == [] and prov.describe_change(here, here) == ""


def test_differences_name_each_part():
    base = {"kit": "0.1.0", "commit": "a" * 40, "dirty": False, "dirty_sha256": None, "python": "3.11.7",
            "spack_lock": None, "image": None, "gpu_driver": None, "packages_sha256": "x",
            "packages": ["numpy==2.4.6", "six==1.17.0", "torch==2.13.0+cpu"]}
    ran = {**base, "commit": "b" * 40, "dirty": True, "dirty_sha256": "d", "spack_lock": "f" * 64,
           "image": "sha256:1234", "gpu_driver": "550.54.15", "packages_sha256": "y",
           "packages": ["numpy==2.4.7", "torch==2.13.0+cpu", "wheel==0.48.0"]}
    assert prov.differences(base, ran) == [
        f"kit commit {'a' * 12} -> {'b' * 12}", "kit tree dirty False -> True", f"spack.lock sha256 None -> {'f' * 12}",
        "container image None -> sha256:1234", "GPU driver None -> 550.54.15",
        "numpy 2.4.6 -> 2.4.7", "- six 1.17.0", "+ wheel 0.48.0"]
    # a log line without the package list: the digests are compared
    assert prov.differences({**base, "packages": None}, {**base, "packages": None, "packages_sha256": "y"}) == [
        "installed packages sha256 x -> y"]
    assert prov.differences(None, ran) == [] and prov.differences(base, None) == []
    long = prov.describe_change(base, ran, limit=3)
    assert long.count(";") == 3 and long.endswith("and 5 more")


def test_header_round_trip_and_yaml_readers_skip_it():
    import yaml
    s = prov.stack(prov.collect())
    lines = prov.header_lines(s)
    assert all(line.startswith("#") and len(line) <= 120 for line in lines)
    text = "\n".join(lines) + "\nCheck:\n  $index: [$partition]\n  'a:b':\n    x: [1, null, 0.1, s]\n"
    assert prov.parse_header(text) == s
    assert yaml.safe_load(text) == {"Check": {"$index": ["$partition"], "a:b": {"x": [1, None, 0.1, "s"]}}}
    assert prov.parse_header("# no stack here\nx: 1\n") is None
    assert prov.parse_header("\n".join(prov.header_lines(None))) is None


def test_container_runtimes_as_they_expose_themselves(tmp_path):
    """Each runtime's own marker, in the format it writes it (a root directory stands in
    for the container's /)."""
    assert prov.container({}, tmp_path) is None
    podman = tmp_path / "podman"
    (podman / "run").mkdir(parents=True)
    # podman run --privileged writes these keys (podman-run(1), "/run/.containerenv")
    (podman / "run" / ".containerenv").write_text(
        'engine="podman-5.4.2"\nname="hpckit-run"\nid="6d1f0a"\nimage="localhost/hpckit-local:latest"\n'
        'imageid="3c2e7f11a9"\nrootless=1\n')
    assert prov.container({}, podman) == {"runtime": "podman", "engine": "podman-5.4.2", "name": "hpckit-run",
                                          "id": "6d1f0a", "image": "localhost/hpckit-local:latest",
                                          "digest": "3c2e7f11a9", "rootless": "1"}
    (podman / "run" / ".containerenv").write_text("")   # unprivileged: an empty file
    assert prov.container({}, podman) == {"runtime": "podman"}
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / ".dockerenv").write_text("")
    assert prov.container({"HOSTNAME": "c0ffee"}, docker) == {"runtime": "docker", "id": "c0ffee"}
    sif = tmp_path / "sif"
    (sif / ".singularity.d").mkdir(parents=True)
    labels = '{"org.label-schema.build-date": "2026-11-20", "org.label-schema.usage.apptainer.version": "1.4.1"}'
    (sif / ".singularity.d" / "labels.json").write_text(labels)
    found = prov.container({"APPTAINER_CONTAINER": "/images/hpckit-a100.sif", "APPTAINER_NAME": "hpckit-a100.sif"},
                           sif)
    assert found["runtime"] == "apptainer" and found["image"] == "/images/hpckit-a100.sif"
    assert found["labels"]["org.label-schema.usage.apptainer.version"] == "1.4.1" and len(found["labels_sha256"]) == 64
    assert prov.container({"SINGULARITY_CONTAINER": "/x.sif"}, tmp_path)["runtime"] == "singularity"
    ch = tmp_path / "ch"
    (ch / "ch").mkdir(parents=True)
    (ch / "ch" / "metadata.json").write_text('{"arch": "amd64", "labels": {"org": "hpckit"}, "cwd": "/"}')
    found = prov.container({"CH_RUNNING": "Weird Al Yankovic"}, ch)
    assert found["runtime"] == "charliecloud" and found["arch"] == "amd64" and len(found["metadata_sha256"]) == 64
    found = prov.container({"ENROOT_ROOTFS": "/tmp/enroot-data/user-0/pyxis_1.0", "PYXIS_VERSION": "0.20.0"},
                           tmp_path)
    assert found == {"runtime": "enroot", "environment": {"ENROOT_ROOTFS": "/tmp/enroot-data/user-0/pyxis_1.0",
                                                          "PYXIS_VERSION": "0.20.0"}}
    assert prov.container({"container": "lxc"}, tmp_path) == {"runtime": "lxc"}
    # a launch line that names its image (sarus, enroot: no digest inside)
    found = prov.container({"HPCKIT_CONTAINER_RUNTIME": "sarus", "HPCKIT_CONTAINER_IMAGE": "hpckit/a100@sha256:ab"},
                           tmp_path)
    assert found == {"runtime": "sarus", "image": "hpckit/a100@sha256:ab",
                     "declared": {"runtime": "sarus", "image": "hpckit/a100@sha256:ab"}}
    assert prov.stack({"packages": {}, "container": found})["image"] == "hpckit/a100@sha256:ab"


def test_spack_environment_lock(tmp_path):
    env = tmp_path / "a100"
    env.mkdir()
    assert prov.spack_env({}) is None
    (env / "spack.yaml").write_text("spack:\n  specs: [mlperf-hpc-kit]\n")
    found = prov.spack_env({"SPACK_ENV": str(env)})
    assert found["lock_sha256"] is None and len(found["yaml_sha256"]) == 64   # not concretized yet
    lock = {"_meta": {"file-type": "spack-lockfile", "lockfile-version": 6, "specfile-version": 5},
            "spack": {"version": "1.1.0", "type": "git", "commit": "5f3c"},
            "roots": [{"hash": "abcdefgh", "spec": "mlperf-hpc-kit"}, {"hash": "12345678", "spec": "py-torch"}],
            "concrete_specs": {}}
    (env / "spack.lock").write_text(json.dumps(lock))
    found = prov.spack_env({"SPACK_ENV": str(env)})
    import hashlib
    assert found["lock_sha256"] == hashlib.sha256((env / "spack.lock").read_bytes()).hexdigest()
    assert found["roots"] == ["mlperf-hpc-kit /abcdefgh", "py-torch /12345678"] and found["spack"] == "1.1.0 5f3c"
    assert prov.stack({"packages": {}, "spack": found})["spack_lock"] == found["lock_sha256"]


def test_nvidia_driver_from_proc(tmp_path):
    nv = tmp_path / "proc" / "driver" / "nvidia"
    (nv / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    (nv / "version").write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
                                "GCC version:  gcc version 12.2.0\n")
    (nv / "gpus" / "0000:3b:00.0" / "information").write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 150\n")
    assert prov.gpu(tmp_path) == {"driver": "550.54.15", "models": ["NVIDIA H100 80GB HBM3"],
                                  "source": "/proc/driver/nvidia", "count": 1}
    assert prov.gpu(tmp_path / "none") is None


def test_log_and_summary_readers(tmp_path):
    p = prov.collect("tensorflow")
    run = tmp_path / "run"
    run.mkdir()
    rec = {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": prov.LOG_KEY,
           "value": prov.log_value(p), "metadata": {}}
    (run / "mlperf.log").write_text(f":::MLLOG {json.dumps(rec)}\n")
    assert prov.from_log(run / "mlperf.log") == prov.log_value(p)
    assert prov.of_run(run / "mlperf.log") == prov.log_value(p)     # no summary.json: the log line
    (run / "summary.json").write_text(json.dumps({"provenance": p}))
    assert prov.of_run(run / "mlperf.log") == p                      # with it: the package list too
    assert prov.from_log(tmp_path / "missing.log") is None
    assert "packages sha256" in prov.summary_line(p) and prov.summary_line(None) == "not recorded"


def test_head_from_files_reads_loose_and_packed_refs(tmp_path):
    import shutil
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "r"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", str(repo)], ["-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *args], check=True, env=env, capture_output=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert prov._head_from_files(repo / ".git") == head                       # loose ref
    subprocess.run(["git", "-C", str(repo), "pack-refs", "--all"], check=True, capture_output=True)
    assert not any((repo / ".git" / "refs" / "heads").iterdir())
    assert prov._head_from_files(repo / ".git") == head                       # packed ref
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "--detach"], check=True, capture_output=True)
    assert prov._head_from_files(repo / ".git") == head                       # detached HEAD
    assert prov._head_from_files(tmp_path / "none" / ".git") is None
