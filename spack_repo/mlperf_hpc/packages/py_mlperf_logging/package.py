# Copyright Spack Project Developers. See COPYRIGHT file for details.
#
# SPDX-License-Identifier: (Apache-2.0 OR MIT)

from spack_repo.builtin.build_systems.python import PythonPackage

from spack.package import *


class PyMlperfLogging(PythonPackage):
    """MLPerf compliance tools: the mllog logger, the compliance, package and system
    description checkers and the result summarizer for MLPerf training and HPC.

    Spack's builtin repository has only 0.7.1, which has no HPC rulesets; this recipe
    shadows it with the 4.x series. MLCommons publishes 4.x on PyPI as a pure-Python
    wheel only (no sdist), so the versions are wheels, installed as Spack installs any
    wheel (expand=False, pip install of the file)."""

    homepage = "https://github.com/mlcommons/logging"
    url = (
        "https://files.pythonhosted.org/packages/60/34/"
        "b4554ff5fe2ec569ac738c83491c807cd55d846d41fa2a840d745e3ee6ae/"
        "mlperf_logging-4.1.68-py3-none-any.whl"
    )
    list_url = "https://pypi.org/simple/mlperf-logging/"

    license("Apache-2.0")

    version(
        "4.1.68",
        sha256="1f199ff35625308786fe3410410d3b03a32661a8b2babd022eacad7b91166f03",
        expand=False,
    )

    # Requires-Dist of the 4.1.68 wheel
    depends_on("python@3.8:", type=("build", "run"))
    depends_on("py-pandas@1.0:", type=("build", "run"))
    depends_on("py-pyyaml@5.4.1:", type=("build", "run"))
    depends_on("py-numpy@1.17.3:", type=("build", "run"))
    depends_on("py-scipy@1.4.1:", type=("build", "run"))
