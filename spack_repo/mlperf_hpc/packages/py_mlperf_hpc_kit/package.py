# Copyright Spack Project Developers. See COPYRIGHT file for details.
#
# SPDX-License-Identifier: (Apache-2.0 OR MIT)

import os

from spack_repo.builtin.build_systems.python import PythonPackage

from spack.package import *

# The repository this recipe lives in: spack_repo/mlperf_hpc/packages/<this dir>/ is four
# levels below its root, where pyproject.toml builds the distribution mlperf-hpc-kit.
_KIT_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))


class PyMlperfHpcKit(PythonPackage):
    """The MLPerf HPC reproducibility kit (distribution mlperf-hpc-kit, command `hpckit`):
    the MLPerf HPC v3.0 suite (CosmoFlow, DeepCAM, OpenCatalyst, OpenFold) on data in their
    public on-disk formats, MLPerf logging and compliance checks, scoring, and the ReFrame
    checks' entry point.

    The kit publishes no release tarball. The site profiles' environments build it from
    the working tree of this repository with Spack's `develop:` section (spack.yaml:
    `path: ../..`), which needs no fetch and no checksum. Outside an environment
    (`spack install py-mlperf-hpc-kit`), a version clones this same checkout, whose
    location Spack knows from this file's path: `main` at the tip of its branch, a numbered
    version at its pinned commit."""

    # the kit publishes no web page: its home is the checkout (README.md), not mlcommons/hpc,
    # whose reference implementations it reproduces
    homepage = f"file://{_KIT_ROOT}"
    git = f"file://{_KIT_ROOT}"

    license("Apache-2.0")

    version("main", branch="main")
    # pyproject.toml's version, pinned: main as it landed on 2026-12-07 (fb0e2d8), the last
    # state CI passed before this version's number was pinned; the environments build the
    # working tree through `develop:` whatever the version says
    version("0.1.0", commit="fb0e2d84f38f1ee590eab0bf99224de3ed6606fd", preferred=True)

    variant(
        "torch", default=True, description="PyTorch backend (all four; OC20 and OpenFold need it)"
    )
    variant("tensorflow", default=False, description="TensorFlow/Keras backend (CosmoFlow)")
    variant("horovod", default=False, description="Horovod for multi-rank training")

    depends_on("python@3.11:", type=("build", "run"))
    depends_on("py-setuptools@68:", type="build")

    # [project] dependencies of pyproject.toml
    depends_on("py-numpy@1.26:", type=("build", "run"))
    depends_on("py-pyyaml@6:", type=("build", "run"))
    depends_on("py-mlperf-logging@4.1:", type=("build", "run"))
    depends_on("py-crc32c@2.4:", type=("build", "run"))
    # DeepCAM's HDF5 data (hpckit.deepcam)
    depends_on("py-h5py", type=("build", "run"))
    # OC20's LMDB data (hpckit.oc20)
    depends_on("py-lmdb", type=("build", "run"))
    # OpenFold's processed layout (hpckit.openfold) needs nothing more: csv, zlib and the
    # kit's own pickle decoder from the standard library, numpy, and torch (+torch)
    # tcmalloc, which `hpckit train` preloads (hpckit/common/memory.py)
    depends_on("gperftools", type="run")

    # [project.optional-dependencies]
    depends_on("py-torch@2.1:", type=("build", "run"), when="+torch")
    depends_on("py-tensorflow@2.14:", type=("build", "run"), when="+tensorflow")
    depends_on("py-horovod", type=("build", "run"), when="+horovod")
    depends_on("py-horovod frameworks=pytorch", type=("build", "run"), when="+horovod+torch")
    depends_on(
        "py-horovod frameworks=tensorflow", type=("build", "run"), when="+horovod+tensorflow"
    )
    conflicts("+horovod", when="~torch~tensorflow", msg="Horovod needs a framework")

    import_modules = [
        "hpckit",
        "hpckit.common",
        "hpckit.cosmoflow",
        "hpckit.deepcam",
        "hpckit.oc20",
        "hpckit.openfold",
    ]
