# Copyright Spack Project Developers. See COPYRIGHT file for details.
#
# SPDX-License-Identifier: (Apache-2.0 OR MIT)

from spack_repo.builtin.build_systems.python import PythonPackage

from spack.package import *


class Reframe(PythonPackage):
    """ReFrame is a framework for writing regression tests for HPC systems.

    Spack's builtin `reframe` (spack-packages v2025.11) stops at 4.7.3 and installs by
    copying the git archive. The kit's checks need ReFrame 4.10 (external performance
    references, `$ref`), whose release on PyPI is an sdist built with hatchling, so this
    recipe shadows the builtin one and installs the PyPI sdist with pip, which also gives
    the `reframe` entry point in bin/."""

    homepage = "https://reframe-hpc.readthedocs.io"
    pypi = "reframe-hpc/reframe_hpc-4.10.4.tar.gz"
    git = "https://github.com/reframe-hpc/reframe.git"

    maintainers("victorusu", "vkarak")

    license("BSD-3-Clause")

    version("4.10.4", sha256="0d3b0246664fa5b98dc50deed239282300fd74684c607f6b23b5484b924e988b")

    variant("gelf", default=False, description="Add graylog handler support")
    variant(
        "analytics", default=False, description="Results analytics (`--performance-compare`)"
    )

    depends_on("python@3.10:", type=("build", "run"))
    depends_on("py-hatchling", type="build")

    # [project] dependencies of 4.10.4. Upstream pins with ~=; Spack's builtin has a few
    # slightly older minor versions (jsonschema 4.25, requests 2.32, tabulate 0.9,
    # ClusterShell 1.8), which is why the lower bounds are the ones below.
    depends_on("py-archspec@0.2.4:", type=("build", "run"))
    depends_on("py-argcomplete@3.6:", type=("build", "run"))
    depends_on("py-clustershell@1.8:", type=("build", "run"))
    depends_on("py-fasteners@0.20:", type=("build", "run"))
    depends_on("py-jinja2@3.1:", type=("build", "run"))
    depends_on("py-jsonschema@4.25:", type=("build", "run"))
    depends_on("py-lxml@6:", type=("build", "run"))
    depends_on("py-pyyaml@6", type=("build", "run"))
    depends_on("py-requests@2.32:", type=("build", "run"))
    depends_on("py-semver@3", type=("build", "run"))
    depends_on("py-tabulate@0.9:", type=("build", "run"))
    depends_on("py-polars@1", type=("build", "run"), when="+analytics")
    depends_on("py-pygelf", type=("build", "run"), when="+gelf")

    @run_after("install")
    @on_package_attributes(run_tests=True)
    def check_list(self):
        Executable(self.prefix.bin.reframe)("--version")
