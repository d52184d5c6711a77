"""Run a check natively in the profile's Spack environment or inside its container.

The choice is the site profile's, made by the programming environment a check runs in
(`-p spack`, `-p apptainer`, `-p sarus`); the checks themselves only build the hpckit
command line. The environments say what they are through their `extras`:

    'spack':     {'spack_env': '<folder holding spack.yaml>'}
    'apptainer': {'container_platform': 'Apptainer', 'container_image': '<path>.sif'}
    'sarus':     {'container_platform': 'Sarus', 'container_image': '<image reference>'}

An environment without these keys (the local profile's `hpckit-venv`) changes nothing.

Spack: the job script sources `$SPACK_ROOT/share/spack/setup-env.sh` unless `spack` is
already a shell function, then runs `spack env activate -d <folder>`.

Containers: the test's command (executable + options) becomes the container's command;
the stage directory is mounted at /rfm_workdir (the working directory inside), every
absolute path the command names (a dataset, a node-local staging folder) is mounted at
the same path, `hpckit` commands among the pre/post-run commands (`hpckit check`) run in
the same image, and on a partition with GPU devices Apptainer gets `--nv` (Sarus enables
GPUs through its hook by itself). A training on a GPU partition asks for the partition's
GPUs per node unless the check asked for some already.
"""

import os
import shlex

import reframe as rfm
from reframe.core.builtins import run_before
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

    def _platform(self, name, image, command, mounts, gpus):
        platform = ContainerPlatform.create(name)
        platform.image = image
        platform.command = command
        platform.mount_points = [(p, p) for p in mounts]
        if gpus and hasattr(platform, 'with_cuda'):
            platform.with_cuda = True
        if hasattr(platform, 'with_mpi') and (self.num_tasks or 1) > 1:
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
                                                 _bind_paths(args), gpus)

        def wrap(cmd):
            """An `hpckit ...` shell command runs in the same image (one process)."""
            if not cmd.startswith('hpckit '):
                return cmd
            words = shlex.split(cmd)
            # a copy: launch_command appends the stage dir to its mount points
            return self._platform(name, image, cmd, _bind_paths(words),
                                  False).launch_command(self.stagedir)

        self.prerun_cmds = [wrap(c) for c in self.prerun_cmds]
        # a bind mount needs its source: create the folders the command writes into
        # (node-local staging on other nodes of a multi-node job must exist there)
        made = [v for flag, v in zip(args, args[1:])
                if flag in WRITES and v.startswith(('/', '$'))]
        if made:
            self.prerun_cmds.append('mkdir -p ' + ' '.join(f'"{v}"' for v in made))
        self.postrun_cmds = [wrap(c) for c in self.postrun_cmds]
