# Two commands for a new user:
#   make run    set up .venv (first time) and run the ReFrame checks on the local profile
#   make test   run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hpckit-stack
PIP    := $(BIN)/pip install --quiet --disable-pip-version-check
CONSTRAINTS := -c requirements/constraints-cpu.txt

.PHONY: run test venv calibrate compare

# The targets' numeric arguments are checked as make reads this file: a bad one is ONE line
# (make's own "Makefile:N: *** ...  Stop.", exit 2) before anything is built or run; the
# scripts then check ranges themselves, in one line too. $(call count,NAME,LOW): NAME's value
# is a whole number of 1 to 9 digits, at least LOW (0 or 1); decimal: digits with one point.
digits_of = $(strip $(subst 0, 0 ,$(subst 1, 1 ,$(subst 2, 2 ,$(subst 3, 3 ,$(subst 4, 4 ,$(subst 5, 5 ,$(subst \
              6, 6 ,$(subst 7, 7 ,$(subst 8, 8 ,$(subst 9, 9 ,$(1))))))))))))
not_digits = $(strip $(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst \
               7,,$(subst 8,,$(subst 9,,$(1))))))))))))
count = $(if $(or $(filter-out 1,$(words $($(1)))),$(call not_digits,$($(1))),$(word 10,$(call digits_of,$($(1)))),$\
          $(if $(filter 1,$(2)),$(if $(subst 0,,$($(1))),,zero))),$\
          $(error $(1)=$($(1)): not a whole number$(if $(filter 1,$(2)), >= 1) of at most 9 digits))
decimal = $(if $(or $(filter-out 1,$(words $($(1)))),$(filter-out .,$(call not_digits,$($(1)))),$\
            $(if $(subst .,,$($(1))),,none)),$\
            $(error $(1)=$($(1)): not a decimal number such as 0.2))
run: $(STAMP)
	$(BIN)/reframe -C site_profiles/local/settings.py -c reframe_checks/ -r

# Performance references for THIS machine (docs/acceptance.md "Calibrating"): RUNS unjudged runs of the
# profile's checks into their own perflog folder, then hpckit references calibrate writes
# site_profiles/$(PROFILE)/calibrated/<machine key>/references.yaml (REPLACE=1 to redo).
PROFILE     ?= local
RUNS        ?= 3
# Smallest tolerance: 0.20 for the local profiles, whose machines are shared (a 2-core VM
# drifted 10-15 % between calibration and reruns minutes later: bench/README.md
# "acceptance_power.py"); a dedicated node can take FLOOR=0.10, hpckit's own default.
FLOOR       ?= 0.20
CALIBRATION := calibration/$(PROFILE)-$(shell date +%Y%m%dT%H%M%S)
ifneq ($(filter calibrate,$(MAKECMDGOALS)),)
$(call count,RUNS,1)
$(call decimal,FLOOR)
endif
calibrate: $(STAMP)
	for i in $$(seq $(RUNS)); do \
	    RFM_REFERENCE_PREFIX="$(CURDIR)/site_profiles/$(PROFILE)" $(BIN)/reframe -C site_profiles/$(PROFILE)/settings.py \
	        -c reframe_checks/ -r --perflogdir "$(CALIBRATION)/perflogs" || exit 1; \
	done
	key=$$($(BIN)/python -c 'from hpckit.common.cores import machine_key; print(machine_key())') && \
	mkdir -p "site_profiles/$(PROFILE)/calibrated/$$key" && \
	$(BIN)/hpckit references calibrate --perflog "$(CALIBRATION)/perflogs" --floor $(FLOOR) $(if $(REPLACE),--replace) \
	    --out "site_profiles/$(PROFILE)/calibrated/$$key/references.yaml"

