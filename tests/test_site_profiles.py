"""The four target site profiles (site_profiles/{a64fx,knl,v100,a100}): ReFrame settings,
Spack environments, references and MLPerf system descriptions, checked statically
always; each environment concretized by real Spack when `spack` is on PATH (slow).
"""

from __future__ import annotations

import ast
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpckit.common.benchmark import PACKAGES
from test_spack_repo import builtin_exists, local_packages, spec_name, BUILTIN_REPO

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "site_profiles"
TARGETS = ["a64fx", "knl", "v100", "a100"]
ARCH = {"a64fx": "a64fx", "knl": "mic_knl", "v100": "skylake_avx512", "a100": "zen3"}
GPUS = {"v100": (8, 70), "a100": (4, 80)}          # GPUs per node, CUDA arch
REQUIRED_SPECS = {"python", "py-torch", "py-tensorflow", "py-h5py", "py-mlperf-logging",
                  "reframe", "py-mlperf-hpc-kit"}
MPIS = {"openmpi", "mpich", "cray-mpich"}
FILLED_BY_PACKAGER = {"submitter", "division", "status"}
READ_BY_CHECKS = ("spack", "apptainer")            # environment names of the contract


def spack_env(target) -> dict:
    return yaml.safe_load((PROFILES / target / "spack.yaml").read_text())["spack"]


def settings(target, **env) -> dict:
    """The profile's site_configuration, loaded with `env` as the process environment."""
    saved = os.environ
    os.environ = {k: v for k, v in saved.items()
                  if not k.startswith(("HPCKIT_", "RFM_REFERENCE_PREFIX"))} | env
    try:
        conf = runpy.run_path(str(PROFILES / target / "settings.py"))
        conf["_reference_prefix"] = os.environ.get("RFM_REFERENCE_PREFIX")
        return conf
    finally:
        os.environ = saved


