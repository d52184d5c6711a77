"""The GPU data path (issue 32): the loaders ship CosmoFlow's raw int16 counts and DeepCAM's
fields as read (uint8 labels) in pinned memory, and `to_device` transforms them on the device
into exactly what the CPU path's workers compute (cosmoflow/data.py transform, deepcam/data.py
read_sample). Run on the CPU here (device_transform=True, through a real worker process and its
shared memory), and on CUDA where there is one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpckit.common import tfrecord
from hpckit.common.errors import KitError
from hpckit.common.feed import PinnedBatches
from hpckit.cosmoflow import data as cdata
from hpckit.deepcam import data as ddata
from hpckit.deepcam import synthetic as dsynth

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
S = 32   # 32^3 x 4 = 131,072 voxels: room for every one of the 32,768 counts an int16 can hold


@pytest.fixture(scope="module")
def counts_split(tmp_path_factory):
    """Three CosmoFlow samples as GZIP TFRecords: together (and the first alone) they hold every
    count 0..32767, in random places, plus realistic small counts."""
    d = tmp_path_factory.mktemp("cosmo") / "validation"
    d.mkdir(parents=True)
    rng = np.random.default_rng(5)
    n = S ** 3 * 4
    for i in range(3):
        x = np.concatenate([np.arange(cdata.LOG1P_TABLE_SIZE), rng.poisson(4.0, n - cdata.LOG1P_TABLE_SIZE)])
        x = rng.permutation(x).astype("<i2").reshape(S, S, S, 4)
        y = rng.uniform(-1, 1, 4).astype(np.float32)
        tfrecord.write_records(d / f"s{i}.tfrecord", [tfrecord.encode_example({"x": x.tobytes(), "y": y})],
                               compression="GZIP", level=1)
    return cdata.find_split(d.parent, "validation", 3, "data.n_valid")


def cosmo_cfg(apply_log: bool, workers: int = 1) -> dict:
    return {"data": {"sample_size": S, "batch_size": 2, "apply_log": apply_log, "shuffle": False,
                     "prefetch": 2, "loader_workers": workers}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feed", ["threads", "processes"])
@pytest.mark.parametrize("apply_log", [True, False])
def test_cosmoflow_int16_counts_transformed_on_the_device_equal_the_cpu_transform(counts_split, apply_log, feed,
                                                                                  device):
    device = torch.device(device)
    cfg = cosmo_cfg(apply_log)
    shipped = cdata.torch_loader(counts_split, cfg, train=False, seed=0, device=device, device_transform=True,
                                 feed=feed)
    assert len(shipped) == 2
    seen = 0
    for x, y in shipped:   # each batch used before the next is asked for (the threads reuse its memory)
        assert len(x.counts) == (2 if seen == 0 else 1)
        assert isinstance(x, cdata.Counts) and x.counts.dtype == torch.int16   # half the bytes of float32
        assert x.counts.shape[1:] == (S, S, S, 4) and x.counts.is_pinned() == (device.type == "cuda")
        xd, yd = cdata.to_device(x, y, device)
        assert xd.device.type == device.type and xd.dtype == torch.float32 and xd.shape == x.counts.shape
        for j in range(len(xd)):
            raw, label = cdata.read_sample(counts_split, seen + j, S)
            want = torch.from_numpy(cdata.transform(raw, apply_log))
            got = xd[j].cpu()
            if apply_log:   # a lookup of numpy's own log1p: bit-identical, every count covered
                assert torch.equal(got, want)
            else:           # the mean summed exactly, transform()'s in float32 pairwise
                torch.testing.assert_close(got, want, rtol=2.5e-7, atol=0)
            assert torch.equal(yd[j].cpu(), torch.from_numpy(label))
        seen += len(xd)
    assert seen == 3


def test_cosmoflow_cpu_runs_unchanged(counts_split):
    """device None or CPU: the workers ship transform()'s float32, not pinned, as before."""
    for device in (None, torch.device("cpu")):
        (x, y), _ = list(cdata.torch_loader(counts_split, cosmo_cfg(True, workers=0), train=False, seed=0,
                                            device=device))
        assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and not x.is_pinned()
        raw, _ = cdata.read_sample(counts_split, 0, S)
        assert torch.equal(x[0], torch.from_numpy(cdata.transform(raw, True)))
        xd, _ = cdata.to_device(x, y, torch.device("cpu"))
        assert xd is x or torch.equal(xd, x)


