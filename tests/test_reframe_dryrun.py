"""`reframe --dry-run` over every site profile: the job scripts it writes, read back.

For each profile under site_profiles/ and each environment of its partitions, ReFrame
generates the job scripts without submitting them; the test asserts what a site's batch
system would get: the scheduler directives (#SBATCH, with the access options and the
account), the task count, the GPUs of GPU partitions, the launcher line, and how the
command runs: natively after `spack env activate` (environment `spack`), inside the
profile's image (`apptainer exec [--nv] ... <image> hpckit train ...`,
`sarus run ... <image> hpckit train ...`, `podman-hpc run ... <image> hpckit train ...`,
`ch-run ... <image> -- hpckit train ...`, `srun --container-image=<image> ... hpckit
train ...`), or straight from the venv (local profiles).
Expectations come from the profile's own configuration; the four target profiles
(a64fx, knl, v100, a100) are also held to what they model, when present.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROFILES = sorted(p.parent.name for p in (REPO / "site_profiles").glob("*/settings.py"))
REFRAME = Path(sys.executable).with_name("reframe")
ACCOUNT = "acct4242"
# what the target profiles model: launcher, GPUs per node (0: a CPU system)
TARGETS = {"a64fx": ("mpiexec", 0), "knl": ("srun", 0), "v100": ("srun", 8), "a100": ("srun", 4)}
DIRECTIVE = {"slurm": "#SBATCH", "squeue": "#SBATCH", "pbs": "#PBS", "torque": "#PBS",
             "lsf": "#BSUB", "sge": "#$", "oar": "#OAR", "pjm": "#PJM", "local": None}


def _site_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RFM_", "HPCKIT_", "SPACK_"))}
    env.update(HOME=str(tmp / "home"), HPCKIT_ACCOUNT=ACCOUNT,
               HPCKIT_DATA=str(tmp / "datasets"), HPCKIT_RFM_PREFIX=str(tmp / "rfm"),
               PYTHONDONTWRITEBYTECODE="1")
    return env


def _load_profile(name: str, env: dict[str, str]) -> dict:
    """The profile's site_configuration as ReFrame would load it with `env`."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return runpy.run_path(str(REPO / "site_profiles" / name / "settings.py"))["site_configuration"]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _cases():
    for name in PROFILES:
        config = _load_profile(name, _site_env(Path("/nonexistent")))
        for system in config["systems"]:
            for part in system["partitions"]:
                if "mlperf" not in part.get("features", []):
                    continue
                for env in part["environs"]:
                    yield pytest.param(name, system["name"], part["name"], env,
                                       id=f"{name}-{part['name']}-{env}")


