"""CosmoFlow model: the reference architecture, the same function in both frameworks."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import run_hpckit
from hpckit.common.config import load_config
from hpckit.cosmoflow import model_spec

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# The reference network at 128^3 (mlcommons/hpc 2c627d45 cosmoflow/configs/cosmo.yaml:
# conv_size 32, kernel_size 3, five conv layers, fc 128/64, 4 outputs), counted by hand:
#   conv (3^3 taps): 27*4*32+32 = 3488, 27*32*64+64 = 55360, 27*64*128+128 = 221312,
#                    27*128*256+256 = 884992, 27*256*512+512 = 3539456
#   128 / 2^5 = 4: flatten 4*4*4*512 = 32768
#   dense: 32768*128+128 = 4194432, 128*64+64 = 8256, 64*4+4 = 260
REFERENCE_PARAMETERS = (3488 + 55360 + 221312 + 884992 + 3539456) + (4194432 + 8256 + 260)


def test_reference_parameter_count_both_frameworks():
    import torch
    from hpckit.cosmoflow.model_tf import build_model
    from hpckit.cosmoflow.model_torch import CosmoFlow

    cfg = load_config("cosmoflow", "reference")
    assert REFERENCE_PARAMETERS == 8_907_556
    assert cfg["model"]["kernel_size"] == 3
    assert model_spec.parameter_count(cfg) == REFERENCE_PARAMETERS
    with torch.device("meta"):
        torch_params = sum(p.numel() for p in CosmoFlow(cfg).parameters())
    assert torch_params == REFERENCE_PARAMETERS
    assert build_model(cfg).count_params() == REFERENCE_PARAMETERS


def test_torch_computes_the_keras_function():
    """Keras weights copied into the PyTorch model give the same outputs (eval mode)."""
    import torch
    from hpckit.cosmoflow.model_tf import build_model
    from hpckit.cosmoflow.model_torch import CosmoFlow, load_keras_weights

    cfg = load_config("cosmoflow", "mini", ["model.dropout=0.5"])
    keras_model = build_model(cfg)
    ours = CosmoFlow(cfg).eval()
    load_keras_weights(ours, keras_model)
    x = np.log1p(np.random.default_rng(0).poisson(5.0, (3, 32, 32, 32, 4)).astype(np.float32))
    want = keras_model(x, training=False).numpy()
    got = ours(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.abs(want).max() <= 1.2 + 1e-6 and np.abs(want).std() > 0


def test_l2_penalty_matches_keras():
    import torch
    from hpckit.cosmoflow.model_tf import build_model
    from hpckit.cosmoflow.model_torch import CosmoFlow, load_keras_weights

    cfg = load_config("cosmoflow", "mini", ["model.l2=0.01"])
    keras_model = build_model(cfg)
    keras_model(np.zeros((1, 32, 32, 32, 4), np.float32))
    ours = CosmoFlow(cfg)
    load_keras_weights(ours, keras_model)
    want = float(sum(keras_model.losses))
    assert want > 0
    assert float(ours.l2_penalty().detach()) == pytest.approx(want, rel=1e-5)
    # only the two hidden dense kernels carry L2, as upstream (models/cosmoflow.py:76,79,84)
    dense = [layer for layer in keras_model.layers if type(layer).__name__ == "Dense"]
    assert [layer.kernel_regularizer is not None for layer in dense] == [True, True, False]
    hidden = [lin for lin in ours.head if isinstance(lin, torch.nn.Linear)][:2]
    by_hand = 0.01 * sum(float((lin.weight.detach().double() ** 2).sum()) for lin in hidden)
    assert float(ours.l2_penalty().detach()) == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_describe_prints_layers_and_parameter_count(framework):
    proc = run_hpckit("describe", "cosmoflow", "--config", "reference", "--framework", framework, check=True)
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == f"parameters: {REFERENCE_PARAMETERS}"
    assert lines[-2] == "output shape: (4,)"
    assert sum("Conv3" in line for line in lines) == 5
    assert any("(4, 4, 4, 512)" in line for line in lines)


def test_describe_follows_config_knobs():
    proc = run_hpckit("describe", "cosmoflow", "--config", "mini", "--set", "model.fc1_size=32", check=True)
    cfg = load_config("cosmoflow", "mini", ["model.fc1_size=32"])
    assert proc.stdout.strip().splitlines()[-1] == f"parameters: {model_spec.parameter_count(cfg)}"


def test_learning_rate_schedule_matches_reference_semantics():
    from hpckit.cosmoflow.train import learning_rate, peak_lr

    cfg = load_config("cosmoflow", "reference")
    # global batch 256 -> peak = 0.001 * 256 / 64; warmup over 4 epochs from base_lr
    assert peak_lr(cfg, 256) == (pytest.approx(0.004), pytest.approx(4.0))
    lrs = [learning_rate(cfg, 256, e) for e in range(0, 70)]
    assert lrs[0] == pytest.approx(0.001)
    assert lrs[2] == pytest.approx(0.001 + 2 * 0.003 / 4)
    assert lrs[4] == lrs[32] == pytest.approx(0.004)
    assert lrs[33] == pytest.approx(0.004 * 0.25)      # decay applies after boundary epoch 32
    assert lrs[64] == pytest.approx(0.001)
    assert lrs[65] == pytest.approx(0.004 * 0.125)
