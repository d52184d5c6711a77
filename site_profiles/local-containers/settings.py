"""ReFrame site profile `local-containers`: the `local` profile's checks inside the kit's
`local` image (containers/local), through the HPC container runtimes that install on any
Linux machine: NERSC's podman-hpc and Charliecloud (docs/containers-spack.md).

    reframe -C site_profiles/local-containers/settings.py -c reframe_checks/ -r -p podman-hpc
    reframe -C site_profiles/local-containers/settings.py -c reframe_checks/ -r -p charliecloud

The image, built from containers/local/Dockerfile:
  podman-hpc    podman build -t hpckit:local ...; podman-hpc migrate localhost/hpckit:local
                (into podman-hpc's squashfs store, SQUASH_DIR); HPCKIT_PODMAN_HPC_IMAGE
                names it (default localhost/hpckit:local)
  charliecloud  ch-image build -t hpckit:local ...; HPCKIT_CH_IMAGE is the image directory
                (ch-convert hpckit:local DIR, or ch-image's storage img/hpckit+local;
                default $HPCKIT_DATA/images/hpckit-local-0.1.0, HPCKIT_DATA defaulting
                to the repository's data/)

The local image holds the local profile's whole stack (PyTorch and TensorFlow): every check
of `local` runs in it.
Performance references are per machine, as for `local`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from site_common import venv_configuration  # noqa: E402   site_profiles/site_common.py

site_configuration = venv_configuration(
    __file__,
    descr='Any Linux machine, the checks in the local image (site profile local-containers)',
    partitions=[{'name': 'default', 'scheduler': 'local', 'launcher': 'local', 'max_jobs': 1,
                 'time_limit': '1h', 'descr': 'local processes, one rank, in a container',
                 'features': ['mlperf']}],
    omp_num_threads='$(nproc)',
    runtimes=('podman-hpc', 'charliecloud'),
    target='local',
)
