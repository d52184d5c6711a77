"""The kit's Spack repository (spack_repo/mlperf_hpc): recipes checked statically, always;
`spack audit packages` on them when `spack` is on PATH.

Builtin names are checked against a Spack builtin repository checkout when
SPACK_BUILTIN_REPO names one (the directory holding `packages/`, e.g.
spack-packages/repos/spack_repo/builtin), else against the list below of the builtin
packages these recipes use (spack-packages v2025.11).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SPACK_REPO = REPO / "spack_repo" / "mlperf_hpc"
RECIPES = sorted(SPACK_REPO.glob("packages/*/package.py"))
BUILTIN_REPO = os.environ.get("SPACK_BUILTIN_REPO")

# builtin packages the recipes and environments name (present in spack-packages v2025.11)
KNOWN_BUILTIN = {
    "python", "py-setuptools", "py-numpy", "py-pyyaml", "py-crc32c", "py-h5py", "py-lmdb", "py-torch",
    "py-tensorflow", "py-horovod", "py-pandas", "py-scipy", "py-hatchling", "py-archspec",
    "py-argcomplete", "py-clustershell", "py-fasteners", "py-jinja2", "py-jsonschema",
    "py-lxml", "py-requests", "py-semver", "py-tabulate", "py-polars", "py-pygelf",
    "cuda", "cudnn", "nccl", "openmpi", "mpich", "cray-mpich", "glibc", "gperftools",
}
# the kit builds from its own checkout: git versions on a branch are allowed only here
BRANCH_VERSIONS_OK = {"py-mlperf-hpc-kit"}


def package_name(recipe: Path) -> str:
    return recipe.parent.name.replace("_", "-")


def class_name(pkg: str) -> str:
    """Spack's rule: py-foo-bar -> PyFooBar (a leading digit gets a `_` prefix)."""
    name = "".join(part.capitalize() for part in re.split(r"[-_]", pkg))
    return f"_{name}" if name[0].isdigit() else name


def calls(tree: ast.AST, func: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id == func]


def const_args(call: ast.Call) -> tuple[list, dict]:
    args = [a.value for a in call.args if isinstance(a, ast.Constant)]
    kwargs = {k.arg: k.value.value for k in call.keywords if isinstance(k.value, ast.Constant)}
    return args, kwargs


def spec_name(spec: str) -> str:
    return re.match(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*?)(?=[@+~%^ ]|$|\s)", spec).group(1)


def builtin_exists(name: str) -> bool:
    if BUILTIN_REPO:
        return (Path(BUILTIN_REPO) / "packages" / name.replace("-", "_") / "package.py").is_file()
    return name in KNOWN_BUILTIN


def recipe_info(recipe: Path) -> dict:
    tree = ast.parse(recipe.read_text(), filename=str(recipe))
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    return {
        "tree": tree,
        "classes": classes,
        "versions": [const_args(c) for c in calls(tree, "version")],
        "variants": {const_args(c)[0][0] for c in calls(tree, "variant")},
        "depends": [const_args(c) for c in calls(tree, "depends_on")],
    }


def local_packages() -> dict[str, dict]:
    return {package_name(r): recipe_info(r) for r in RECIPES}


def test_repo_yaml():
    conf = yaml.safe_load((SPACK_REPO / "repo.yaml").read_text())
    assert conf == {"repo": {"namespace": "mlperf_hpc", "api": "v2.2"}}


def test_expected_recipes_present():
    assert {"py-mlperf-hpc-kit", "py-mlperf-logging", "reframe"} <= set(local_packages())


