"""ReFrame site profile `v100`: NVIDIA V100 nodes, modelled on NERSC Cori-GPU ("cgpu").

Cori-GPU: 2x Intel Xeon Gold 6148 (20 cores, 2 threads each), 384 GB DDR4, 8x NVIDIA
V100-SXM2 (NVLink hybrid cube-mesh), 4x dual-port EDR InfiniBand, 930 GB node-local NVMe;
Slurm, `srun` (jobs submitted after `module load cgpu`). This is the system of LBNL's
MLPerf HPC v0.7 results (system description corigpu_n64_tf1.15.0.json).
https://docs-dev.nersc.gov/cgpu/hardware/

    spack env activate site_profiles/v100          # once built: spack install
    reframe -C site_profiles/v100/settings.py -c reframe_checks/ -r -p spack
    reframe -C site_profiles/v100/settings.py -c reframe_checks/ -r -p apptainer

What a site sets (environment variables, read when ReFrame loads this file):
  HPCKIT_ACCOUNT      Slurm account (-A). Unset: none.
  HPCKIT_QOS          Slurm QOS (default: regular)
  HPCKIT_CONSTRAINT   Slurm constraint selecting the GPU nodes (default: gpu)
  HPCKIT_DATA         folder holding cosmoflow/ and deepcam/ (default: $SCRATCH/mlperf-hpc)
  HPCKIT_STAGE_DIR    node-local staging folder (default: /tmp/hpckit-stage, the NVMe)
  HPCKIT_IMAGE        the Apptainer image (default: $HPCKIT_DATA/images/hpckit-v100-0.1.0.sif)
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
IMAGE = _env('HPCKIT_IMAGE', os.path.join(DATA, 'images', 'hpckit-v100-0.1.0.sif'))

site_configuration = {
    'systems': [
        {
            'name': 'v100',
            'descr': 'NVIDIA V100 nodes, modelled on NERSC Cori-GPU (site profile v100)',
            'hostnames': [r'cori\d+', r'cgpu\d+'],
            'modules_system': _env('HPCKIT_MODULES_SYSTEM', 'nomod'),
            'prefix': _env('HPCKIT_RFM_PREFIX', REPO),
            'partitions': [
                {
                    'name': 'gpu',
                    'descr': '8x V100-SXM2-16GB, 2x Xeon Gold 6148 per node',
                    'scheduler': 'slurm',
                    'launcher': 'srun',
                    'access': [f'--constraint={_env("HPCKIT_CONSTRAINT", "gpu")}',
                               f'--qos={_env("HPCKIT_QOS", "regular")}']
                              + ([f'--account={ACCOUNT}'] if ACCOUNT else []),
                    'environs': ['spack', 'apptainer'],
                    'features': ['mlperf', 'gpu', 'cuda'],
                    'max_jobs': 4,
                    'time_limit': '4h',
                    'processor': {'arch': 'skylake_avx512', 'num_cpus': 80,
                                  'num_cpus_per_core': 2, 'num_sockets': 2,
                                  'num_cpus_per_socket': 40},
                    'devices': [{'type': 'gpu', 'arch': 'sm_70',
                                 'model': 'NVIDIA V100-SXM2-16GB', 'num_devices': 8}],
                    'resources': [
                        {'name': 'gpu', 'options': ['--gpus-per-node={num_gpus_per_node}']},
                    ],
                    'container_platforms': [
                        {'type': 'Apptainer', 'default': True},
                        {'type': 'Shifter'},
                    ],
                    # ranks of one MLPerf run: one rank per GPU
                    'extras': run_extras(DATA, STAGE_DIR, ranks_per_node=8, nodes=NODES),
                },
            ],
        },
    ],
    'environments': hpckit_environments(_here, IMAGE),
    'logging': LOGGING,
    'storage': STORAGE,
}
