"""Shared base of the MLPerf HPC checks: a dataset fixture and a training check.

A benchmark adds only what is its own (see cosmoflow.py):

    class CosmoFlowData(MLPerfDataset):
        benchmark = 'cosmoflow'

    @rfm.simple_test
    class CosmoFlowCheck(MLPerfTraining):
        benchmark = 'cosmoflow'
        framework = parameter(['tensorflow', 'pytorch'])
        dataset = fixture(CosmoFlowData, scope='session')

The dataset fixture has session scope: it is generated once per ReFrame session and
shared by every variant of the check. A site with a real dataset runs with
`-S data_dir=/path/to/dataset`: `-S` without a test name sets the variable in the check
and in its fixture alike, and with it set the fixture generates nothing, it only checks
that the path holds the benchmark's folders (the fixture's `layout`: train/ and
validation/; OpenFold's, those of the reference's processed layout). (ReFrame fixtures cannot be made
conditional on a variable, so the fixture stays in the graph and turns into that check.)

Sabotage (a check that must FAIL): `-S CosmoFlowData.shuffle_labels=true` (or
`-S shuffle_labels=true`, which also works but warns that the check itself has no such
variable) generates the data with the targets permuted across samples; the training
cannot converge and the sanity check reports "not converged: ...".

Performance references are not kept here: every check reads them from the site
profile's references.yaml (`reference = {'$ref': ...}`, looked up under the
configuration's general/reference_prefix), keyed by check class, then
partition, config and framework.
"""

import json
import os
import re
import shlex

import reframe as rfm
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
from reframe.core.builtins import (performance_function, run_after, run_before,
                                   sanity_function, variable)
from reframe.core.exceptions import PerformanceError, SanityError

from profile_environment import ProfileEnvironment

REFERENCES_FILE = 'references.yaml'


