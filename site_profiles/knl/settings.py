"""ReFrame site profile `knl`: Intel Xeon Phi (KNL) nodes, modelled on NERSC Cori's KNL partition.

Cori KNL (Cray XC40): 1x Intel Xeon Phi 7250 (68 cores, 4 threads each), 96 GB DDR4 and
16 GB MCDRAM (quad,cache), Aries dragonfly, no local disk; Slurm, `srun`, Cray MPICH.
https://docs.nersc.gov/systems/cori/ (retired 2023)

    spack env activate site_profiles/knl           # once built: spack install
    reframe -C site_profiles/knl/settings.py -c reframe_checks/ -r -p spack
    reframe -C site_profiles/knl/settings.py -c reframe_checks/ -r -p apptainer

What a site sets (environment variables, read when ReFrame loads this file):
  HPCKIT_ACCOUNT      Slurm account (-A). Unset: none.
  HPCKIT_QOS          Slurm QOS (default: regular)
  HPCKIT_CONSTRAINT   Slurm constraint selecting the KNL nodes (default: knl,quad,cache)
  HPCKIT_DATA         folder holding cosmoflow/ and deepcam/ (default: $SCRATCH/mlperf-hpc)
  HPCKIT_STAGE_DIR    node-local staging folder (default: /tmp/hpckit-stage; KNL nodes
                      have no disk, /tmp is memory-backed)
  HPCKIT_IMAGE        the Apptainer image (default: $HPCKIT_DATA/images/hpckit-knl-0.1.0.sif)
  HPCKIT_MODULES_SYSTEM  ReFrame modules system (default: nomod)
  HPCKIT_RFM_PREFIX   where ReFrame writes stage/, output/, perflogs/ (default: the repo)

Containers: Cori ran Shifter (listed as a platform); the `apptainer` environment runs the
kit's image where Apptainer is installed. There is no Sarus at NERSC, hence no `sarus`.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))   # site_profiles/site_common.py, shared
from site_common import LOGGING, STORAGE, hpckit_environments, run_extras  # noqa: E402
REPO = os.path.dirname(os.path.dirname(_here))

# ReFrame 4.10.4 rejects general/reference_prefix (see site_profiles/local/settings.py):
# the checks' `$ref: references.yaml` is found through the environment variable instead.
os.environ.setdefault('RFM_REFERENCE_PREFIX', _here)

_env = os.environ.get
NODES = int(_env('HPCKIT_NODES', '1'))   # nodes per training run
ACCOUNT = _env('HPCKIT_ACCOUNT', '')
DATA = _env('HPCKIT_DATA', os.path.join(_env('SCRATCH', '/global/cscratch1/sd/user'),
                                        'mlperf-hpc'))
STAGE_DIR = _env('HPCKIT_STAGE_DIR', '/tmp/hpckit-stage')
IMAGE = _env('HPCKIT_IMAGE', os.path.join(DATA, 'images', 'hpckit-knl-0.1.0.sif'))

site_configuration = {
    'systems': [
        {
            'name': 'knl',
            'descr': 'Intel Xeon Phi 7250 nodes, modelled on NERSC Cori KNL (site profile knl)',
            'hostnames': [r'cori\d+', r'nid\d+'],
            'modules_system': _env('HPCKIT_MODULES_SYSTEM', 'nomod'),
            'prefix': _env('HPCKIT_RFM_PREFIX', REPO),
            'partitions': [
                {
                    'name': 'knl',
                    'descr': '1x Xeon Phi 7250 (68 cores) per node, quad,cache',
                    'scheduler': 'slurm',
                    'launcher': 'srun',
                    'access': [f'--constraint={_env("HPCKIT_CONSTRAINT", "knl,quad,cache")}',
                               f'--qos={_env("HPCKIT_QOS", "regular")}']
                              + ([f'--account={ACCOUNT}'] if ACCOUNT else []),
                    'environs': ['spack', 'apptainer'],
                    'features': ['mlperf', 'cpu'],
                    'max_jobs': 8,
                    'time_limit': '8h',
                    'processor': {'arch': 'mic_knl', 'num_cpus': 272, 'num_cpus_per_core': 4,
                                  'num_sockets': 1, 'num_cpus_per_socket': 272},
                    'container_platforms': [
                        {'type': 'Apptainer', 'default': True},
                        {'type': 'Shifter'},
                    ],
                    # ranks of one MLPerf run: one rank per node with all 68 cores' threads, as the Cori KNL runs
                    'extras': run_extras(DATA, STAGE_DIR, ranks_per_node=1, nodes=NODES),
                },
            ],
        },
    ],
    'environments': hpckit_environments(_here, IMAGE),
    'logging': LOGGING,
    'storage': STORAGE,
}