def required_system_fields() -> list[str]:
    """required_fields of the installed official system description checker."""
    import mlperf_logging.system_desc_checker.system_desc_checker as checker
    tree = ast.parse(Path(checker.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "required_fields":
            return ast.literal_eval(node.value)
    raise AssertionError("no required_fields in the system description checker")


# ----------------------------------------------------------------------------- spack.yaml

@pytest.mark.parametrize("target", TARGETS)
def test_spack_env_root_specs(target):
    specs = spack_env(target)["specs"]
    names = {spec_name(s) for s in specs}
    assert REQUIRED_SPECS <= names, f"missing {REQUIRED_SPECS - names}"
    assert names & MPIS, "no MPI among the root specs"
    for s in specs:
        assert re.search(r"@(=)?\d+(\.\d+)*(-\d+)?(\.\d+)*(?=[\s+~]|$)", s) and \
            not re.search(r"@[^\s]*:", s), f"{target}: {s!r} is not pinned to one version"
        assert f"target={ARCH[target]}" in s.split(), f"{target}: {s!r} lacks target"
    if target in GPUS:
        arch = GPUS[target][1]
        for pkg in ("cuda", "cudnn", "nccl"):
            assert pkg in names
        for s in specs:
            if spec_name(s) in ("py-torch", "py-tensorflow", "nccl"):
                assert "+cuda" in s and f"cuda_arch={arch}" in s, s
    else:
        assert not names & {"cuda", "cudnn", "nccl"}
        for s in specs:
            if spec_name(s) in ("py-torch", "py-tensorflow"):
                assert "~cuda" in s, s


@pytest.mark.parametrize("target", TARGETS)
def test_spack_env_config(target):
    env = spack_env(target)
    assert env["concretizer"]["targets"]["host_compatible"] is False
    assert not (PROFILES / target / "compilers.yaml").exists()
    assert "compilers" not in env
    repo_path = env["repos"]["mlperf_hpc"]
    assert repo_path.startswith("$env/")
    assert (PROFILES / target / repo_path.removeprefix("$env/")).resolve() == \
        REPO / "spack_repo" / "mlperf_hpc"
    dev = env["develop"]["py-mlperf-hpc-kit"]
    assert dev["spec"] == "py-mlperf-hpc-kit@=0.1.0"
    assert ((PROFILES / target / dev["path"]).resolve() / "pyproject.toml").is_file()
    mpi = env["packages"]["mpi"]["require"]
    assert len(mpi) == 1 and mpi[0] in MPIS
    if target == "a64fx":
        externals = [e["spec"] for e in env["packages"]["glibc"]["externals"]]
        assert any(re.fullmatch(r"glibc@[\d.]+ target=aarch64", e) for e in externals)


@pytest.mark.parametrize("target", TARGETS)
def test_spack_env_names_and_variants_exist(target):
    """Every package named exists here or in builtin; this repo's variants exist."""
    local = local_packages()
    env = spack_env(target)
    specs = list(env["specs"]) + [e["spec"] for p in env.get("packages", {}).values()
                                  for e in p.get("externals", [])]
    for s in specs:
        name = spec_name(s)
        assert name in local or builtin_exists(name), f"{target}: unknown package {name}"
        variants = set(re.findall(r"[+~]([A-Za-z_]\w*)", s)) | \
            set(re.findall(r"\b([A-Za-z_]\w*)=", s)) - {"target"}
        if name in local:
            assert variants <= local[name]["variants"], f"{s}: {variants - local[name]['variants']}"
        elif BUILTIN_REPO:
            text = (Path(BUILTIN_REPO) / "packages" / name.replace("-", "_") /
                    "package.py").read_text()
            known = set(re.findall(r'variant\(\s*"(\w+)"', text))
            if "CudaPackage" in text:                 # mixins declaring variants
                known |= {"cuda", "cuda_arch"}
            if "ROCmPackage" in text:
                known |= {"rocm", "amdgpu_target"}
            assert variants <= known, f"builtin {name} has no variant {variants - known}"



# ----------------------------------------------------------------------------- settings.py

@pytest.mark.parametrize("target", TARGETS)
def test_settings_load_with_reframe(target, tmp_path):
    """`reframe --show-config` accepts the file (ReFrame's own schema validation)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RFM_", "HPCKIT_"))}
    env.update(HOME=str(home), RFM_PREFIX=str(tmp_path / "rfm"),
               RFM_STAGE_DIR=str(tmp_path / "stage"), RFM_OUTPUT_DIR=str(tmp_path / "out"),
               RFM_PERFLOG_DIR=str(tmp_path / "perflogs"))
    reframe = Path(sys.executable).with_name("reframe")
    proc = subprocess.run([str(reframe), "--show-config", "-C",
                           str(PROFILES / target / "settings.py"), "--system", target],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f'"name": "{target}"' in proc.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_settings_environments_contract(target):
    conf = settings(target)
    envs = {e["name"]: e for e in conf["site_configuration"]["environments"]}
    assert set(READ_BY_CHECKS) <= set(envs)
    for e in envs.values():
        assert "hpckit" in e["features"]
    assert envs["spack"]["extras"] == {"spack_env": str(PROFILES / target)}
    assert envs["apptainer"]["extras"]["container_platform"] == "Apptainer"
    assert envs["apptainer"]["extras"]["container_image"].endswith(".sif")
    if "sarus" in envs:
        assert envs["sarus"]["extras"]["container_platform"] == "Sarus"
        assert envs["sarus"]["extras"]["container_image"]
    assert conf["_reference_prefix"] == str(PROFILES / target)


@pytest.mark.parametrize("target", TARGETS)
def test_settings_partitions(target):
    conf = settings(target)
    (system,) = conf["site_configuration"]["systems"]
    assert system["name"] == target
    mlperf = [p for p in system["partitions"] if "mlperf" in p["features"]]
    assert mlperf, "no partition with the mlperf feature"
    envs = {e["name"] for e in conf["site_configuration"]["environments"]}
    for p in mlperf:
        assert p["scheduler"] == "slurm" and p["launcher"] in {"srun", "mpiexec"}
        assert p["max_jobs"] >= 1 and p["time_limit"]
        assert set(p["environs"]) <= envs and set(READ_BY_CHECKS) <= set(p["environs"])
        platforms = {c["type"] for c in p["container_platforms"]}
        assert "Apptainer" in platforms
        if "sarus" in p["environs"]:
            assert "Sarus" in platforms
        assert set(p["extras"]["data"]) == set(PACKAGES)   # a dataset path per benchmark package
        assert all(os.path.isabs(v) for v in p["extras"]["data"].values())
        assert p["extras"]["stage_dir"]
        assert p["processor"]["arch"] == ARCH[target]
        if target in GPUS:
            assert p["devices"] == [{**p["devices"][0], "type": "gpu",
                                     "num_devices": GPUS[target][0]}]
        else:
            assert not p.get("devices")


@pytest.mark.parametrize("target", TARGETS)
def test_settings_site_variables(target, tmp_path, monkeypatch):
    """Account, data, staging and image come from the HPCKIT_* variables."""
    conf = settings(target, HPCKIT_ACCOUNT="proj42", HPCKIT_DATA=str(tmp_path),
                    HPCKIT_STAGE_DIR="/local/x", HPCKIT_IMAGE="/img/k.sif", HPCKIT_NODES="16")
    (part,) = [p for p in conf["site_configuration"]["systems"][0]["partitions"]
               if "mlperf" in p["features"]]
    assert "--account=proj42" in part["access"]
    per_node = {"a64fx": 4, "knl": 1, "v100": 8, "a100": 4}[target]
    assert part["extras"] == {"data": {b: str(tmp_path / b) for b in PACKAGES},
                              "stage_dir": "/local/x",
                              "ranks": 16 * per_node, "ranks_per_node": per_node}
    envs = {e["name"]: e for e in conf["site_configuration"]["environments"]}
    assert envs["apptainer"]["extras"]["container_image"] == "/img/k.sif"
    plain = settings(target)
    (part,) = [p for p in plain["site_configuration"]["systems"][0]["partitions"]
               if "mlperf" in p["features"]]
    assert not any(a.startswith("--account") for a in part["access"])
    # relative folders are the user's, from where ReFrame starts (a check runs in its own
    # stage directory); one starting with a variable is expanded in the job
    with monkeypatch.context() as m:
        m.chdir(tmp_path)
        conf = settings(target, HPCKIT_DATA="data", HPCKIT_STAGE_DIR="stage")
    (part,) = [p for p in conf["site_configuration"]["systems"][0]["partitions"] if "mlperf" in p["features"]]
    assert part["extras"]["data"]["cosmoflow"] == str(tmp_path / "data" / "cosmoflow")
    assert part["extras"]["stage_dir"] == str(tmp_path / "stage")
    conf = settings(target, HPCKIT_STAGE_DIR="$LOCALTMP/stage")
    (part,) = [p for p in conf["site_configuration"]["systems"][0]["partitions"] if "mlperf" in p["features"]]
    assert part["extras"]["stage_dir"] == "$LOCALTMP/stage"


@pytest.mark.parametrize("profile", ["local", "local-containers", "slurm-local", "slurm-multinode"])
def test_threads_per_rank_from_the_environment(profile, tmp_path):
    """HPCKIT_OMP_NUM_THREADS is every training's --threads (a partition extra the checks
    pass on) and OMP_NUM_THREADS, in every profile that runs on the machine it starts on;
    unset, the kit's core plan decides; a value that is not a thread count is refused."""
    def threads(conf):
        site = conf["site_configuration"]
        omp = {e["name"]: dict(e["env_vars"]).get("OMP_NUM_THREADS") for e in site["environments"]}
        return [p.get("extras", {}).get("threads") for p in site["systems"][0]["partitions"]], set(omp.values())
    extras, omp = threads(settings(profile, HPCKIT_OMP_NUM_THREADS="1"))
    assert extras and set(extras) == {1} and omp == {"1"}
    extras, _ = threads(settings(profile))
    assert set(extras) == {None}
    for bad in ("two", "0", "-1", "1.5", "\u00b2", str(2**31)):
        with pytest.raises(SystemExit) as exit_:
            settings(profile, HPCKIT_OMP_NUM_THREADS=bad)
        assert exit_.value.code == 2
    # through ReFrame: one line naming the variable, exit 2
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "reframe"), "-C", str(PROFILES / profile / "settings.py"),
                           "-c", str(REPO / "reframe_checks"), "-l"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HPCKIT_OMP_NUM_THREADS": "two", "HOME": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 \
        and "HPCKIT_OMP_NUM_THREADS='two'" in proc.stderr, proc.stderr


