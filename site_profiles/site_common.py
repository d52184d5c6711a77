"""What every site profile's settings.py shares, so that each of them only declares its site:
the ReFrame `logging` and `storage` sections; for the two profiles that run on whatever
machine they start on (local, slurm-local) the system around the repository's venv
(`venv_configuration`); for the four target profiles (a64fx, knl, v100, a100) the system,
its Slurm partition, the partition extras the checks read and the spack / container
environments (`target_configuration`: their contract with reframe_checks/mlperf_base.py
and profile_environment.py).

Everything here reads the process environment (HPCKIT_*) when a function is called, never
when this module is imported: ReFrame (and the tests) load a settings.py again with
another environment while this module stays imported.

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

BENCHMARKS = ('cosmoflow', 'deepcam', 'oc20', 'openfold')   # hpckit.common.benchmark.PACKAGES


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


def env(name, default=''):
    """A site variable (HPCKIT_*) as set when the profile is loaded, else `default`."""
    return os.environ.get(name, default)


def env_path(name, default):
    """A site variable naming a directory (HPCKIT_DATA, HPCKIT_STAGE_DIR), else `default`: a
    relative one is taken from the directory ReFrame was started in, as a user means it
    (each check runs in its own stage directory, where it would name nothing); one that
    starts with a variable (`$PJM_LOCALTMP/...`, expanded in the job) is left as it is."""
    value = env(name)
    if not value:
        return default
    return value if value.startswith(('/', '$', '~')) else os.path.abspath(value)


def env_count(name, default, what, profile):
    """A site variable that counts something (nodes, ranks, threads): a whole number from 1
    up to what the kit's commands take (2**31 - 1), or `default` (None: unset is None).
    Anything else is one line naming the profile and the variable, and exit 2: ReFrame
    prints a traceback for an exception raised in a settings file."""
    value = env(name)
    if not value:
        return default
    if not (value.isascii() and value.isdigit() and 0 < int(value) < 2**31):
        print(f'site profile {profile}: {name}={value!r}: not a number of {what} (1, 2, ...)',
              file=sys.stderr)
        sys.exit(2)
    return int(value)


def account():
    """HPCKIT_ACCOUNT: the Slurm account (-A) or group; '' when unset (no --account)."""
    return env('HPCKIT_ACCOUNT', '')


def _profile(settings_file):
    """(profile folder, profile name, repository root) of a settings.py."""
    here = os.path.dirname(os.path.abspath(settings_file))
    return here, os.path.basename(here), os.path.dirname(os.path.dirname(here))


def _set_reference_prefix(prefix):
    """External references (ReFrame 4.10): the documented configuration option
    general/reference_prefix is missing from the configuration schema of ReFrame 4.10.4
    ("Additional properties are not allowed ('reference_prefix' was unexpected)"), so the
    prefix is given through its environment variable, which ReFrame reads only after
    loading the settings file. setdefault: an RFM_REFERENCE_PREFIX set by the caller wins."""
    os.environ.setdefault('RFM_REFERENCE_PREFIX', prefix)


def run_extras(data_dir, stage_dir, ranks_per_node, nodes):
    """Partition extras: where each benchmark's dataset lives (<data_dir>/<benchmark>),
    node-local staging, and the ranks of one MLPerf run."""
    return {'data': {b: os.path.join(data_dir, b) for b in BENCHMARKS},
            'stage_dir': stage_dir,
            'ranks': nodes * ranks_per_node,
            'ranks_per_node': ranks_per_node}


IMAGE_VERSION = '0.1.0'    # the kit version in the default image names

# The container runtimes a profile can offer as ReFrame environments beside `spack` (the
# profile's Spack environment): environment name -> (container platform, as
# reframe_checks/profile_environment.py reads it from the environment's extras and as the
# partition lists it; the HPCKIT_* variable naming the image; the default image, where
# {images} is <data>/images and {target} the image's target, e.g. the profile's name).
# Adding a runtime is one line here (and, where ReFrame has no platform for it, one class
# in profile_environment.py); a profile offers the ones its site has (`runtimes`).
CONTAINER_RUNTIMES = {
    'apptainer': ('Apptainer', 'HPCKIT_IMAGE', '{images}/hpckit-{target}-{version}.sif'),
    'sarus': ('Sarus', 'HPCKIT_SARUS_IMAGE', 'hpckit/{target}:{version}'),
    # NERSC's podman-hpc: the image built by Podman and moved to its squashfs store
    # (podman-hpc migrate), whose folder is the site's SQUASH_DIR
    'podman-hpc': ('PodmanHPC', 'HPCKIT_PODMAN_HPC_IMAGE', 'localhost/hpckit:{target}'),
    # Charliecloud: an image directory (ch-image build, then ch-convert to a directory)
    'charliecloud': ('Charliecloud', 'HPCKIT_CH_IMAGE', '{images}/hpckit-{target}-{version}'),
    # enroot + pyxis: srun --container-image, the image an enroot squashfs (enroot import)
    'pyxis': ('Pyxis', 'HPCKIT_ENROOT_IMAGE', '{images}/hpckit-{target}-{version}.sqsh'),
}


def _environment(name, extras, env_vars=(('PYTHONUNBUFFERED', '1'),)):
    return {'name': name, 'features': ['hpckit'],
            'env_vars': [list(v) for v in env_vars], 'extras': extras}


def container_environments(runtimes, images, target, env_vars=(('PYTHONUNBUFFERED', '1'),)):
    """One environment per container runtime in `runtimes` (names in CONTAINER_RUNTIMES):
    the image from the runtime's HPCKIT_* variable, else its default under `images`."""
    envs = []
    for name in runtimes:
        platform, variable, default = CONTAINER_RUNTIMES[name]
        image = env(variable, default.format(images=images, target=target, version=IMAGE_VERSION))
        extras = {'container_platform': platform, 'container_image': image}
        envs.append(_environment(name, extras, env_vars))
    return envs