def _dry_run(tmp: Path, profile: str, system: str, partition: str, environ: str):
    env = _site_env(tmp)
    cmd = [str(REFRAME), "-C", f"site_profiles/{profile}/settings.py", "-c", "reframe_checks/",
           "--system", f"{system}:{partition}", "-p", f"^{environ}$", "--dry-run",
           "--prefix", str(tmp / "rfm"), "--stage", str(tmp / "stage"),
           "--output", str(tmp / "output"), "--perflogdir", str(tmp / "perflogs"),
           "--report-file", str(tmp / "report.json")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert re.search(r"Ran [1-9]\d*/\d+ test case", proc.stdout), proc.stdout[-3000:]
    scripts = {p: p.read_text() for p in (tmp / "stage").rglob("rfm_job.sh")}
    assert scripts, f"no job scripts under {tmp / 'stage'}"
    return scripts


def _command_line(script: str, subcommand: str) -> str:
    lines = [ln for ln in script.splitlines()
             if f"hpckit {subcommand} " in ln and not ln.startswith("echo ")]
    assert len(lines) == 1, f"expected one `hpckit {subcommand}` line:\n{script}"
    return lines[0]


@pytest.mark.parametrize("profile,system,partition,environ", list(_cases()))
def test_dry_run_job_scripts(tmp_path, profile, system, partition, environ):
    env = _site_env(tmp_path)
    config = _load_profile(profile, env)
    sysconf = next(s for s in config["systems"] if s["name"] == system)
    part = next(p for p in sysconf["partitions"] if p["name"] == partition)
    envconf = next(e for e in config["environments"] if e["name"] == environ)
    extras = envconf.get("extras", {})
    gpus = sum(d.get("num_devices", 1) for d in part.get("devices", []) if d["type"] == "gpu")

    scripts = _dry_run(tmp_path, profile, system, partition, environ)
    trainings = [s for s in scripts.values() if "hpckit train " in s]
    datagens = [s for s in scripts.values() if "hpckit datagen " in s]
    assert trainings and datagens, "expected training and dataset job scripts"

    directive = DIRECTIVE.get(part["scheduler"], "#")
    launcher = part["launcher"]
    for script in scripts.values():
        assert script.startswith("#!/bin/bash")
        if directive:
            directives = [ln for ln in script.splitlines() if ln.startswith(directive)]
            for opt in part.get("access", []):
                assert f"{directive} {opt}" in directives, f"no `{directive} {opt}`:\n{script}"
            assert any("--ntasks=" in d or "-n " in d for d in directives), script
        if profile in TARGETS:
            assert any(ACCOUNT in ln for ln in script.splitlines()
                       if directive and ln.startswith(directive)), \
                f"HPCKIT_ACCOUNT={ACCOUNT} not among the {directive} lines:\n{script}"

    for script in trainings + datagens:
        training = "hpckit train " in script
        line = _command_line(script, "train" if training else "datagen")
        words = line.split()
        # the launcher starts the line (the local launcher adds nothing)
        if launcher in ("srun", "mpirun", "mpiexec"):
            assert words[0] == launcher, f"launcher {launcher} expected:\n{line}"
        elif launcher == "local":
            assert words[0] in ("hpckit", "apptainer", "sarus", "podman-hpc", "ch-run"), line
        if profile in TARGETS:
            assert words[0] == TARGETS[profile][0], line

        # GPUs: the training asks for the partition's GPUs; the dataset step does not
        if gpus and training and any(r["name"] in ("gpu", "_rfm_gpu")
                                     for r in part.get("resources", [])):
            assert re.search(rf"^{directive} .*gpu.*\b{gpus}\b", script, re.M), \
                f"no request for {gpus} GPUs per node:\n{script}"
        if not training:
            assert not re.search(r"--gpus|--gres=gpu", script), script
        else:   # the log names the system the check runs on, as the profile's system.yaml does (issue 34)
            import yaml
            named = yaml.safe_load((REPO / "site_profiles" / system / "system.yaml").read_text())["system_name"]
            assert f"--set mlperf.platform={named} " in line + " ", line
        if profile in TARGETS and training and TARGETS[profile][1]:
            assert gpus == TARGETS[profile][1]
            assert f"--gpus-per-node={gpus}" in script or f"--gres=gpu:{gpus}" in script, script

        platform = extras.get("container_platform")
        image = extras.get("container_image")
        if platform == "Apptainer":
            assert re.search(rf"\bapptainer exec .* {re.escape(image)} hpckit ", line), line
            assert ":/rfm_workdir" in line and "--pwd /rfm_workdir" in line, line
            assert ("--nv" in words) == bool(gpus and training), line
            # the dataset the training reads is mounted at the same path
            if training:
                data = words[words.index("--data") + 1]
                assert f'-B"{data}:{data}"' in line, line
        elif platform == "Sarus":
            assert re.search(rf"\bsarus run .* {re.escape(image)} hpckit ", line), line
            assert 'destination="/rfm_workdir"' in line and "-w /rfm_workdir" in line, line
        elif platform == "PodmanHPC":
            assert re.search(rf"\bpodman-hpc run --rm .* {re.escape(image)} hpckit ", line), line
            assert '":"/rfm_workdir"' in line and "-w /rfm_workdir" in line, line
            # its site modules: GPUs on GPU partitions, MPI for a run of several ranks
            assert ("--gpu" in words) == bool(gpus and training), line
            ranks = part.get("extras", {}).get("ranks", 1)
            assert ("--mpi" in words) == (training and ranks > 1), line
            assert "-e HPCKIT_CONTAINER_RUNTIME -e HPCKIT_CONTAINER_IMAGE" in line, line
        elif platform == "Charliecloud":
            assert re.search(rf"\bch-run --set-env .* {re.escape(image)} -- hpckit ", line), line
            assert '":"/rfm_workdir"' in line and "-c /rfm_workdir" in line, line
            # the image is read-only: the bind targets are made in it before
            lines = script.splitlines()
            mkdir = [ln for ln in lines if ln.startswith("mkdir -p ") and f'"{image}/rfm_workdir"' in ln]
            assert mkdir and lines.index(mkdir[0]) < lines.index(line), script
        elif platform == "Pyxis":
            # options of the job's srun (pyxis is a Slurm plugin)
            assert words[0] == "srun" and f"--container-image={image}" in words, line
            assert "--container-workdir=/rfm_workdir" in words, line
            mounts = next(w for w in words if w.startswith("--container-mounts="))
            assert mounts.endswith(':"/rfm_workdir"'), line
            assert words.index(f"--container-image={image}") < words.index("hpckit"), line
        else:
            assert not re.search(r"apptainer|sarus|podman-hpc|ch-run|--container-image", line), line
        if platform:
            # `hpckit check` runs in the same image, not on the host
            check = [ln for ln in script.splitlines() if "hpckit check " in ln]
            for ln in check:
                assert re.search(rf"^(apptainer exec|sarus run|podman-hpc run --rm|ch-run --set-env"
                                 rf"|srun --ntasks=1 --container-mounts=\S+) .*{re.escape(image)}"
                                 rf"( --)? hpckit check ", ln), ln
                assert "--mpi" not in ln.split(), f"one process, no MPI: {ln}"
            # the launch line says inside which runtime and image the run is (provenance)
            assert f"export HPCKIT_CONTAINER_RUNTIME={environ}\n" in script, script
            assert f"export HPCKIT_CONTAINER_IMAGE={image}\n" in script, script

        spack_env = extras.get("spack_env")
        if spack_env:
            lines = script.splitlines()
            activate = [i for i, ln in enumerate(lines)
                        if re.fullmatch(rf"spack env activate -d '?{re.escape(spack_env)}'?", ln)]
            assert activate, f"no `spack env activate -d {spack_env}`:\n{script}"
            setup = [i for i, ln in enumerate(lines) if "share/spack/setup-env.sh" in ln]
            assert setup and setup[0] < activate[0] < lines.index(line), script
        else:
            assert "spack env activate" not in script


def test_target_profiles_have_the_three_environments():
    """The four target profiles run natively (spack) or in their container (apptainer, sarus)."""
    present = [t for t in TARGETS if t in PROFILES]
    if not present:
        pytest.skip("no target profiles (a64fx, knl, v100, a100) in site_profiles/")
    for name in present:
        config = _load_profile(name, _site_env(Path("/nonexistent")))
        envs = {e["name"]: e.get("extras", {}) for e in config["environments"]}
        assert "spack" in envs and envs["spack"].get("spack_env"), name
        assert Path(envs["spack"]["spack_env"], "spack.yaml").is_file(), name
        assert "apptainer" in envs, name
        assert envs["apptainer"] == {"container_platform": "Apptainer",
                                     "container_image": envs["apptainer"]["container_image"]}
        if "sarus" in envs:
            assert envs["sarus"]["container_platform"] == "Sarus", name