# The change of every performance variable, by ReFrame's own --performance-compare over its
# results database (every `make run` is stored in ~/.reframe/reports/results.db): the last
# hour's runs against the 30 days before, medians; pdiff = (new - old) / old. COMPARE takes
# any ReFrame spec, e.g. NEW_UUID/OLD_UUID/median:/ with UUIDs from
# `reframe -C site_profiles/local/settings.py --list-stored-sessions`.
COMPARE ?= now-1h:now/now-30d:now-1h/median:/
compare: $(STAMP)
	$(BIN)/reframe -C site_profiles/$(PROFILE)/settings.py --performance-compare='$(COMPARE)'

# `make test`: the tests a change needs before it is shared, in minutes (at most 15 on a 2-core
# machine): every unit, reader and checker test, and `make run`'s ReFrame run, which trains every
# benchmark to its target and checks its log with the official checker. `make test-all`: the
# whole suite, CI's (.ci/run): the tests marked slow too (trainings per bad input and per
# signal, multi-rank, Slurm, containers, emulated arm64, the bench scripts' smoke runs).
# PYTEST_ARGS: more pytest options, e.g. PYTEST_ARGS=--junitxml=build/junit.xml for per-test times.
PYTEST_ARGS ?=
.PHONY: test-all
test: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" --durations=20 $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest tests --durations=30 $(PYTEST_ARGS)

# Tests that could fail by chance, run again and again under a competing CPU load (LOAD
# spinning processes, default one per usable core), each repetition a fresh pytest session;
# reports every test that failed even once, its output kept under STRESS_OUT
# (tests/stress/stress.py). Repetitions accumulate in STRESS_OUT: a long campaign runs in
# chunks, `make stress REPS=3 STRESS_OUT=build/stress/mine` again and again, each ending with
# the report over all of them. The default TESTS: the multi-process, Slurm and signal tests;
# the container tests (minutes per repetition) by name, with one spinner:
# `make stress TESTS=tests/test_containers.py LOAD=1`. Their image builds run at nice 19 in
# the time the tests leave idle (tests/background.py); a spinner on every core leaves them
# about 1.5 % of a core (hours per repetition), one leaves a core, as CI's tests do (1.1 busy).
# Their trainings take one thread each (HPCKIT_OMP_NUM_THREADS, default 1 there): a
# container's cgroup competes as one group, and with 2 threads it stalls (docs/scaling.md).
REPS       ?= 20
LOAD       ?=
STRESS_OUT ?= build/stress/$(shell date +%Y%m%dT%H%M%S)
TESTS      ?= tests/test_bn_stats.py tests/test_replica_check.py \
              tests/test_deepcam_model.py::test_batchnorm_group_size_one_process \
              tests/test_deepcam_model.py::test_batchnorm_synchronised_over_two_ranks \
              tests/test_cores.py tests/test_signals.py tests/test_data_safety.py \
              tests/test_compliance.py::test_the_checker_dies_with_hpckit_check \
              tests/test_multirank.py tests/test_campaign.py tests/test_slurm.py tests/test_multinode.py
.PHONY: stress
ifneq ($(filter stress,$(MAKECMDGOALS)),)
$(call count,REPS,1)
$(if $(LOAD),$(call count,LOAD,0))
endif
stress: $(STAMP)
	$(BIN)/python tests/stress/stress.py --reps $(REPS) $(if $(LOAD),--load $(LOAD)) --out $(STRESS_OUT) $(TESTS)

# The results commands on thousands of damaged copies of real inputs (bench/mutation.py,
# issue 34): CASES mutations from seed SEED; prints the count and every violation (exit 0,
# 2 or a verdict's 1; at most two stderr lines; no traceback, hang, changed input or partial
# output). MUTATE_RUNS: kit run directories to mutate (default: two tiny DeepCAM runs made first).
CASES ?= 3000
SEED  ?= 1
ifneq ($(filter mutate fuzz,$(MAKECMDGOALS)),)
$(call count,CASES,1)
$(call count,SEED,0)
endif
.PHONY: mutate
mutate: $(STAMP)
	$(BIN)/python bench/mutation.py --cases $(CASES) --seed $(SEED) $(if $(MUTATE_RUNS),--runs $(MUTATE_RUNS))