def hpckit_environments(profile_dir, runtimes, data_dir):
    """`spack` (the profile's Spack environment) and one environment per container runtime
    in `runtimes`: the same checks natively or in the kit's image for this profile."""
    return [_environment('spack', {'spack_env': profile_dir}),
            *container_environments(runtimes, os.path.join(data_dir, 'images'),
                                    os.path.basename(profile_dir))]


def target_configuration(settings_file, *, descr, hostnames, partition, ranks_per_node,
                         data, stage_dir='/tmp/hpckit-stage', runtimes=('apptainer',),
                         platforms=()):
    """The site_configuration of a target profile: one system named after the profile's
    folder, with one Slurm partition where the MLPerf checks run.

    `partition` is what is the site's own (name, descr, launcher, access, features,
    max_jobs, time_limit, processor, devices, resources); added here: the `slurm`
    scheduler, `--account` from HPCKIT_ACCOUNT, the environments `spack` + `runtimes`,
    the container platforms (the runtimes', the first the default, then `platforms`: those
    the site has that the kit does not drive, e.g. Shifter), and the extras of one MLPerf
    run: HPCKIT_NODES (default 1) nodes of `ranks_per_node` ranks, the datasets under
    HPCKIT_DATA (default `data`), staging in HPCKIT_STAGE_DIR (default `stage_dir`). The
    system's modules system is HPCKIT_MODULES_SYSTEM (default nomod), ReFrame's prefix
    HPCKIT_RFM_PREFIX (default the repository)."""
    here, name, repo = _profile(settings_file)
    # the checks' `$ref: references.yaml` is found in the profile's folder (see
    # _set_reference_prefix)
    _set_reference_prefix(here)
    data = env_path('HPCKIT_DATA', data)
    acct = account()
    runtime_platforms = [CONTAINER_RUNTIMES[r][0] for r in runtimes]
    part = {
        'scheduler': 'slurm',
        **partition,
        'access': list(partition.get('access', [])) + ([f'--account={acct}'] if acct else []),
        'environs': ['spack', *runtimes],
        'container_platforms': [{'type': p, **({'default': True} if i == 0 else {})}
                                for i, p in enumerate([*runtime_platforms, *platforms])],
        'extras': run_extras(data, env_path('HPCKIT_STAGE_DIR', stage_dir), ranks_per_node,
                             nodes=env_count('HPCKIT_NODES', 1, 'nodes', name)),
    }
    return {
        'systems': [{
            'name': name,
            'descr': descr,
            'hostnames': hostnames,
            'modules_system': env('HPCKIT_MODULES_SYSTEM', 'nomod'),
            'prefix': env('HPCKIT_RFM_PREFIX', repo),
            'partitions': [part],
        }],
        'environments': hpckit_environments(here, runtimes, data),
        'logging': LOGGING,
        'storage': STORAGE,
    }


def venv_configuration(settings_file, *, descr, partitions, omp_num_threads, env_vars=(),
                       runtimes=(), target='local'):
    """The site_configuration of a profile that runs on whatever machine it is started on
    (local, slurm-local): one system named after the profile's folder, its ReFrame prefix
    the repository, every partition in the one environment `hpckit-venv` (the
    repository's .venv first on PATH, OMP_NUM_THREADS, unbuffered Python, then
    `env_vars`); performance references per machine (machine_reference_prefix).
    HPCKIT_OMP_NUM_THREADS, where set, is every training's `--threads` (a partition
    extra) and OMP_NUM_THREADS.
    With `runtimes`, the partitions run in those container environments instead (the
    `target` image, from HPCKIT_DATA/images by default), the venv
    still first on PATH (where pip put podman-hpc)."""
    here, name, repo = _profile(settings_file)
    venv_bin = os.path.join(repo, '.venv', 'bin')
    # checked before the profile's notices (the reference prefix's)
    threads = env_count('HPCKIT_OMP_NUM_THREADS', None, 'threads per rank', name)
    _set_reference_prefix(machine_reference_prefix(here))
    if threads:
        # intra-op threads per rank, imposed (`hpckit train --threads`; OMP_NUM_THREADS
        # alone gives way to the kit's core plan): where the plan cannot see who else
        # computes on the cores (namespace nodes sharing one machine, a shared machine)
        omp_num_threads = str(threads)
        partitions = [{**p, 'extras': {**p.get('extras', {}), 'threads': threads}}
                      for p in partitions]
    variables = [['PATH', f'"{venv_bin}":$PATH'],
                 ['OMP_NUM_THREADS', omp_num_threads],
                 ['PYTHONUNBUFFERED', '1'],
                 *env_vars]
    if runtimes:
        images = os.path.join(env('HPCKIT_DATA', os.path.join(repo, 'data')), 'images')
        environments = container_environments(runtimes, images, target, variables)
    else:
        environments = [{'name': 'hpckit-venv', 'features': ['hpckit'], 'env_vars': variables}]
    return {
        'systems': [{
            'name': name,
            'descr': descr,
            'hostnames': ['.*'],
            'prefix': repo,
            'partitions': [{**p, 'environs': [e['name'] for e in environments]}
                           for p in partitions],
        }],
        'environments': environments,
        'logging': LOGGING,
        'storage': STORAGE,
    }