@pytest.mark.parametrize("recipe", RECIPES, ids=package_name)
def test_recipe_structure(recipe):
    info = recipe_info(recipe)
    pkg = package_name(recipe)
    assert recipe.parent.name == pkg.replace("-", "_") and "-" not in recipe.parent.name
    assert [c.name for c in info["classes"]] == [class_name(pkg)]
    imports = {(n.module, a.name) for n in ast.walk(info["tree"])
               if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("spack.package", "*") in imports
    bases = {b.id for b in info["classes"][0].bases if isinstance(b, ast.Name)}
    assert bases, "the package class has a build-system base class"
    for base in bases:
        assert any(name == base and mod.startswith("spack_repo.builtin.build_systems.")
                   for mod, name in imports), f"{base} not imported from builtin build_systems"
    assert ast.get_docstring(info["classes"][0]), "a description (class docstring)"


@pytest.mark.parametrize("recipe", RECIPES, ids=package_name)
def test_versions_are_checksummed(recipe):
    pkg = package_name(recipe)
    versions = recipe_info(recipe)["versions"]
    assert versions, f"{pkg} declares no version"
    for args, kwargs in versions:
        assert args and isinstance(args[0], str), f"{pkg}: version without a name"
        if "sha256" in kwargs:
            assert re.fullmatch(r"[0-9a-f]{64}", kwargs["sha256"]), f"{pkg}@{args[0]}"
        elif "commit" in kwargs:
            assert re.fullmatch(r"[0-9a-f]{40}", kwargs["commit"]), f"{pkg}@{args[0]}"
        else:
            assert pkg in BRANCH_VERSIONS_OK and "branch" in kwargs, \
                f"{pkg}@{args[0]} has neither sha256 nor commit"


@pytest.mark.parametrize("recipe", RECIPES, ids=package_name)
def test_dependencies_exist_and_have_types(recipe):
    local = local_packages()
    for args, kwargs in recipe_info(recipe)["depends"]:
        spec = args[0]
        name = spec_name(spec)
        assert name in local or builtin_exists(name), \
            f"{package_name(recipe)}: depends_on({spec!r}): no such package here or in builtin"
        if name not in {"c", "cxx", "fortran"}:
            assert "type" in {k.arg for c in calls(recipe_info(recipe)["tree"], "depends_on")
                              for k in c.keywords if const_args(c)[0][:1] == [spec]}, \
                f"{package_name(recipe)}: depends_on({spec!r}) without type="
        for variant in re.findall(r"[+~]([A-Za-z_][A-Za-z0-9_]*)", spec):
            if name in local:
                assert variant in local[name]["variants"], f"{name} has no variant {variant}"


def test_kit_recipe_matches_pyproject():
    """The kit's recipe: version and dependencies of pyproject.toml, the three variants."""
    import tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    kit = local_packages()["py-mlperf-hpc-kit"]
    assert project["name"] == "mlperf-hpc-kit"
    assert project["version"] in {args[0] for args, _ in kit["versions"]}
    assert {"torch", "tensorflow", "horovod"} <= kit["variants"]
    deps = {spec_name(args[0]) for args, _ in kit["depends"]}
    pypi_to_spack = {"numpy": "py-numpy", "pyyaml": "py-pyyaml",
                     "mlperf-logging": "py-mlperf-logging", "crc32c": "py-crc32c", "h5py": "py-h5py",
                     "lmdb": "py-lmdb"}
    for req in project["dependencies"]:
        assert pypi_to_spack[re.match(r"[A-Za-z0-9_.-]+", req).group(0)] in deps
    assert {"py-torch", "py-tensorflow", "py-horovod", "py-setuptools"} <= deps


def test_kit_recipe_points_at_this_checkout():
    text = (SPACK_REPO / "packages" / "py_mlperf_hpc_kit" / "package.py").read_text()
    assert "_KIT_ROOT" in text and 'git = f"file://{_KIT_ROOT}"' in text
    recipe_dir = SPACK_REPO / "packages" / "py_mlperf_hpc_kit"
    assert (recipe_dir / os.pardir / os.pardir / os.pardir / os.pardir).resolve() == REPO


@pytest.mark.skipif(shutil.which("spack") is None,
                    reason="spack is not on PATH (see docs/containers-spack.md: Spack)")
def test_spack_audit_packages(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "repos.yaml").write_text(yaml.safe_dump({"repos": {"mlperf_hpc": str(SPACK_REPO)}}))
    proc = subprocess.run(["spack", "-C", str(conf), "audit", "packages",
                           *local_packages()], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