# the count variables each profile reads (nodes, ranks per node, threads per rank)
COUNT_VARIABLES = {**{t: ["HPCKIT_NODES"] for t in TARGETS},
                   **{p: ["HPCKIT_OMP_NUM_THREADS"] for p in ["local", "local-containers", "slurm-local"]},
                   "slurm-multinode": ["HPCKIT_NODES", "HPCKIT_RANKS_PER_NODE", "HPCKIT_OMP_NUM_THREADS"]}


@pytest.mark.parametrize("profile", sorted(COUNT_VARIABLES))
def test_count_variables_refuse_what_is_not_a_count(profile, capsys):
    """A node, rank or thread count that is not a whole number from 1 is one line naming
    the profile and the variable, exit 2 (an int() in a settings file was a traceback
    through ReFrame); each is read, and a good value is taken."""
    for variable in COUNT_VARIABLES[profile]:
        for bad in ("two", "0", "-1", "1.5", " 2", "\u00b2", str(2**31)):
            capsys.readouterr()
            with pytest.raises(SystemExit) as exit_:
                settings(profile, **{variable: bad})
            err = capsys.readouterr().err
            assert exit_.value.code == 2 and err.count("\n") == 1 \
                and err.startswith(f"site profile {profile}: {variable}={bad!r}: not a number of "), err
        assert settings(profile, **{variable: "2"})["site_configuration"] != settings(profile)["site_configuration"]


