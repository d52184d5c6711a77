"""CosmoFlow's optimizer in PyTorch: Keras SGD with momentum, the reference's
(mlcommons/hpc@2c627d4 cosmoflow/utils/optimizers.py: keras.optimizers.SGD with the
config's momentum), in Keras' form:

    v <- momentum * v - lr * g;   w <- w + v

Multi-tensor (torch._foreach_*), the learning rate on the device and GradScaler's
found_inf skip (common/step.DeviceOptimizer): a skipped step leaves v and w as they were."""

from __future__ import annotations

import torch

from hpckit.common.step import DeviceOptimizer


class KerasSGD(DeviceOptimizer):
    def __init__(self, params, lr: float = 0.0, momentum: float = 0.0):
        if not lr >= 0.0:
            raise ValueError(f"invalid learning rate {lr!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"invalid momentum {momentum!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum))

    def apply(self, groups: list, grads: list, ok: torch.Tensor) -> None:
        for index, group, params in groups:
            if not params:
                continue
            dtype = params[0].dtype
            for p in params:
                if "velocity" not in self.state[p]:
                    self.state[p]["velocity"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            velocity = [self.state[p]["velocity"] for p in params]
            one = torch.ones((), dtype=dtype, device=ok.device)
            lr = self.lr_tensor(index, group, ok.device)
            # skipped (not ok): v * 1 - 0 * g (the gradients are zeros then), w + 0 * v
            torch._foreach_mul_(velocity, torch.where(ok, torch.full_like(one, group["momentum"]), one))
            torch._foreach_add_(velocity, torch._foreach_mul([p.grad for p in params], (-lr).to(dtype)))
            torch._foreach_add_(params, torch._foreach_mul(velocity, ok.to(dtype)))
