"""CosmoFlow in PyTorch: the same network as the Keras reference, weight for weight.

Input is channels last like the Keras model; the convolutions run channels first and the
flatten is done in channels-last order, so a Keras model's weights map onto this one
exactly (see `load_keras_weights`) and both compute the same function. 'same' padding is
explicit where it is asymmetric: for a kernel k TensorFlow pads (k-1)//2 before and the
rest after, so kernel 2 (the mini config's) pads (0 before, 1 after); the reference's
kernel 3 pads 1 on both sides, which the convolution does itself (no padded copy).
"""

from __future__ import annotations

import torch
from torch import nn

from hpckit.cosmoflow.model_spec import N_CHANNELS, N_TARGETS, OUTPUT_SCALE


def same_padding(k: int) -> nn.Module:
    before = (k - 1) // 2
    after = k - 1 - before
    return nn.ConstantPad3d((before, after) * 3, 0.0)


class CosmoFlow(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        m, s = cfg["model"], cfg["data"]["sample_size"]
        blocks, c_in = [], N_CHANNELS
        for i in range(m["n_conv_layers"]):
            c = m["conv_size"] * 2 ** i
            k = m["kernel_size"]
            conv = [nn.Conv3d(c_in, c, k, padding=(k - 1) // 2)] if k % 2 else [same_padding(k), nn.Conv3d(c_in, c, k)]
            blocks += [*conv, nn.LeakyReLU(m["leaky_relu_alpha"]), nn.MaxPool3d(2)]
            c_in, s = c, s // 2
        self.features = nn.Sequential(*blocks)
        flat = s ** 3 * c_in
        self.head = nn.Sequential(
            nn.Linear(flat, m["fc1_size"]), nn.LeakyReLU(m["leaky_relu_alpha"]), nn.Dropout(m["dropout"]),
            nn.Linear(m["fc1_size"], m["fc2_size"]), nn.LeakyReLU(m["leaky_relu_alpha"]), nn.Dropout(m["dropout"]),
            nn.Linear(m["fc2_size"], N_TARGETS), nn.Tanh())
        self.l2 = m["l2"]
        self._init_like_keras()

    def _init_like_keras(self) -> None:
        # Keras defaults: glorot_uniform kernels, zero biases.
        for mod in self.modules():
            if isinstance(mod, (nn.Conv3d, nn.Linear)):
                nn.init.xavier_uniform_(mod.weight)
                nn.init.zeros_(mod.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # x: (N, S, S, S, C)
        h = self.features(x.permute(0, 4, 1, 2, 3))
        h = h.permute(0, 2, 3, 4, 1).flatten(1)               # Keras Flatten order
        return self.head(h) * OUTPUT_SCALE

    def l2_penalty(self) -> torch.Tensor:
        """Keras L2(l2) on the two hidden dense kernels (not the output layer, as upstream):
        l2 * sum(w^2), added to the loss."""
        if self.l2 == 0:
            return torch.zeros(())
        hidden = [lin for lin in self.head if isinstance(lin, nn.Linear)][:-1]
        return self.l2 * sum((lin.weight ** 2).sum() for lin in hidden)


def load_keras_weights(model: CosmoFlow, keras_model) -> None:
    """Copy a Keras CosmoFlow's weights into `model` (kernel layouts transposed)."""
    ours = [m for m in model.modules() if isinstance(m, (nn.Conv3d, nn.Linear))]
    theirs = [layer for layer in keras_model.layers if layer.get_weights()]
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    with torch.no_grad():
        for mod, layer in zip(ours, theirs):
            kernel, bias = layer.get_weights()
            if isinstance(mod, nn.Conv3d):      # (kd, kh, kw, in, out) -> (out, in, kd, kh, kw)
                mod.weight.copy_(torch.from_numpy(kernel.transpose(4, 3, 0, 1, 2).copy()))
            else:                               # (in, out) -> (out, in)
                mod.weight.copy_(torch.from_numpy(kernel.T.copy()))
            mod.bias.copy_(torch.from_numpy(bias))
