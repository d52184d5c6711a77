"""Provenance of a result: the software stack and the machine a run was made with, recorded
by the run itself when it happens (never reconstructed afterwards).

`collect(framework)` is called once by `hpckit train` (rank 0, common/run.py): its value,
less the package list, is the `hpckit_provenance` line of the MLPerf log; all of it is the
`provenance` block of summary.json:

    kit        version, git commit, dirty (and a digest of the uncommitted diff), or the
               commit pip recorded (direct_url.json); commit None outside a git checkout
    python     version, implementation, executable
    frameworks versions of torch / tensorflow / keras / numpy / mlperf-logging / h5py /
               horovod as imported (else as installed), and CUDA/cuDNN builds where present
    packages   every installed distribution as `name==version` (importlib.metadata, the
               first one on sys.path per name: the one `import` gets, as pip freeze
               would list it), sorted, and the sha256 of that list
    spack      with SPACK_ENV set: the environment, the sha256 of its spack.lock, the
               lock's root specs with their hashes and the Spack version that wrote it
    container  the runtime and image as each runtime exposes them inside the container
               (podman/podman-hpc /run/.containerenv, docker /.dockerenv, apptainer and
               singularity APPTAINER_CONTAINER / SINGULARITY_CONTAINER and the image's
               labels, charliecloud CH_RUNNING and /ch/metadata.json, enroot/pyxis their
               ENROOT_* / PYXIS_* variables; a launch line may name the image itself in
               HPCKIT_CONTAINER_RUNTIME / HPCKIT_CONTAINER_IMAGE); None natively
    host       host name, OS (os-release), kernel, architecture
    cpu        model, CPUs of the allocation, flags
    gpu        NVIDIA GPUs and driver (/proc/driver/nvidia, torch.cuda, TensorFlow, or
               nvidia-smi with a timeout), None without one
    collect_s  what collecting took

`stack(prov)` is the part that identifies the software (kit, Python, packages, Spack lock,
image, GPU driver): it travels in the ReFrame perflog, into the references' header
(`hpckit references calibrate`) and is compared by `differences` when a check FAILs.
Every subprocess here has a timeout; nothing here raises on a machine that lacks a piece.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

SCHEMA = 1
LOG_KEY = "hpckit_provenance"
SUBPROCESS_TIMEOUT_S = 10
# the framework-level distributions named in the log line and the system description
FRAMEWORK_DISTS = ("torch", "tensorflow", "tensorflow-cpu", "keras", "numpy", "mlperf-logging", "h5py",
                   "horovod")
# what `differences` compares, in the order it names them
STACK_KEYS = ("kit", "commit", "dirty", "dirty_sha256", "python", "spack_lock", "image", "gpu_driver",
              "packages_sha256", "packages")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(args: list[str], cwd: str | None = None) -> str | None:
    """A command's stdout, or None when it is missing, fails or outlives the timeout."""
    try:
        proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _read(path: Path, limit: int = 1 << 16) -> str | None:
    """A regular file's first `limit` bytes as text, None for anything else: a FIFO or a
    device where a file is expected (a repository's HEAD made a FIFO) would block forever."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(1 << 20, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


# ---- the parts -------------------------------------------------------------------------

def installed_packages() -> list[str]:
    """`name==version` of every distribution importlib.metadata finds, the first on
    sys.path per canonical name (what `import` gets when PYTHONPATH shadows one), sorted."""
    from importlib import metadata
    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            name = None
        if not name:
            continue
        seen.setdefault(_canonical(name), dist.version)
    return sorted(f"{n}=={v}" for n, v in seen.items())


def packages_digest(packages: list[str]) -> str:
    return hashlib.sha256("\n".join(packages).encode()).hexdigest()


def _head_from_files(dotgit: Path) -> str | None:
    """The commit HEAD names, read from the repository's files (a worktree's `.git` file
    points at its git dir; refs may be loose or packed); None for anything odd (a dangling
    or looping link, a name with a NUL byte, a HEAD that is not a regular file)."""
    try:
        return _head_files(dotgit)
    except (OSError, ValueError, RuntimeError):
        return None


def _git_dir(dotgit: Path) -> Path | None:
    """The git directory `.git` stands for (itself, or where a worktree's `.git` file
    points), None when it is neither."""
    try:
        if dotgit.is_dir():
            return dotgit
        text = _read(dotgit) or ""
        if not text.startswith("gitdir:"):
            return None
        return (dotgit.parent / text.split(":", 1)[1].strip()).resolve()
    except (OSError, ValueError, RuntimeError):
        return None


def _head_files(dotgit: Path) -> str | None:
    gitdir = _git_dir(dotgit)
    if gitdir is None:
        return None
    common = gitdir
    if (gitdir / "commondir").is_file():
        common = (gitdir / (_read(gitdir / "commondir") or ".").strip()).resolve()
    head = (_read(gitdir / "HEAD") or "").strip()
    if re.fullmatch(r"[0-9a-f]{40}", head):
        return head
    if not head.startswith("ref: "):
        return None
    ref = head[5:].strip()
    if not ref.startswith("refs/") or ".." in ref.split("/"):
        return None     # a ref outside refs/ is not git's
    loose = (_read(common / ref) or _read(gitdir / ref) or "").strip()
    if re.fullmatch(r"[0-9a-f]{40}", loose):
        return loose
    for line in (_read(common / "packed-refs", 1 << 24) or "").splitlines():
        sha, _, name = line.partition(" ")
        if name.strip() == ref and re.fullmatch(r"[0-9a-f]{40}", sha):
            return sha
    return None


def head_commit(root: Path) -> tuple[str | None, str | None]:
    """(the commit the checkout at `root` is at, why it is unknown): `git rev-parse HEAD`,
    else the repository's files read directly (no git, or a checkout git refuses); git is
    not asked about a repository whose HEAD is missing or not a regular file."""
    gitdir = _git_dir(root / ".git")
    if gitdir is None or _read(gitdir / "HEAD") is None:
        return None, "the repository's HEAD is missing or not a regular file; commit unknown"
    odd = [n for n in ("commondir", "packed-refs") if os.path.lexists(gitdir / n) and _read(gitdir / n, 1) is None]
    # git would wait on a FIFO there (until the timeout): the files are read directly instead
    head = None if odd else _run(["git", "-C", str(root), "rev-parse", "HEAD"])
    if head and re.fullmatch(r"[0-9a-f]{40}", head.strip()):
        return head.strip(), None
    commit = _head_from_files(root / ".git")
    return commit, "git rev-parse HEAD failed (no git, or a repository git refuses); " + (
        "commit read from .git, dirty state unknown" if commit else "commit unknown")


def kit() -> dict:
    """The kit's version and the commit of the tree it was imported from."""
    import hpckit
    from importlib import metadata
    out: dict = {"version": getattr(hpckit, "__version__", None), "commit": None, "dirty": None,
                 "source": None}
    try:
        out["distribution"] = metadata.version("mlperf-hpc-kit")
    except metadata.PackageNotFoundError:
        out["distribution"] = None
    root = Path(hpckit.__file__).resolve().parents[2]      # <root>/apps/hpckit/__init__.py
    if os.path.lexists(root / ".git"):
        out["source"] = "git"
        out["commit"], why = head_commit(root)
        if why is None:
            status = _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
            if status is not None:
                out["dirty"] = bool(status.strip())
                if out["dirty"]:
                    diff = _run(["git", "-C", str(root), "diff", "HEAD", "--no-ext-diff", "--binary"])
                    if diff is not None:
                        out["dirty_sha256"] = hashlib.sha256(diff.encode()).hexdigest()
        else:
            out["git_error"] = why
        return out
    try:   # installed from a VCS URL: pip records the commit (PEP 610)
        direct = json.loads(metadata.distribution("mlperf-hpc-kit").read_text("direct_url.json") or "{}")
        vcs = direct.get("vcs_info") or {}
        if vcs.get("commit_id"):
            out.update(commit=vcs["commit_id"], source=f"pip {vcs.get('vcs', 'vcs')} {direct.get('url', '')}")
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        pass
    return out


