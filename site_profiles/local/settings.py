"""ReFrame site profile `local`: any Linux machine, checks run through the repository's venv.

    reframe -C site_profiles/local/settings.py -c reframe_checks/ -r

Everything ReFrame writes goes under the repository root (stage/, output/, perflogs/;
git-ignored) unless moved with --prefix/RFM_PREFIX, --stage/--outputdir or --perflogdir.
Performance references are per machine: the checks name `reference = {'$ref':
'references.yaml'}` and ReFrame looks it up under the reference prefix, which this file
sets to calibrated/<machine key>/ once `make calibrate` has measured this machine, and
otherwise to this directory, whose references.yaml judges nothing (correctness only; one
line on stderr says how to calibrate). See site_common.machine_reference_prefix.

Partitions:
  default  local launcher, one process: where the MLPerf checks run (feature `mlperf`).
  mpi      mpirun launcher, 2 ranks per run at local batch 4 (global batch 8, as on
           `default`); not selected by the checks by default:
           reframe ... -r --system local:mpi -S valid_systems=local:mpi
           (as root, Open MPI also wants OMPI_ALLOW_RUN_AS_ROOT=1 and
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 exported; 5/5 PASS measured)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from site_common import venv_configuration  # noqa: E402   site_profiles/site_common.py

# The machine has few cores: one training at a time, each using all of them.
_partition = {'scheduler': 'local', 'max_jobs': 1, 'time_limit': '1h'}

site_configuration = venv_configuration(
    __file__,
    descr='Any Linux machine (site profile site_profiles/local)',
    partitions=[
        {**_partition, 'name': 'default', 'launcher': 'local',
         'descr': 'local processes, one rank', 'features': ['mlperf']},
        {**_partition, 'name': 'mpi', 'launcher': 'mpirun',
         'descr': 'local processes under mpirun', 'features': ['mpi'],
         'extras': {'ranks': 2, 'local_batch_size': 4}},
    ],
    omp_num_threads='$(nproc)',
)
