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

_here = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(_here))
VENV_BIN = os.path.join(REPO, '.venv', 'bin')

# see site_profiles/local/settings.py: ReFrame 4.10.4 rejects general/reference_prefix
os.environ.setdefault('RFM_REFERENCE_PREFIX', _here)

site_configuration = {
    'systems': [
        {
            'name': 'slurm-local',
            'descr': 'One-node Slurm cluster on localhost (tests/slurm/cluster.sh)',
            'hostnames': ['.*'],
            'prefix': REPO,
            'partitions': [
                {
                    'name': 'debug',
                    'descr': 'Slurm partition debug, 2 ranks per run through srun',
                    'scheduler': 'squeue',
                    'launcher': 'srun',
                    'access': [f"--partition={os.environ.get('HPCKIT_SLURM_PARTITION', 'debug')}"],
                    'environs': ['hpckit-venv'],
                    'features': ['mlperf'],
                    'max_jobs': 1,
                    'time_limit': '30m',
                    'extras': {
                        'ranks': 2,
                        'ranks_per_node': 2,
                        'local_batch_size': 4,
                        'stage_dir': os.environ.get('HPCKIT_STAGE_DIR', '/tmp/hpckit-stage'),
                    },
                },
            ],
        },
    ],
    'environments': [
        {
            'name': 'hpckit-venv',
            'features': ['hpckit'],
            'env_vars': [
                ['PATH', f'"{VENV_BIN}":$PATH'],
                # intra-op threads per rank: the node's cores shared by its 2 ranks
                ['OMP_NUM_THREADS', str(max(1, (os.cpu_count() or 2) // 2))],
                ['PYTHONUNBUFFERED', '1'],
                # a rank that exits non-zero ends the step: the others do not wait on it
                ['SLURM_KILL_BAD_EXIT', '1'],
            ],
        },
    ],
    'logging': [
        {
            'handlers$': [
                {'type': 'stream', 'name': 'stdout', 'level': 'info', 'format': '%(message)s'},
            ],
            'handlers': [
                {'type': 'file', 'level': 'debug2', 'append': False,
                 'format': '[%(asctime)s] %(levelname)s: %(check_info)s: %(message)s'},
            ],
            'perflog_multiline': True,
            'handlers_perflog': [
                {
                    'type': 'filelog',
                    'prefix': '%(check_system)s/%(check_partition)s',
                    'level': 'info',
                    'append': True,
                    'format': ('%(check_job_completion_time)s|%(check_result)s|'
                               '%(check_display_name)s|%(check_environ)s|'
                               '%(check_config)s|%(check_seed)s|%(check_perf_var)s|'
                               '%(check_perf_value)s|%(check_perf_unit)s|'
                               '%(check_perf_ref)s|%(check_perf_lower_thres)s|'
                               '%(check_perf_upper_thres)s|%(check_perf_result)s|'
                               '%(check_job_nodelist)s'),
                },
            ],
        },
    ],
}