def frameworks() -> dict:
    """Versions of the framework-level distributions (the imported module's own version
    where it is imported, as a shadowed install could differ), and CUDA/cuDNN builds."""
    from importlib import metadata
    out: dict = {}
    modules = {"torch": "torch", "tensorflow": "tensorflow", "tensorflow-cpu": "tensorflow", "keras": "keras",
               "numpy": "numpy", "h5py": "h5py", "horovod": "horovod"}
    for dist in FRAMEWORK_DISTS:
        mod = sys.modules.get(modules.get(dist, ""))
        version = getattr(mod, "__version__", None) if mod is not None else None
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is not None or (version is not None and dist in ("torch", "tensorflow")):
            out[dist] = version or installed
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_cuda"] = getattr(torch.version, "cuda", None)
        try:
            out["torch_cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        except Exception:
            out["torch_cudnn"] = None
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            info = tf.sysconfig.get_build_info()
            out["tensorflow_cuda"] = info.get("cuda_version")
            out["tensorflow_cudnn"] = info.get("cudnn_version")
        except Exception:
            pass
    return out


def spack_env(environ=os.environ) -> dict | None:
    """The active Spack environment (SPACK_ENV): its spack.lock's digest, root specs and
    the Spack that wrote it; without a lock, the spack.yaml's digest."""
    env = environ.get("SPACK_ENV")
    if not env:
        return None
    root = Path(env)
    out: dict = {"env": env, "lock_sha256": None, "yaml_sha256": None, "roots": [], "spack": None}
    lock = root / "spack.lock"
    try:
        data = lock.read_bytes()
        out["lock_sha256"] = hashlib.sha256(data).hexdigest()
        parsed = json.loads(data)
        out["roots"] = sorted(f"{r.get('spec')} /{r.get('hash')}" for r in parsed.get("roots", []))
        spack = parsed.get("spack") or {}
        out["spack"] = " ".join(str(spack[k]) for k in ("version", "commit") if spack.get(k)) or None
    except (OSError, ValueError, AttributeError):
        pass
    try:
        out["yaml_sha256"] = hashlib.sha256((root / "spack.yaml").read_bytes()).hexdigest()
    except OSError:
        pass
    return out


def _containerenv(text: str) -> dict:
    """podman's /run/.containerenv: key="value" lines (written only for --privileged)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip().strip('"')
    return out


def container(environ=os.environ, root: Path = Path("/")) -> dict | None:
    """The container this process runs in, as its runtime exposes it; None natively."""
    declared = {k: environ[v] for k, v in (("runtime", "HPCKIT_CONTAINER_RUNTIME"),
                                           ("image", "HPCKIT_CONTAINER_IMAGE")) if environ.get(v)}
    found: dict | None = None
    for var, runtime in (("APPTAINER_CONTAINER", "apptainer"), ("SINGULARITY_CONTAINER", "singularity")):
        if environ.get(var):
            found = {"runtime": runtime, "image": environ[var],
                     "name": environ.get("APPTAINER_NAME") or environ.get("SINGULARITY_NAME")}
            labels = _read(root / ".singularity.d" / "labels.json")
            if labels:
                try:
                    found["labels"] = json.loads(labels)
                except ValueError:
                    pass
                found["labels_sha256"] = hashlib.sha256(labels.encode()).hexdigest()
            break
    if found is None and environ.get("CH_RUNNING"):
        found = {"runtime": "charliecloud"}
        meta = _read(root / "ch" / "metadata.json")
        if meta:
            found["metadata_sha256"] = hashlib.sha256(meta.encode()).hexdigest()
            try:
                parsed = json.loads(meta)
                found.update({k: parsed[k] for k in ("arch", "labels") if parsed.get(k)})
            except ValueError:
                pass
    if found is None and (root / "run" / ".containerenv").exists():
        fields = _containerenv(_read(root / "run" / ".containerenv") or "")
        found = {"runtime": "podman", "engine": fields.get("engine"), "image": fields.get("image"),
                 "digest": fields.get("imageid"), "name": fields.get("name"), "id": fields.get("id"),
                 "rootless": fields.get("rootless")}
    if found is None and (root / ".dockerenv").exists():
        found = {"runtime": "docker", "id": environ.get("HOSTNAME")}
    if found is None:
        enroot = {k: v for k, v in environ.items() if k.startswith(("ENROOT_", "PYXIS_"))}
        if enroot:
            found = {"runtime": "enroot", "environment": dict(sorted(enroot.items()))}
    if found is None and environ.get("container"):   # the systemd convention (podman, lxc, ...)
        found = {"runtime": environ["container"]}
    if found is None and not declared:
        return None
    found = {k: v for k, v in (found or {}).items() if v is not None}
    if declared:
        found["declared"] = declared
        found.setdefault("runtime", declared.get("runtime"))
        found.setdefault("image", declared.get("image"))
    return found


def host() -> dict:
    os_release = {}
    for line in (_read(Path("/etc/os-release")) or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            os_release[key] = value.strip().strip('"')
    return {"name": platform.node(), "os": os_release.get("PRETTY_NAME") or platform.system(),
            "kernel": platform.release(), "machine": platform.machine()}


def cpu() -> dict:
    from hpckit.common import cores
    return {"model": cores.cpu_model(), "cpus": len(cores.allocation_cpus()), "machine_key": cores.machine_key(),
            "flags": sorted(cores.cpu_flags())}


def gpu(root: Path = Path("/")) -> dict | None:
    """NVIDIA GPUs and the driver: the kernel module's /proc files (no subprocess), else
    an imported framework's view, else nvidia-smi (with a timeout); None without a GPU."""
    out: dict = {}
    version = _read(root / "proc" / "driver" / "nvidia" / "version")
    if version:
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", version)
        out["driver"] = m.group(1) if m else version.splitlines()[0].strip()
        models = []
        for info in sorted((root / "proc" / "driver" / "nvidia" / "gpus").glob("*/information")):
            m = re.search(r"^Model:\s*(.+)$", _read(info) or "", re.M)
            if m:
                models.append(m.group(1).strip())
        out["models"] = models
        out["source"] = "/proc/driver/nvidia"
    torch = sys.modules.get("torch")
    if torch is not None and not out.get("models"):
        try:
            if torch.cuda.is_available():
                out["models"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                out["source"] = "torch.cuda"
        except Exception:
            pass
    if not out.get("models") and (root / "dev" / "nvidiactl").exists():
        smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
        if smi:
            rows = [[c.strip() for c in line.split(",")] for line in smi.strip().splitlines()]
            out["models"] = [r[0] for r in rows]
            out["driver"] = out.get("driver") or (rows[0][1] if rows and len(rows[0]) > 1 else None)
            out["source"] = "nvidia-smi"
    if not out.get("models") and not out.get("driver"):
        return None
    out["count"] = len(out.get("models", []))
    return out


# ---- the record --------------------------------------------------------------------------

def collect(framework: str | None = None) -> dict:
    """The provenance block of this process (rank 0 calls it once per run)."""
    start = time.perf_counter()
    packages = installed_packages()
    prov = {
        "schema": SCHEMA,
        "kit": kit(),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "framework": framework,
        "frameworks": frameworks(),
        "packages": {"count": len(packages), "sha256": packages_digest(packages), "list": packages},
        "spack": spack_env(),
        "container": container(),
        "host": host(),
        "cpu": cpu(),
        "gpu": gpu(),
    }
    prov["collect_s"] = round(time.perf_counter() - start, 4)
    return prov


def log_value(prov: dict) -> dict:
    """The `hpckit_provenance` log line's value: the block less the package list (its
    count and digest stay; the list is in summary.json)."""
    out = dict(prov)
    out["packages"] = {k: v for k, v in prov["packages"].items() if k != "list"}
    return out


def stack(prov: dict | None) -> dict | None:
    """What identifies the software a run used: compared between calibration and rerun."""
    if not isinstance(prov, dict) or "packages" not in prov:
        return None
    k = prov.get("kit") or {}
    c = prov.get("container") or {}
    return {"kit": k.get("version"), "commit": k.get("commit"), "dirty": k.get("dirty"),
            "dirty_sha256": k.get("dirty_sha256"), "python": (prov.get("python") or {}).get("version"),
            "spack_lock": (prov.get("spack") or {}).get("lock_sha256"),
            "image": c.get("digest") or c.get("labels_sha256") or c.get("metadata_sha256") or c.get("image"),
            "gpu_driver": (prov.get("gpu") or {}).get("driver"),
            "packages_sha256": prov["packages"].get("sha256"), "packages": prov["packages"].get("list")}


def stack_digest(s: dict) -> str:
    return hashlib.sha256(json.dumps({k: s.get(k) for k in STACK_KEYS if k != "packages"},
                                     sort_keys=True).encode()).hexdigest()[:16]


def _versions(packages) -> dict[str, str]:
    out = {}
    for item in packages or []:
        name, sep, version = str(item).partition("==")
        if sep:
            out[name] = version
    return out


def differences(calibrated: dict | None, ran: dict | None) -> list[str]:
    """What differs between two stacks, one short phrase each (`numpy 2.4.6 -> 2.4.7`,
    `+ foo 1.0`, `- bar 2.0`, `kit commit 63f404e -> 1a2b3c4`); [] when they agree or
    either is unknown."""
    if not calibrated or not ran:
        return []
    out = []
    for key in STACK_KEYS:
        if key in ("packages", "packages_sha256", "dirty_sha256"):
            continue
        a, b = calibrated.get(key), ran.get(key)
        if a != b:
            label = {"commit": "kit commit", "dirty": "kit tree dirty", "kit": "kit version",
                     "spack_lock": "spack.lock sha256", "image": "container image",
                     "gpu_driver": "GPU driver"}.get(key, key)
            short = (lambda v: v[:12] if isinstance(v, str) and key in ("commit", "spack_lock") else v)  # noqa: E731
            out.append(f"{label} {short(a)} -> {short(b)}")
    if calibrated.get("dirty") and ran.get("dirty") and calibrated.get("dirty_sha256") != ran.get("dirty_sha256"):
        out.append("kit uncommitted changes differ")
    old, new = _versions(calibrated.get("packages")), _versions(ran.get("packages"))
    if old and new:
        for name in sorted(set(old) | set(new)):
            if name not in new:
                out.append(f"- {name} {old[name]}")
            elif name not in old:
                out.append(f"+ {name} {new[name]}")
            elif old[name] != new[name]:
                out.append(f"{name} {old[name]} -> {new[name]}")
    elif calibrated.get("packages_sha256") != ran.get("packages_sha256"):
        out.append(f"installed packages sha256 {str(calibrated.get('packages_sha256'))[:12]} -> "
                   f"{str(ran.get('packages_sha256'))[:12]}")
    return out


def describe_change(calibrated: dict | None, ran: dict | None, limit: int = 12) -> str:
    """One line for a FAIL message: what changed since calibration, or '' when nothing
    did (or the calibration recorded no stack)."""
    diff = differences(calibrated, ran)
    if not diff:
        return ""
    shown = "; ".join(diff[:limit]) + (f"; and {len(diff) - limit} more" if len(diff) > limit else "")
    return f"the software stack differs from the one the references were calibrated with: {shown}"


# ---- the references' header ---------------------------------------------------------------

HEADER_PREFIX = "#   stack."


def header_lines(s: dict | None, width: int = 100) -> list[str]:
    """The stack as YAML comment lines (`#   stack.<key>: <value>`, the package list
    wrapped over several `stack.packages` lines); `parse_header` reads them back."""
    if not s:
        return ["# Software stack: not recorded (the perflogs predate hpckit_provenance)."]
    lines = ["# Software stack of the calibration runs (their hpckit_provenance); a check that FAILs",
             "# against these references names what differs from it:"]
    for key in STACK_KEYS:
        if key == "packages":
            continue
        value = s.get(key)
        text = "null" if value is None else ("true" if value is True else "false" if value is False else str(value))
        lines.append(f"{HEADER_PREFIX}{key}: {text}")
    current = ""
    for item in s.get("packages") or []:
        if current and len(current) + 1 + len(item) > width:
            lines.append(f"{HEADER_PREFIX}packages: {current}")
            current = item
        else:
            current = f"{current} {item}".strip()
    if current:
        lines.append(f"{HEADER_PREFIX}packages: {current}")
    return lines


def parse_header(text: str) -> dict | None:
    """The stack written by header_lines, from a references file's text; None if absent."""
    out: dict = {}
    packages: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            if out or packages:
                break
            continue
        if not line.startswith(HEADER_PREFIX):
            continue
        key, _, value = line[len(HEADER_PREFIX):].partition(": ")
        value = value.strip()
        if key == "packages":
            packages += value.split()
        elif key in STACK_KEYS:
            out[key] = {"null": None, "true": True, "false": False}.get(value, value)
    if not out and not packages:
        return None
    out["packages"] = packages
    return out


# ---- reading it back -------------------------------------------------------------------

def _spec():
    """The types `collect` writes, for hpckit.common.inputs.conform: a provenance block read
    back (summary.json, a log's hpckit_provenance line) is checked against them, so every
    reader (package, report, the checks) can rely on them."""
    from hpckit.common.inputs import COUNT, NUMBER, ListOf, MapOf, Opt
    text = Opt(str)
    return {
        "schema": Opt(COUNT),
        "kit": Opt({"version": text, "commit": text, "dirty": Opt(bool), "dirty_sha256": text, "source": text,
                    "distribution": text, "git_error": text}),
        "python": Opt({"version": text, "implementation": text, "executable": text}),
        "framework": text,
        "frameworks": Opt(MapOf(Opt((str, int)))),
        "packages": Opt({"count": Opt(COUNT), "sha256": text, "list": Opt(ListOf(str))}),
        "spack": Opt({"env": text, "lock_sha256": text, "yaml_sha256": text, "roots": Opt(ListOf(str)),
                      "spack": text}),
        "container": Opt({"runtime": text, "image": text, "digest": text, "name": text, "id": text,
                          "labels_sha256": text, "metadata_sha256": text, "engine": text, "rootless": text,
                          "arch": text, "declared": Opt(MapOf(text))}),
        "host": Opt({"name": text, "os": text, "kernel": text, "machine": text}),
        "cpu": Opt({"model": text, "cpus": Opt(COUNT), "machine_key": text, "flags": Opt(ListOf(str))}),
        "gpu": Opt({"driver": text, "models": Opt(ListOf(str)), "source": text, "count": Opt(COUNT)}),
        "collect_s": Opt(NUMBER),
    }


def stack_spec():
    """The types of `stack`'s value (a perflog's `stack` field read back)."""
    from hpckit.common.inputs import ListOf, Opt
    return {**{k: Opt(str) for k in STACK_KEYS}, "dirty": Opt(bool), "packages": Opt(ListOf(str))}


def checked(prov, what: str, key: str) -> dict | None:
    """`prov` if it has the types the kit writes (or is None), else one KitError naming
    the file (`what`) and the key."""
    from hpckit.common.inputs import Opt, conform
    conform(prov, Opt(_spec()), what, key)
    return prov


def from_log(path: str | os.PathLike) -> dict | None:
    """The hpckit_provenance value a result log recorded (None for logs without one); one
    of another shape than the kit writes is one KitError naming the log."""
    from hpckit.common.errors import KitError
    from hpckit.common.inputs import read_bytes
    from hpckit.results.logs import mllog_lines
    if not os.path.lexists(path):
        return None
    try:
        data = read_bytes(path, f"log {path}")
    except KitError:
        return None   # the log reader names an unreadable log where it matters
    for n, rec in mllog_lines(data):
        if rec is not None and rec.get("key") == LOG_KEY:
            return checked(rec.get("value"), f"log {path}", f"line {n}: {LOG_KEY}")
    return None


def of_run(log_path: str | os.PathLike) -> dict | None:
    """A run's provenance: summary.json's block beside the log (with the package list),
    else the log's hpckit_provenance line (without it), else None. A summary.json or a
    block of another shape than the kit writes is one KitError naming the file and key."""
    from hpckit.common.summary import read_summary
    summary = Path(log_path).parent / "summary.json"
    if Path(log_path).name == "mlperf.log" and os.path.lexists(summary):
        prov = read_summary(summary).get("provenance")
        if prov is not None:
            return prov
    return from_log(log_path)


def summary_line(prov: dict | None) -> str:
    """One human line: kit, Python, frameworks, packages, Spack, container, GPU."""
    if not prov:
        return "not recorded"
    k, fw = prov.get("kit") or {}, prov.get("frameworks") or {}
    commit = k.get("commit")
    kit_text = f"hpckit {k.get('version')}" + (f" {commit[:12]}{' dirty' if k.get('dirty') else ''}" if commit else "")
    parts = [kit_text, f"python {(prov.get('python') or {}).get('version')}"]
    parts += [f"{d} {fw[d]}" for d in ("torch", "tensorflow", "tensorflow-cpu") if fw.get(d)]
    pk = prov.get("packages") or {}
    parts.append(f"{pk.get('count')} packages sha256 {str(pk.get('sha256'))[:12]}")
    sp = prov.get("spack")
    if sp:
        parts.append(f"spack env {sp.get('env')} lock {str(sp.get('lock_sha256'))[:12]}")
    c = prov.get("container")
    if c:
        parts.append(f"{c.get('runtime')} image {c.get('digest') or c.get('image') or 'unknown'}")
    g = prov.get("gpu")
    if g:
        parts.append(f"GPU {', '.join(sorted(set(g.get('models') or []))) or '?'} driver {g.get('driver')}")
    return ", ".join(parts)
