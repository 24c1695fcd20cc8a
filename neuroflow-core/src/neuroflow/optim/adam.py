"""Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from neuroflow.backends import kernels
from neuroflow.errors import ConfigError
from neuroflow.optim.base import Optimizer, check_range


class Adam(Optimizer):
    """Adam with PyTorch's bias correction; ``weight_decay`` is an L2 term added to the gradient.

    Per step ``t``: ``g = grad + weight_decay * p``; ``m = b1 * m + (1 - b1) * g``;
    ``v = b2 * v + (1 - b2) * g**2``; ``p -= lr / (1 - b1**t) * m /
    (sqrt(v) / sqrt(1 - b2**t) + eps)``.
    """

    decoupled_weight_decay = False

    def __init__(
        self, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(lr)
        name = type(self).__name__
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: betas must be a pair (beta1, beta2); got {betas!r}") from None
        self.betas = (check_range(name, "betas[0]", beta1, 0.0, 1.0), check_range(name, "betas[1]", beta2, 0.0, 1.0))
        self.eps = check_range(name, "eps", eps, 0.0)
        self.weight_decay = check_range(name, "weight_decay", weight_decay, 0.0)

    def get_config(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay}

    def state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _update(self, data: Any, grad: Any, lr: float, state: dict[str, Any]) -> None:
        fused = self.fused(kernels.ADAM_UPDATE.name)
        if fused is not None:
            fused(data, grad, state["exp_avg"], state["exp_avg_sq"], lr=lr, beta1=self.betas[0],
                  beta2=self.betas[1], eps=self.eps, weight_decay=self.weight_decay,
                  decoupled=self.decoupled_weight_decay, step=self.step_count)
            return
        m, v = state["exp_avg"], state["exp_avg_sq"]
        for data_c, grad_c, m_c, v_c, scratch in self._chunks(data, grad, m, v):
            self._update_chunk(data_c, grad_c, m_c, v_c, scratch, lr)

    def _update_chunk(self, data: Any, grad: Any, m: Any, v: Any, scratch: Any, lr: float) -> None:
        xp = self._xp
        beta1, beta2 = self.betas
        if self.weight_decay and self.decoupled_weight_decay:
            data *= 1.0 - lr * self.weight_decay
        # The scratch buffer holds (1 - beta1) * g, so g itself (which includes the L2 term) never needs
        # a buffer of its own; its square is recovered by rescaling.
        if self.weight_decay and not self.decoupled_weight_decay:
            xp.multiply(data, self.weight_decay, out=scratch)
            scratch += grad
            scratch *= 1.0 - beta1
        else:
            xp.multiply(grad, 1.0 - beta1, out=scratch)
        m *= beta1
        m += scratch
        xp.multiply(scratch, scratch, out=scratch)
        scratch *= (1.0 - beta2) / (1.0 - beta1) ** 2
        v *= beta2
        v += scratch

        # m / (sqrt(v)/c + eps) == c·m / (sqrt(v) + eps·c) with c = sqrt(1 - beta2^t): folding c into eps and
        # the step size saves a pass over the parameters.
        t = self.step_count
        c = math.sqrt(1.0 - beta2**t)
        xp.sqrt(v, out=scratch)
        scratch += self.eps * c
        xp.divide(m, scratch, out=scratch)
        scratch *= lr * c / (1.0 - beta1**t)
        data -= scratch


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): ``p *= 1 - lr * weight_decay`` before the Adam step.

    Example::

        optimizer = nf.optim.AdamW(lr=1e-3, weight_decay=0.05)
    """

    decoupled_weight_decay = True

    def __init__(
        self, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(lr, betas, eps, weight_decay)
