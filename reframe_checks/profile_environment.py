"""Run a check natively in the profile's Spack environment or inside its container.

The choice is the site profile's, made by the programming environment a check runs in
(`-p spack`, `-p apptainer`, `-p sarus`, `-p podman-hpc`, `-p charliecloud`, `-p pyxis`);
the checks themselves only build the hpckit command line. The environments say what they
are through their `extras`:

    'spack':        {'spack_env': '<folder holding spack.yaml>'}
    'apptainer':    {'container_platform': 'Apptainer', 'container_image': '<path>.sif'}
    'sarus':        {'container_platform': 'Sarus', 'container_image': '<image reference>'}
    'podman-hpc':   {'container_platform': 'PodmanHPC', 'container_image': '<image reference>'}
    'charliecloud': {'container_platform': 'Charliecloud', 'container_image': '<image directory>'}
    'pyxis':        {'container_platform': 'Pyxis', 'container_image': '<enroot image>'}

An environment without these keys (the local profile's `hpckit-venv`) changes nothing.

Spack: the job script sources `$SPACK_ROOT/share/spack/setup-env.sh` unless `spack` is
already a shell function, then runs `spack env activate -d <folder>`.

Containers: the test's command (executable + options) becomes the container's command;
the stage directory is mounted at /rfm_workdir (the working directory inside), every
absolute path the command names (a dataset, a node-local staging folder) is mounted at
the same path, `hpckit` commands among the pre/post-run commands (`hpckit check`) run in
the same image, and on a partition with GPU devices Apptainer gets `--nv` (Sarus enables
GPUs through its hook by itself). A training on a GPU partition asks for the partition's
GPUs per node unless the check asked for some already. Inside, HPCKIT_CONTAINER_RUNTIME
and HPCKIT_CONTAINER_IMAGE say which runtime and image the launch line used (the run's
provenance records them).

ReFrame has platforms for Apptainer and Sarus; for the other three the launch line is
written here (`KitPlatform`, one class each, a few fields):

    podman-hpc    podman-hpc run --rm -e ... -v "src":"dst" -w /rfm_workdir [--gpu] [--mpi] IMAGE cmd
                  (NERSC's wrapper: the image comes from its squashfs store, `podman-hpc
                  migrate`; --gpu and --mpi are its site modules, on GPU partitions and
                  for runs of several ranks)
    charliecloud  ch-run --set-env --private-tmp -b "src":"dst" -c /rfm_workdir IMAGE -- cmd
                  (the image a directory, read-only: the bind targets are made in it first)
    pyxis         srun ... --container-image=IMAGE --container-mounts=src:dst,...
                  --container-workdir=/rfm_workdir cmd  (options of the job's srun: the
                  partition's launcher must be srun; `hpckit check` gets its own srun -n 1)
"""

import os
import shlex

import reframe as rfm
import reframe.utility.typecheck as typ
from reframe.core.builtins import run_after, run_before, variable
from reframe.core.containers import ContainerPlatform

WRITES = ('--stage-dir', '--output-dir', '--out')
SPACK_SETUP = ('if [ "$(type -t spack)" != function ] && [ -n "${SPACK_ROOT:-}" ]; then '
               '. "$SPACK_ROOT/share/spack/setup-env.sh"; fi')


def spack_activation(env_dir):
    """The job-script lines that activate the Spack environment in `env_dir`."""
    return [SPACK_SETUP, f'spack env activate -d {shlex.quote(env_dir)}']


def _bind_paths(args):
    """Absolute paths named by a command line (also `$VAR/...`, expanded by the job's
    shell inside the double quotes ReFrame writes around mounts), without nested ones."""
    paths = []
    for arg in args:
        value = arg.split('=', 1)[1] if arg.startswith('--') and '=' in arg else arg
        if value.startswith('/') and value != '/':
            paths.append(os.path.normpath(value))
        elif value.startswith('$') and '/' in value:   # $PJM_LOCALTMP/..., left to the shell
            paths.append(value.rstrip('/'))
    kept = []
    for p in sorted(set(paths)):
        if not any(p == k or p.startswith(k + '/') for k in kept):
            kept.append(p)
    return kept


class KitPlatform(ContainerPlatform):
    """A runtime ReFrame has no platform for: its launch line from the fields below."""
    with_cuda = variable(typ.Bool, value=False)
    with_mpi = variable(typ.Bool, value=False)
    run = ''           # the command and its fixed options
    env = ''           # passes the host variable {name}, or ''
    mount = ''         # one bind mount of {src} at {dst}
    cd = ''            # the working directory {dir}
    gpu = mpi = ''     # the runtime's options for GPUs / several ranks, where it has them
    image_arg = '{image}'
    then = ''          # between the image and the command
    standalone = ''    # before the launch line of a command outside the job's launcher

    def emit_prepare_commands(self, stagedir):
        return []

    def mounts(self, stagedir):
        return [*self.mount_points, (stagedir, self.mount_stagedir)]

    def run_options(self, stagedir):
        return ([self.env.format(name=n) for n in DECLARED if self.env]
                + [self.mount.format(src=s, dst=d) for s, d in self.mounts(stagedir)]
                + [self.cd.format(dir=self.workdir)]
                + [self.gpu] * bool(self.with_cuda and self.gpu)
                + [self.mpi] * bool(self.with_mpi and self.mpi))

    def launch_command(self, stagedir):
        return ' '.join(w for w in (self.run, *self.run_options(stagedir), *self.options,
                                    self.image_arg.format(image=self.image), self.then,
                                    self.command) if w)