def test_a_cuda_device_pins_and_ships_raw(counts_split):
    """The wiring for a CUDA device, checked without one: reader threads into pinned buffers of
    raw batches, or DataLoader workers with its pin-memory thread."""
    cuda = torch.device("cuda")
    loader = cdata.torch_loader(counts_split, cosmo_cfg(True, workers=3), train=False, seed=0, device=cuda)
    assert isinstance(loader, PinnedBatches) and loader.pin and loader.threads == 3
    assert loader.parts[0] == ((S, S, S, 4), torch.int16)
    loader = cdata.torch_loader(counts_split, cosmo_cfg(True), train=False, seed=0, device=cuda, feed="processes")
    assert loader.pin_memory is True and loader.dataset[0][0].dtype == torch.int16
    cam = ddata.torch_loader(ddata.DeepCamFiles("train", []), STATS, CAM_CFG, train=False, seed=0, device=cuda)
    assert isinstance(cam, PinnedBatches) and cam.pin and cam.parts[1] == ((H, W), torch.uint8)
    cam = ddata.torch_loader(ddata.DeepCamFiles("train", []), STATS, CAM_CFG, train=False, seed=0, device=cuda,
                             feed="processes")
    assert cam.pin_memory is True and cam.collate_fn is not None


H, W = 24, 40
CAM_CFG = {"data": {"height": H, "width": W, "n_channels": 16, "n_train": 3, "n_valid": 1, "batch_size": 2,
                    "loader_workers": 1, "shuffle": False, "normalization": "minmax", "prefetch": 2}}
STATS = {"minval": np.full(16, -1.0, np.float32), "maxval": np.full(16, 1.0, np.float32)}


@pytest.fixture(scope="module")
def cam(tmp_path_factory):
    root = tmp_path_factory.mktemp("cam") / "data"
    dsynth.write_dataset(root, 3, 1, height=H, width=W, seed=2, workers=1)
    return ddata.find_dataset(root, 3, 1)["train"], ddata.load_stats(root)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feed", ["threads", "processes"])
@pytest.mark.parametrize("memory_format", [None, torch.channels_last])
def test_deepcam_fields_normalised_on_the_device_equal_the_cpu_path(cam, device, feed, memory_format):
    files, stats = cam
    device = torch.device(device)
    cpu_path = list(ddata.torch_loader(files, stats, CAM_CFG, train=False, seed=0))
    shipped = ddata.torch_loader(files, stats, CAM_CFG, train=False, seed=0, device=device, device_transform=True,
                                 feed=feed)
    assert len(shipped) == len(cpu_path) == 2
    for (x, y), (want_x, want_y) in zip(shipped, cpu_path):   # each used before the next is asked for
        assert isinstance(x, ddata.Fields) and x.data.shape[1:] == (H, W, 16) and x.data.dtype == torch.float32
        assert y.dtype == torch.uint8 and x.data.is_pinned() == (device.type == "cuda")
        before = x.data.clone()
        xd, yd = ddata.to_device(x, y, device, memory_format=memory_format)
        assert torch.equal(x.data, before)   # the loader's batch is never normalised in place
        assert xd.device.type == device.type
        assert xd.is_contiguous(memory_format=memory_format or torch.contiguous_format)
        assert want_x.dtype == xd.dtype and want_y.dtype == yd.dtype == torch.int64
        assert torch.equal(xd.cpu(), want_x) and torch.equal(yd.cpu(), want_y)   # bit-identical


def test_reader_threads_refill_a_buffer_only_after_its_batch_and_name_a_bad_file(counts_split, tmp_path):
    """The ring of batch buffers over many batches and passes (depth 2, one sample a batch:
    every buffer reused many times), a pass left early, and a bad file named when its batch
    is asked for, as the worker processes' path reports it (run.diagnosed passes KitErrors on)."""
    cfg = cosmo_cfg(True, workers=2)
    cfg["data"].update(batch_size=1, prefetch=1)
    loader = cdata.torch_loader(counts_split, cfg, train=True, seed=0, sampler=[0, 1, 2] * 4,
                                device=torch.device("cpu"), device_transform=True)
    assert loader.depth == 3   # 2 readers need 2 samples in flight, plus the consumer's
    want = [torch.from_numpy(cdata.read_sample(counts_split, i, S)[0]) for i in range(3)]
    for _ in range(2):
        got = [torch.equal(x.counts[0], want[i]) for (x, _), i in zip(loader, [0, 1, 2] * 4)]
        assert got == [True] * 12
    for k, _ in enumerate(loader):   # left after two batches: the next pass waits for the reads in flight
        if k == 1:
            break
    assert sum(1 for _ in loader) == 12

    bad = tmp_path / "validation"
    bad.mkdir()
    for i, f in enumerate(counts_split.files):
        (bad / f.name).write_bytes(f.read_bytes() if i != 1 else f.read_bytes()[:1000])
    split = cdata.find_split(tmp_path, "validation", 3, "data.n_valid")
    batches = iter(cdata.torch_loader(split, cfg, train=False, seed=0, device=torch.device("cpu"),
                                      device_transform=True))
    next(batches)
    with pytest.raises(KitError, match=str(split.files[1])):
        next(batches)
