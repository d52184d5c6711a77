"""ReFrame site profile `slurm-local`: a one-node Slurm cluster on this machine.

    tests/slurm/cluster.sh start /tmp/hpckit-slurm      # prints: export SLURM_CONF=...
    export SLURM_CONF=/tmp/hpckit-slurm/slurm.conf
    reframe -C site_profiles/slurm-local/settings.py -c reframe_checks/ -r
    tests/slurm/cluster.sh stop /tmp/hpckit-slurm

The checks go through the real scheduler: ReFrame writes a job script, submits it with
sbatch, polls squeue (the `squeue` scheduler: no accounting daemon needed), and the job
launches every training with `srun` on 2 tasks, so the run is a real 2-rank
torch.distributed / tf.distribute run wired from SLURM_* variables. The local batch is 4
per rank, so the global batch is the 1-rank mini runs' 8.

Partition extras (read by reframe_checks/mlperf_base.py):
  ranks, ranks_per_node   tasks of one MLPerf run
  local_batch_size        per-rank batch (0 or absent: the config's)
  stage_dir               node-local scratch for staging (one subdirectory per test)
  data                    {benchmark: dataset root} for non-mini configs
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from site_common import env, env_path, venv_configuration  # noqa: E402   site_profiles/site_common.py

site_configuration = venv_configuration(
    __file__,
    descr='One-node Slurm cluster on localhost (tests/slurm/cluster.sh)',
    partitions=[{
        'name': 'debug',
        'descr': 'Slurm partition debug, 2 ranks per run through srun',
        'scheduler': 'squeue',
        'launcher': 'srun',
        'access': [f"--partition={env('HPCKIT_SLURM_PARTITION', 'debug')}"],
        'features': ['mlperf'],
        'max_jobs': 1,
        'time_limit': '30m',
        'extras': {'ranks': 2, 'ranks_per_node': 2, 'local_batch_size': 4,
                   'stage_dir': env_path('HPCKIT_STAGE_DIR', '/tmp/hpckit-stage')},
    }],
    # intra-op threads per rank: the node's cores shared by its 2 ranks
    omp_num_threads=str(max(1, (os.cpu_count() or 2) // 2)),
    # a rank that exits non-zero ends the step: the others do not wait on it
    env_vars=[['SLURM_KILL_BAD_EXIT', '1']],
)