class PodmanHPC(KitPlatform):
    run = 'podman-hpc run --rm'
    env = '-e {name}'
    mount = '-v "{src}":"{dst}"'
    cd = '-w {dir}'
    gpu, mpi = '--gpu', '--mpi'


class Charliecloud(KitPlatform):
    # --set-env: the image's ENV (its PATH), the host's environment passes; --private-tmp:
    # a tmpfs at /tmp (else /tmp is the host's $TMPDIR, where a bind target may be missing)
    run = 'ch-run --set-env --private-tmp'
    mount = '-b "{src}":"{dst}"'
    cd = '-c {dir}'
    then = '--'

    def emit_prepare_commands(self, stagedir):
        # ch-run binds only onto folders the read-only image has (under /tmp it makes them
        # in its tmpfs): make the others in the image directory
        made = [d for _, d in self.mounts(stagedir) if not d.startswith('/tmp/')]
        return ['mkdir -p ' + ' '.join(f'"{self.image}{d}"' for d in made)] if made else []


class Pyxis(KitPlatform):
    image_arg = '--container-image={image}'
    cd = '--container-workdir={dir}'
    standalone = 'srun --ntasks=1'

    def run_options(self, stagedir):      # one option, the mounts comma-separated
        return ['--container-mounts=' + ','.join(f'"{s}":"{d}"' for s, d in self.mounts(stagedir)),
                self.cd.format(dir=self.workdir)]


KIT_PLATFORMS = {p.__name__: p for p in (PodmanHPC, Charliecloud, Pyxis)}
# what the launch line declares inside (hpckit.common.provenance.container)
DECLARED = ('HPCKIT_CONTAINER_RUNTIME', 'HPCKIT_CONTAINER_IMAGE')


class ProfileEnvironment(rfm.RegressionTestPlugin):
    @run_before('run', always_last=True)
    def use_profile_environment(self):
        extras = self.current_environ.extras
        gpus = self._gpus_per_node()
        if gpus and self._is_training():
            self._request_gpus(gpus)
        if extras.get('spack_env'):
            self.prerun_cmds = spack_activation(extras['spack_env']) + list(self.prerun_cmds)
        if extras.get('container_platform'):
            self._run_in_container(extras['container_platform'], extras.get('container_image'))

    def _is_training(self):
        return self.executable == 'hpckit' and self.executable_opts[:1] == ['train']

    def _gpus_per_node(self):
        return sum(d.num_devices for d in self.current_partition.select_devices('gpu'))

    def _request_gpus(self, num):
        if self.num_gpus_per_node or any('gpu' in name for name in self.extra_resources):
            return
        self.num_gpus_per_node = num
        if (not self.current_partition.get_resource('_rfm_gpu', num_gpus_per_node=num)
                and self.current_partition.get_resource('gpu', num_gpus_per_node=num)):
            # the profile names its GPU resource 'gpu' (e.g. --gpus-per-node=...)
            self.extra_resources = {**self.extra_resources,
                                    'gpu': {'num_gpus_per_node': num}}

    def _platform(self, name, image, command, mounts, gpus, ranks=1):
        platform = KIT_PLATFORMS[name]() if name in KIT_PLATFORMS else ContainerPlatform.create(name)
        platform.image = image
        platform.command = command
        platform.mount_points = [(p, p) for p in mounts]
        if gpus and hasattr(platform, 'with_cuda'):
            platform.with_cuda = True
        if hasattr(platform, 'with_mpi') and ranks > 1:
            platform.with_mpi = True
        return platform

    def _run_in_container(self, name, image):
        if not image:
            raise ValueError(f'environment {self.current_environ.name!r} names the '
                             f'container platform {name} but no container_image')
        args = [self.executable, *self.executable_opts]
        gpus = self._gpus_per_node() and self._is_training()
        # joined as ReFrame joins them natively: the options are already shell words
        self.container_platform = self._platform(name, image, ' '.join(args),
                                                 _bind_paths(args), gpus, self.num_tasks or 1)
        self.env_vars = {**self.env_vars, DECLARED[0]: self.current_environ.name,
                         DECLARED[1]: image}

        def wrap(cmd):
            """An `hpckit ...` shell command runs in the same image (one process: no MPI)."""
            if not cmd.startswith('hpckit '):
                return cmd
            words = shlex.split(cmd)
            # a copy: launch_command appends the stage dir to its mount points
            platform = self._platform(name, image, cmd, _bind_paths(words), False)
            line = platform.launch_command(self.stagedir)
            return f'{platform.standalone} {line}' if getattr(platform, 'standalone', '') else line

        self.prerun_cmds = [wrap(c) for c in self.prerun_cmds]
        # a bind mount needs its source: create the folders the command writes into
        # (node-local staging on other nodes of a multi-node job must exist there)
        made = [v for flag, v in zip(args, args[1:])
                if flag in WRITES and v.startswith(('/', '$'))]
        if made:
            self.prerun_cmds.append('mkdir -p ' + ' '.join(f'"{v}"' for v in made))
        self.postrun_cmds = [wrap(c) for c in self.postrun_cmds]