@sn.deferrable
def load_json(path, writer):
    """A JSON file as a dict; a readable sanity error if `writer` did not write it."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise SanityError(f'{writer} wrote no {path} (see the job stderr)') from None
    except json.JSONDecodeError as e:
        raise SanityError(f'{path} is not valid JSON: {e}') from None


def hpckit_error(stderr_path, command='train'):
    """The one-line error `hpckit <command>` printed (the file or key at fault), or None."""
    try:
        with open(stderr_path, errors='replace') as f:
            found = re.findall(rf'^hpckit {command}: error: .*$', f.read(), re.M)
    except OSError:
        return None
    return found[-1] if found else None


@sn.deferrable
def assert_trained(exitcode, summary_path, stderr_path='rfm_job.err'):
    """The training ran to its end: exit code 0 (converged) or 3 (target missed: the
    convergence check says so), a summary, no error recorded in it. A failure names
    what hpckit named: the error recorded in summary.json, else its one stderr line."""
    error = None
    if os.path.isfile(summary_path):
        error = sn.evaluate(load_json(summary_path, 'hpckit train')).get('error')
    if exitcode not in (0, 3) or error:
        raise SanityError(f'hpckit train failed (exit code {exitcode}): '
                          f'{error or hpckit_error(stderr_path) or "see rfm_job.err"}')
    return True


@sn.deferrable
def assert_compliant(stdout, ruleset):
    """The `hpckit check` verdict: its NOT COMPLIANT line, with the reason, on failure."""
    verdicts = sn.evaluate(sn.extractall(r'^((?:NOT )?COMPLIANT: .*)$', stdout, 1))
    if not verdicts:
        raise SanityError('no verdict from hpckit check in the job stdout')
    if not verdicts[-1].startswith('COMPLIANT: ') or \
            f' passes the {ruleset} ruleset ' not in verdicts[-1]:
        raise SanityError(verdicts[-1])
    return True


@sn.deferrable
def assert_converged(summary, counted='epochs'):
    """Fail with 'not converged: final <metric> <value> > target <t> after <n> epochs'
    (`counted`: what summary.json's `epochs` counts, epoch_unit(benchmark))."""
    if summary.get('converged') is True:
        return True
    metric = summary.get('metric', 'quality')
    missed = '>' if 'error' in metric else '<'   # error: lower is better; accuracy: higher
    raise SanityError(f"not converged: final {metric} {summary.get('final_' + metric)} "
                      f"{missed} target {summary.get('target')} "
                      f"after {summary.get('epochs')} {counted}")


def epoch_unit(benchmark):
    """What a benchmark's runs count in summary.json's `epochs`: epochs, or the train/eval
    cycles of a benchmark whose descriptor says its logs count no epochs (OpenFold:
    hpckit.common.benchmark.Benchmark.no_epochs); 'epochs' where ReFrame's Python cannot
    import hpckit (a container profile's host)."""
    try:
        from hpckit.common.benchmark import descriptors
        return 'train/eval cycles' if descriptors()[benchmark].no_epochs else 'epochs'
    except (ImportError, KeyError):
        return 'epochs'


def recorded_stack(summary_path):
    """The software stack the run recorded (summary.json's provenance block, reduced by
    hpckit.common.provenance.stack), as one line of JSON for the perflog; '' when there is
    none or hpckit is not importable by ReFrame's Python."""
    try:
        from hpckit.common.provenance import stack
        with open(summary_path) as f:
            found = stack(json.load(f).get('provenance'))
    except (ImportError, OSError, ValueError, AttributeError):
        return ''
    return json.dumps(found, separators=(',', ':')).replace('|', '/') if found else ''


def stack_change(references_path, stack_json):
    """What differs between the stack the references were calibrated with (their header,
    written by `hpckit references calibrate`) and the one this run recorded: one line, or ''."""
    try:
        from hpckit.common.provenance import describe_change, parse_header
        with open(references_path) as f:
            calibrated = parse_header(f.read())
        return describe_change(calibrated, json.loads(stack_json)) if stack_json else ''
    except (ImportError, OSError, ValueError):
        return ''


def site_platform(system):
    """The system a run of this profile is made on, as its log's submission_platform: the
    profile's system.yaml `system_name` (site_profiles/<system>/system.yaml, what `hpckit
    package --site` names the system), else the ReFrame system's name; never the configs'
    `unknown`. A site's own `--set mlperf.platform=...` (the partition's overrides) wins."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, 'site_profiles', system,
                        'system.yaml')
    try:
        import yaml
        with open(path) as f:
            name = (yaml.safe_load(f) or {}).get('system_name')
    except Exception:   # no PyYAML in ReFrame's Python, no file, not YAML: the system's name
        name = None
    return str(name) if isinstance(name, (str, int)) and str(name).strip() else system


def site_dataset(partition, benchmark):
    """The partition's dataset path for `benchmark` (extras: data: {benchmark: path}), or ''."""
    return (partition.extras.get('data') or {}).get(benchmark, '')


class MLPerfDataset(rfm.RunOnlyRegressionTest, ProfileEnvironment):
    """Fixture: `hpckit datagen` writes a synthetic dataset into <stagedir>/data."""

    benchmark = variable(str)
    config = variable(str, value='mini')
    seed = variable(int, value=0)
    shuffle_labels = variable(typ.Bool, value=False)
    data_dir = variable(str, value='')   # an existing dataset: check it, generate nothing
    layout = variable(typ.List[str], value=['train', 'validation'])   # the folders it must hold
    executable = 'hpckit'

    @run_after('setup')
    def use_site_dataset(self):
        """A reference-size run reads the dataset where the partition says it lives."""
        if not self.data_dir and self.config != 'mini':
            self.data_dir = site_dataset(self.current_partition, self.benchmark)

    @property
    def path(self):
        return self.data_dir or os.path.join(self.stagedir, 'data')

    @run_before('run')
    def set_command(self):
        if self.data_dir:
            self.executable = 'ls'
            self.executable_opts = ['-d', *(os.path.join(self.data_dir, d) for d in self.layout)]
        else:
            self.executable_opts = ['datagen', self.benchmark, '--config', self.config,
                                    '--out', 'data', '--seed', str(self.seed)]
            if self.shuffle_labels:
                self.executable_opts.append('--shuffle-labels')
        # the exit code in the output: schedulers polled with squeue do not report it
        self.postrun_cmds = ['echo "dataset step exit code: $?"']

    @property
    def exitcode(self):
        return sn.extractsingle(r'^dataset step exit code: (\d+)$', self.stdout, 1, int)

    @sanity_function
    def validate(self):
        if self.data_dir:
            return sn.assert_eq(self.exitcode, 0, msg=f'dataset {self.data_dir} has not all of the '
                                f'directories {", ".join(d + "/" for d in self.layout)}')
        manifest = load_json('data/manifest.json', 'hpckit datagen')
        return sn.all([
            sn.assert_eq(self.exitcode, 0,
                         msg=f'hpckit datagen {self.benchmark} exited with code {{0}}'),
            sn.assert_eq(manifest['shuffled_labels'], self.shuffle_labels,
                         msg='manifest.json: shuffled_labels is {0}, expected {1}'),
        ])


class MLPerfTraining(rfm.RunOnlyRegressionTest, ProfileEnvironment, special=True):
    """Train one benchmark to its quality target, check the log's compliance, time it.

    A subclass sets `benchmark`, a `framework` parameter and a `dataset` fixture.

    `special=True` (ReFrame's documented way to extend a pipeline stage): check_performance
    adds to a performance FAIL what differs between the software stack the references
    were calibrated with and the one this run recorded (hpckit.common.provenance).
    """

    benchmark = variable(str)
    config = variable(str, value='mini')
    ruleset = variable(str, value='')      # '': 'mini' for the mini config, else hpc-3.0.0
    seed = variable(int, value=0)
    data_dir = variable(str, value='')     # '': train on the dataset fixture's data
    stage_dir = variable(str, value='')    # node-local staging; '': <stagedir>/staged
    overrides = variable(typ.List[str], value=[])   # `--set key=value` for hpckit train
    # `hpckit train --checkpoint FILE`, the parameters to start from: the closed full-size run
    # of a benchmark whose reference starts from a checkpoint (OpenFold's); '': none
    checkpoint = variable(str, value='')
    # intra-op threads per rank by config, where the config's model is too small to share
    # among the rank's cores (OpenFold's mini); a config without one: the partition's
    # `threads`, else the kit's core plan (every core of the rank)
    threads = variable(typ.Dict[str, int], value={})
    # what summary.json's `epochs` counts (epoch_unit: epochs, or a benchmark's train/eval
    # cycles): the `epochs` figure's unit and a not-converged FAIL's word
    epoch_unit = variable(str, value='epochs')
    # a regression check trains deterministically (same seed, same curve and epochs: time
    # to train measures the system, not the training's luck); a campaign does not
    deterministic = variable(typ.Bool, value=True)
    # the software stack this run recorded (summary.json provenance, one line of JSON), set
    # after the run; logged in the perflog (site_common.PERFLOG_FORMAT) for calibration
    stack = variable(str, value='')

    valid_systems = ['+mlperf']
    valid_prog_environs = ['+hpckit']
    num_tasks = 1            # set from the partition's extras (ranks, ranks_per_node)
    local_batch_size = variable(int, value=0)   # 0: the config's (or the partition's local_batch_size)
    executable = 'hpckit'
    keep_files = ['out/mlperf.log', 'out/summary.json']
    reference = {'$ref': REFERENCES_FILE}
    # read by the performance functions: a missing one must fail, not be skipped
    summary_keys = ('time_to_train_s', 'staging_s', 'train_samples_per_s',
                    'eval_samples_per_s', 'epochs')

    @run_after('init')
    def add_tags(self):
        # a campaign (`reframe --repeat N`, the 10 CosmoFlow / 5 DeepCAM runs of a
        # submission): repetition i trains with seed + i, in its own stage directory
        self.seed += getattr(self, '.repeat_no', 0)
        if hasattr(self, '.repeat_no'):
            self.deterministic = False   # the MLPerf campaign runs the kernels a submission would
        self.tags |= {'mlperf', self.benchmark}
        self.ruleset = self.ruleset or ('mini' if self.config == 'mini' else 'hpc-3.0.0')

    @run_after('init')
    def count_as_the_benchmark_does(self):
        self.epoch_unit = epoch_unit(self.benchmark)
        self.perf_variables['epochs'] = sn.make_performance_function(self.summary['epochs'], self.epoch_unit)

    @run_after('setup')
    def set_ranks(self):
        """Ranks per run, ranks per node, node-local staging and the local batch (to keep
        the global batch of a 1-rank run) come from the partition's extras."""
        extras = self.current_partition.extras
        self.num_tasks = int(extras.get('ranks', 1))
        if 'ranks_per_node' in extras:
            self.num_tasks_per_node = int(extras['ranks_per_node'])
        self.local_batch_size = self.local_batch_size or int(extras.get('local_batch_size', 0))
        # a site's `--set key=value` for one benchmark (e.g. a validation set cut to a
        # multiple of the rank count), after the check's own
        self.overrides = [*self.overrides, *extras.get('overrides', {}).get(self.benchmark, [])]
        if not self.stage_dir and extras.get('stage_dir'):
            # node-local scratch, one directory per test so concurrent checks do not collide
            self.stage_dir = os.path.join(extras['stage_dir'], self.unique_name)
        if not self.data_dir and self.config != 'mini':
            self.data_dir = site_dataset(self.current_partition, self.benchmark)

    @run_before('run')
    def set_command(self):
        if not self.data_dir and self.dataset.config != self.config:
            raise ValueError(f'the dataset fixture was generated for config '
                             f'{self.dataset.config!r}, the training uses {self.config!r}: '
                             f'set both with -S config=...')
        self.executable_opts = [
            'train', self.benchmark, '--data', self.data_dir or self.dataset.path,
            '--config', self.config, '--framework', self.framework,
            '--output-dir', 'out', *(['--deterministic'] if self.deterministic else []),
            '--stage-dir', self.stage_dir or 'staged', '--seed', str(self.seed),
            '--set', shlex.quote(f'mlperf.platform={site_platform(self.current_system.name)}'),
            *(['--checkpoint', self.checkpoint] if self.checkpoint else [])]
        if self.local_batch_size:
            self.executable_opts += ['--set', f'data.batch_size={self.local_batch_size}']
        # intra-op threads per rank: the check's for its config (a model too small to share), else
        # the partition's (where the kit's core plan cannot see the sharing), else the plan's
        threads = self.threads.get(self.config) or self.current_partition.extras.get('threads')
        if threads:
            self.executable_opts += ['--threads', str(threads)]
        for o in self.overrides:
            self.executable_opts += ['--set', o]
        check = f'hpckit check out/mlperf.log --ruleset {self.ruleset}'
        if self.ruleset == 'mini':
            check += f' --config {self.config}'
        self.postrun_cmds = ['echo "hpckit train exit code: $?"', check]

    @property
    def summary(self):
        return load_json('out/summary.json', 'hpckit train')

    @sanity_function
    def validate(self):
        exitcode = sn.extractsingle(r'^hpckit train exit code: (\d+)$', self.stdout, 1, int)
        return sn.all([
            assert_trained(exitcode, 'out/summary.json'),
            assert_converged(self.summary, self.epoch_unit),
            assert_compliant(self.stdout, self.ruleset),
            sn.assert_eq(self.summary['status'], 'success', msg='summary status {0!r}'),
            *(sn.assert_in(key, self.summary, msg='summary.json has no {0!r}')
              for key in self.summary_keys),
        ])

    @run_before('performance')
    def record_stack(self):
        self.stack = recorded_stack(os.path.join(self.stagedir, 'out', 'summary.json'))

    @run_before('performance')
    def measured_where_measurable(self):
        # figures only some runs have: the GPU's busy share on CUDA, the energy where NVML or
        # RAPL is readable; a run without one has no such variable (absent, not 0)
        try:
            with open(os.path.join(self.stagedir, 'out', 'summary.json')) as f:
                usage = json.load(f).get('usage') or {}
        except (OSError, ValueError, AttributeError):   # sanity has said what is wrong with it
            return
        for name, key, unit, scale in (('gpu_busy', 'gpu_busy_share', '%', 100), ('gpu_energy', 'gpu_energy_j', 'kJ', 1e-3),
                                       ('gpu_power', 'gpu_power_w', 'W', 1), ('cpu_energy', 'cpu_energy_j', 'kJ', 1e-3),
                                       ('cpu_power', 'cpu_power_w', 'W', 1)):
            if usage.get(key) is not None:
                self.perf_variables[name] = sn.make_performance_function(
                    lambda value=usage[key] * scale: value, unit)

    def references_path(self):
        from reframe.core.runtime import runtime
        prefix = runtime().get_option('general/0/reference_prefix') or self.prefix
        return os.path.join(prefix, REFERENCES_FILE)

    def check_performance(self):
        try:
            super().check_performance()
        except PerformanceError as e:
            change = stack_change(self.references_path(), self.stack)
            if not change:
                raise
            raise PerformanceError(f'{e}\n      {change}') from None

    @performance_function('min')
    def time_to_train(self):
        return self.summary['time_to_train_s'] / 60

    @performance_function('s')
    def staging_time(self):
        return self.summary['staging_s']

    @performance_function('samples/s')
    def train_throughput(self):
        return self.summary['train_samples_per_s']

    @performance_function('samples/s')
    def eval_throughput(self):
        return self.summary['eval_samples_per_s']

    # What the run used, measured by the run (summary.json's usage block; 0 where not measured)
    @performance_function('MiB')
    def peak_memory(self):
        return (self.summary['usage']['peak_rss_bytes_max'] or 0) / 2 ** 20

    @performance_function('MB/s')
    def staging_read_bandwidth(self):
        return self.summary['usage']['staging_read_MBps'] or 0.0

    @performance_function('%')
    def allreduce_share(self):
        return 100 * (self.summary['usage']['grad_allreduce_share'] or 0)

    @performance_function('%')
    def cpu_wait(self):
        # of the time the ranks' threads wanted a CPU while training, the share they waited:
        # near 0 on a node the run has to itself (hpckit/common/usage.py)
        return 100 * (self.summary['usage']['cpu_wait_share'] or 0)

    @performance_function('%')
    def input_wait(self):
        # of the training epochs' time, the share the training loop waited for its next batch
        # (less a GPU holding its buffers: hpckit/common/usage.py LoopClock); a site may bound
        # it in its references (docs/data-path.md)
        return 100 * (self.summary['usage']['input_wait_share'] or 0)

    @performance_function('MB')
    def epoch_read(self):
        return (self.summary['usage']['train_read_bytes_per_epoch'] or 0) / 1e6

    @performance_function('GFLOP/s')
    def flops_per_rank(self):
        # the network's training FLOPs per sample x samples/s, per rank (hpckit/common/flops.py)
        return (self.summary['usage']['train_flops_per_s_per_rank'] or 0) / 1e9

@sn.deferrable
def assert_campaign(instances, stdout, ruleset, counted='epochs'):
    """Every instance of the campaign trained, converged and is compliant; a FAIL names
    the first instance that is not."""
    for i in range(instances):
        summary = sn.evaluate(load_json(f'out/instance_{i}/summary.json', f'instance {i}'))
        if summary.get('error'):
            raise SanityError(f"instance {i}: {summary['error']}")
        try:
            sn.evaluate(assert_converged(summary, counted))
        except SanityError as e:
            raise SanityError(f'instance {i}: {e}') from None
    verdicts = sn.evaluate(sn.extractall(r'^((?:NOT )?COMPLIANT: .*)$', stdout, 1))
    bad = [v for v in verdicts if not v.startswith('COMPLIANT: ') or f' passes the {ruleset} ruleset ' not in v]
    if len(verdicts) != instances or bad:
        raise SanityError(bad[0] if bad else f'{len(verdicts)} compliance verdicts for {instances} instances')
    return True


class MLPerfCampaign(rfm.RunOnlyRegressionTest, ProfileEnvironment, special=True):
    """A throughput (weak-scaling) campaign: `instances` model instances of
    `instance_ranks` ranks each, trained concurrently in one launch of M x S ranks
    (`hpckit train --instances M`), scored as the official summarizer scores a weak set
    (`hpckit score`: number of models, time_to_train_all, instance scale).

    A subclass sets `benchmark`, `framework`, the parameters `instances` and
    `instance_ranks`, and a `dataset` fixture. Opt-in: no partition has the `campaign`
    feature unless a site adds it; on the local profile

        reframe -C site_profiles/local/settings.py -c reframe_checks/campaign.py -r \\
            --system local:mpi -S valid_systems=local:mpi
    """

    benchmark = variable(str)
    config = variable(str, value='mini')
    seed = variable(int, value=0)          # instance i trains with seed + i
    overrides = variable(typ.List[str], value=[])
    stage_dir = variable(str, value='')    # node-local staging (the partition's stage_dir); '': <stagedir>/staged
    threads = variable(int, value=0)       # --threads per rank (the partition's `threads`); 0: the kit's plan
    valid_systems = ['+campaign']
    valid_prog_environs = ['+hpckit']
    executable = 'hpckit'
    keep_files = ['out']
    reference = {'$ref': REFERENCES_FILE}

    @run_after('init')
    def add_tags(self):
        self.tags |= {'mlperf', 'campaign', self.benchmark}

    @run_after('setup')
    def set_ranks(self):
        self.num_tasks = self.instances * self.instance_ranks
        extras = self.current_partition.extras
        if 'ranks_per_node' in extras:
            self.num_tasks_per_node = int(extras['ranks_per_node'])
        self.overrides = [*self.overrides, *extras.get('overrides', {}).get(self.benchmark, [])]
        # as a training check: node-local staging and the threads per rank of the partition
        self.stage_dir = os.path.join(extras['stage_dir'], self.unique_name) if extras.get('stage_dir') else 'staged'
        self.threads = int(extras.get('threads', 0))

    @run_before('run')
    def set_command(self):
        if self.current_partition.launcher_type.registered_name == 'mpirun':
            self.job.launcher.options += ['--oversubscribe']   # M x S ranks may exceed the cores
        self.executable_opts = [
            'train', self.benchmark, '--data', self.dataset.path, '--config', self.config,
            '--framework', self.framework, '--output-dir', 'out', '--seed', str(self.seed),
            '--instances', str(self.instances), '--stage-dir', self.stage_dir,
            '--set', shlex.quote(f'mlperf.platform={site_platform(self.current_system.name)}'),
            *(['--threads', str(self.threads)] if self.threads else []),
            *(x for o in self.overrides for x in ('--set', o))]
        ruleset = 'mini' if self.config == 'mini' else 'hpc-3.0.0'
        self.postrun_cmds = [
            'echo "hpckit train exit code: $?"',
            f'for i in $(seq 0 {self.instances - 1}); do hpckit check out/instance_$i/mlperf.log '
            f'--ruleset {ruleset} --config {self.config}; done',
            'hpckit score out --json out/score.json']

    @sanity_function
    def validate(self):
        return assert_campaign(self.instances, self.stdout, 'mini' if self.config == 'mini' else 'hpc-3.0.0',
                               epoch_unit(self.benchmark))

    @property
    def score(self):
        return load_json('out/score.json', 'hpckit score')['sets'][0]['score']

    @performance_function('models')
    def number_of_models(self):
        return self.score['number_of_models']

    @performance_function('min')
    def time_to_train_all(self):
        return self.score['time_to_train_all_min']

    @performance_function('units')
    def instance_scale(self):
        return self.score['instance_scale']