# The kit's readers on damaged copies of valid files of every format they read (tests/fuzz.py,
# issue 41): CosmoFlow TFRecord (GZIP, plain) and npy, DeepCAM HDF5, OC20 LMDB, MLPerf logs,
# summary.json, perflogs and configs, each file cut, flipped, its length fields at extremes, its
# values retyped, or code planted in its pickles; CASES cases from seed SEED. Prints the cases and
# outcomes per format and every finding (a traceback, a signal, a hang, more than one line, code
# run) with its seed and case number; exit 1 if there is one. CI runs 1,200
# (tests/test_fuzz.py).
.PHONY: fuzz
fuzz: $(STAMP)
	nice $(BIN)/python tests/fuzz.py --cases $(CASES) --seed $(SEED)

# The GPU path proven on a lent NVIDIA node (bench/gpu_check.py, issue 32), one table: the
# local profile's ReFrame checks on the GPU, mini trainings with and without --deterministic,
# torchrun + NCCL with one rank, the full-size step against the reference's (REFERENCE: your
# own clone of mlcommons/hpc) in fp32, bf16, fp16, channels_last and a CUDA graph with peak
# GPU memory, and samples/s from files. It runs with the node's python3 and PyTorch, not
# .venv: for a node without PyPI, `make gpu-wheels` here puts the kit's other dependencies
# (requirements/gpu-wheels.txt, for GPU_PY) in .whl/; there `pip install --no-deps --target
# DIR .whl/*.whl` and DIR on PYTHONPATH. DRY=1: every part on the CPU at tiny sizes, no
# figures (CI runs it so that it cannot rot). GPU_OUT: a directory for the table and figures;
# GPU_WORKDIR: where its data sets and runs go (a new directory inside it, removed at the end);
# PARTS: some of step,e2e,mini,torchrun,reframe.
GPU_PYTHON ?= python3
GPU_PY     ?= 3.12
.PHONY: gpu-check gpu-wheels
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py $(if $(DRY),--dry) $(if $(REFERENCE),--reference $(REFERENCE)) \
	    $(if $(GPU_OUT),--out $(GPU_OUT)) $(if $(GPU_WORKDIR),--workdir $(GPU_WORKDIR)) $(if $(PARTS),--parts $(PARTS))

gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_PY) --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    --platform manylinux1_x86_64 --platform any -d .whl -r requirements/gpu-wheels.txt

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/cpu.txt requirements/constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) $(CONSTRAINTS) -r requirements/cpu.txt
	$(PIP) $(CONSTRAINTS) --no-deps -e .
	touch $@

# arm64 with 512-bit SVE under emulation (docs/targets.md): as root, with Debian's
# qemu-user-static, binfmt-support and debootstrap. `arm64` builds the arm64 root file
# system with the aarch64 wheels (build/arm64, git-ignored; tests/arm64/build_rootfs.sh)
# and runs tests/test_arm64.py in it; `arm64-image` builds the a64fx image for linux/arm64
# with Podman from a debootstrap base and runs both benchmarks in it (about 15 minutes;
# without download.pytorch.org, torch is PyPI's 2.9.1: a named deviation).
# Times under emulation are not speed figures.
# Every check of the local profile in both HPC container runtimes (podman-hpc, Charliecloud);
# CI runs each check once, spread over the two (tests/test_containers.py).
.PHONY: containers-all
containers-all: $(STAMP)
	HPCKIT_CONTAINERS_ALL=1 $(BIN)/python -m pytest tests/test_containers.py -v -rs

.PHONY: arm64 arm64-image
arm64: $(STAMP)
	sh tests/arm64/build_rootfs.sh build/arm64
	HPCKIT_ARM64_ALL=1 $(BIN)/python -m pytest tests/test_arm64.py -v -rs

arm64-image:
	sh tests/arm64/build_image.sh build/arm64-image