# ----------------------------------------------------------------- references, system.yaml

@pytest.mark.parametrize("target", TARGETS)
def test_references(target):
    refs = yaml.safe_load((PROFILES / target / "references.yaml").read_text())
    partitions = {f"{target}:{p['name']}" for p in
                  settings(target)["site_configuration"]["systems"][0]["partitions"]}
    assert set(refs) <= {"CosmoFlowCheck", "DeepCAMCheck", "OC20Check", "OpenFoldCheck"}
    for check, entry in refs.items():
        assert entry["$index"] == ["$partition", "config", "framework"]
        for part, configs in entry.items():
            if part == "$index":
                continue
            assert part in partitions
            for config, frameworks in configs.items():
                assert config in {"mini", "reference"}
                for framework, variables in frameworks.items():
                    assert framework in {"tensorflow", "pytorch"}
                    for var, ref in variables.items():
                        assert var in {"time_to_train", "staging_time", "train_throughput",
                                       "eval_throughput", "epochs", "peak_memory", "epoch_read",
                                       "input_wait", "gpu_busy"}
                        assert len(ref) == 4 and isinstance(ref[0], (int, float)), ref


@pytest.mark.parametrize("target", TARGETS)
def test_system_description(target):
    desc = yaml.safe_load((PROFILES / target / "system.yaml").read_text())
    assert set(desc) == set(required_system_fields()) - FILLED_BY_PACKAGER
    assert desc["system_name"]
    for key, value in desc.items():
        if key == "other_software_stack":
            assert isinstance(value, dict) and value
        else:
            assert isinstance(value, str), f"{key}: {value!r} is not a string"
    accelerators = int(desc["accelerators_per_node"])
    assert accelerators == (GPUS[target][0] if target in GPUS else 0)


@pytest.mark.parametrize("target", TARGETS)
def test_readme(target):
    text = (PROFILES / target / "README.md").read_text()
    assert f"spack env activate site_profiles/{target}" in text
    assert f"reframe -C site_profiles/{target}/settings.py -c reframe_checks/ -r" in text
    assert "-p apptainer" in text


# ----------------------------------------------------------------------------- real Spack

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("spack") is None,
                    reason="spack is not on PATH (see docs/containers-spack.md: Spack)")
@pytest.mark.parametrize("target", TARGETS)
def test_spack_concretize(target, tmp_path):
    """`spack concretize` of the environment, in a copy so the checkout stays clean.

    The copy keeps the environment's relative paths ($env/../../spack_repo, develop
    ../..): the repository's top-level entries are linked, the profile is copied.
    """
    root = tmp_path / "kit"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in {"site_profiles", ".git", ".venv"}:
            (root / entry.name).symlink_to(entry)
    env_dir = root / "site_profiles" / target
    env_dir.mkdir(parents=True)
    shutil.copy(PROFILES / target / "spack.yaml", env_dir / "spack.yaml")
    timeout = int(os.environ.get("HPCKIT_SPACK_TIMEOUT", "1200"))
    proc = subprocess.run(["spack", "-e", str(env_dir), "concretize", "-f"],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lock = yaml.safe_load((env_dir / "spack.lock").read_text())
    roots = {r["spec"].split("@")[0] for r in lock["roots"]}
    assert REQUIRED_SPECS <= roots
