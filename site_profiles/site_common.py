"""What every site profile's settings.py shares: the ReFrame `logging` section, and for the
target profiles the partition extras the checks read and the spack/apptainer/sarus
environments (their contract with reframe_checks/mlperf_base.py and profile_environment.py).

Perflogs: one file per test under <prefix>/perflogs/<system>/<partition>/, one line per performance
variable: completion time, result, test, environment, config, seed, variable, value,
unit, reference, lower and upper thresholds, verdict, node list, and the software stack the
run recorded (one line of JSON: hpckit.common.provenance.stack, which `hpckit references
calibrate` writes into the references' header) ('|'-separated; ReFrame writes the format
as the file's first line, which `hpckit report` reads).
"""

PERFLOG_FORMAT = ('%(check_job_completion_time)s|%(check_result)s|'
                  '%(check_display_name)s|%(check_environ)s|'
                  '%(check_config)s|%(check_seed)s|%(check_perf_var)s|'
                  '%(check_perf_value)s|%(check_perf_unit)s|'
                  '%(check_perf_ref)s|%(check_perf_lower_thres)s|'
                  '%(check_perf_upper_thres)s|%(check_perf_result)s|'
                  '%(check_job_nodelist)s|%(check_stack)s')

import os
import sys

BENCHMARKS = ('cosmoflow', 'deepcam')


def machine_reference_prefix(profile_dir):
    """Where ReFrame reads the performance references of a profile that runs on whatever
    machine it is started on (local, slurm-local): `<profile>/calibrated/<machine key>/`
    when `make calibrate` (hpckit references calibrate) wrote references for this machine,
    else `<profile>/` itself, whose references.yaml judges nothing: the checks then PASS
    or FAIL on correctness alone, log their figures, and one line says how to calibrate.
    A reference measured on one machine is never applied to another."""
    try:
        from hpckit.common.cores import machine_key
        key = machine_key()
    except ImportError:        # ReFrame started outside the kit's environment
        key = None
    if key:
        calibrated = os.path.join(profile_dir, 'calibrated', key)
        if os.path.isfile(os.path.join(calibrated, 'references.yaml')):
            return calibrated
    name = os.path.basename(profile_dir)
    print(f'site profile {name}: no performance references for this machine ({key or "unknown"}); '
          f'the checks judge correctness only. Calibrate: make calibrate PROFILE={name}', file=sys.stderr)
    return profile_dir

LOGGING = [
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
            {'type': 'filelog', 'prefix': '%(check_system)s/%(check_partition)s',
             'level': 'info', 'append': True, 'format': PERFLOG_FORMAT},
        ],
    },
]


# ReFrame's results database (sqlite, ReFrame >= 4.7): every session's test cases and
# performance figures with their references, at ReFrame's default place
# ${HOME}/.reframe/reports/results.db (RFM_SQLITE_DB_FILE moves it). Query it with
# --list-stored-sessions / --list-stored-testcases, and show how a run moved against an
# earlier one with --performance-compare (these need polars: in requirements/cpu.txt, and
# the Spack recipe's +analytics variant), e.g.
#   reframe -C site_profiles/local/settings.py --performance-compare=now-1w:now-1d/now-1d:now/mean:/+result
STORAGE = [{'enable': True}]


def run_extras(data_dir, stage_dir, ranks_per_node, nodes):
    """Partition extras: where each benchmark's dataset lives (<data_dir>/<benchmark>),
    node-local staging, and the ranks of one MLPerf run."""
    return {'data': {b: os.path.join(data_dir, b) for b in BENCHMARKS},
            'stage_dir': stage_dir,
            'ranks': nodes * ranks_per_node,
            'ranks_per_node': ranks_per_node}


def hpckit_environments(profile_dir, apptainer_image, sarus_image=None):
    """`spack` (the profile's Spack environment), `apptainer` and, where the site has
    Sarus, `sarus`: the same checks natively or in the kit's image."""
    def env(name, extras):
        return {'name': name, 'features': ['hpckit'],
                'env_vars': [['PYTHONUNBUFFERED', '1']], 'extras': extras}

    envs = [env('spack', {'spack_env': profile_dir}),
            env('apptainer', {'container_platform': 'Apptainer', 'container_image': apptainer_image})]
    if sarus_image:
        envs.append(env('sarus', {'container_platform': 'Sarus', 'container_image': sarus_image}))
    return envs
