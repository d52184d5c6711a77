"""FLOPs of one training sample (forward + backward) of a benchmark's network, counted on
meta tensors (shapes only: nothing is computed, a full-size DeepCAM takes under a second).

torch's FlopCounterMode counts every aten op; its formula for a convolution's backward is
replaced (`conv_backward_flop`): in torch 2.13.0 it counts a grouped convolution's weight
gradient without the group division (a depthwise 3x3, 64 channels, 32 x 32: 76.7 MFLOP
backward for a 1.18 MFLOP forward; pytorch/pytorch PR 183405 proposes the fix). DeepCAM's
Xception is full of depthwise convolutions: counted by torch, its full-size sample came to
4,409 GFLOP; it is 1,964 with this formula. CosmoFlow (no groups): 192.1 GFLOP at 128^3.

The count is of the architecture, the same for every framework (a benchmark's descriptor
gives the PyTorch model and one sample's step, Benchmark.flops_sample; a TensorFlow run is
counted on its PyTorch twin). Achieved FLOP/s = this x train samples per second; where the framework
recomputes or fuses, the FLOPs it really executed differ, and the figure stays the model's.
"""

from __future__ import annotations


def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                       _output_padding, _groups, output_mask, out_shape=None, **_) -> int:
    """A convolution's backward: the input gradient and the weight gradient each cost what
    the forward costs (2 x every product of the forward; the weight's shape is already
    divided by the groups)."""
    spatial = x_shape[2:] if transposed else grad_out_shape[2:]
    forward = 2 * grad_out_shape[0]
    for n in (*spatial, *w_shape):
        forward *= n
    return forward * (bool(output_mask[0]) + bool(output_mask[1]))


def train_flops_per_sample(benchmark: str, cfg: dict) -> float:
    """Forward + backward FLOPs of one sample of `cfg`'s network (no optimizer step): the
    benchmark's descriptor builds the model and the step (Benchmark.flops_sample; the
    convolutional networks on the meta device, OC20's graph network on one real sample)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from hpckit.common.benchmark import descriptors
    sample = descriptors()[benchmark].flops_sample
    if sample is None:
        raise ValueError(f"no FLOP count for benchmark {benchmark!r}")
    _model, step = sample(cfg)
    counter = FlopCounterMode(display=False,
                              custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flop})
    with counter:
        step()
    return float(counter.get_total_flops())
