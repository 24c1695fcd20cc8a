"""SGD: stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight decay."""

from __future__ import annotations

from typing import Any

from neuroflow.backends import kernels
from neuroflow.errors import ConfigError
from neuroflow.optim.base import Optimizer, check_range


class SGD(Optimizer):
    """Stochastic gradient descent with PyTorch's semantics.

    Per step, with ``g`` the gradient: ``g += weight_decay * p``; with
    momentum, ``buf = g`` at the first step and ``buf = momentum * buf +
    (1 - dampening) * g`` after; ``g = g + momentum * buf`` (Nesterov) or
    ``g = buf``; then ``p -= lr * g``. The gradient buffer is left untouched.

    Example::

        opt = nf.optim.SGD(lr=0.1, momentum=0.9, nesterov=True)
        flat = opt.bind_parameters(model.trainable_parameters())
        opt.step()
    """

    def __init__(
        self, lr: float, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
        dampening: float = 0.0,
    ) -> None:
        super().__init__(lr)
        self.momentum = check_range("SGD", "momentum", momentum, 0.0)
        self.weight_decay = check_range("SGD", "weight_decay", weight_decay, 0.0)
        self.dampening = check_range("SGD", "dampening", dampening, 0.0, 1.0, high_open=False)
        if not isinstance(nesterov, bool):
            raise ConfigError(f"SGD: nesterov must be True or False; got {nesterov!r} ({type(nesterov).__name__})")
        self.nesterov = nesterov
        if self.nesterov and (self.momentum == 0.0 or self.dampening != 0.0):
            raise ConfigError(
                f"SGD: nesterov=True requires momentum > 0 and dampening == 0; "
                f"got momentum={momentum!r}, dampening={dampening!r}"
            )

    def get_config(self) -> dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum, "nesterov": self.nesterov,
                "weight_decay": self.weight_decay, "dampening": self.dampening}

    def state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()

    def _update(self, data: Any, grad: Any, lr: float, state: dict[str, Any]) -> None:
        fused = self.fused(kernels.SGD_UPDATE.name)
        if fused is not None:
            fused(data, grad, state.get("momentum_buffer"), lr=lr, momentum=self.momentum,
                  dampening=self.dampening, nesterov=self.nesterov, weight_decay=self.weight_decay,
                  first=self.step_count == 1)
            return
        buf = state.get("momentum_buffer")
        if buf is None and not self.weight_decay:
            # plain SGD: p -= lr · g, a chunk at a time through the scratch (the same two passes as below)
            xp, scratch = self._xp, self._scratch
            size, step = int(data.shape[0]), int(scratch.shape[0])
            for start in range(0, size, step):
                stop = min(start + step, size)
                part = scratch[:stop - start]
                xp.multiply(grad[start:stop], lr, out=part)
                data[start:stop] -= part
        elif buf is None:
            for data_c, grad_c, scratch in self._chunks(data, grad):
                self._update_chunk(data_c, grad_c, None, scratch, lr)
        else:
            for data_c, grad_c, buf_c, scratch in self._chunks(data, grad, buf):
                self._update_chunk(data_c, grad_c, buf_c, scratch, lr)

    def _update_chunk(self, data: Any, grad: Any, buf: Any, scratch: Any, lr: float) -> None:
        xp = self._xp
        g = grad
        if self.weight_decay:
            xp.multiply(data, self.weight_decay, out=scratch)
            scratch += grad
            g = scratch
        if buf is not None:
            if self.step_count == 1:
                buf[...] = g
            else:
                buf *= self.momentum
                if self.dampening:
                    xp.multiply(g, 1.0 - self.dampening, out=scratch)
                    buf += scratch
                else:
                    buf += g
            if self.nesterov:
                # p -= lr * (g + momentum * buf) in two passes, so g may live in the one scratch buffer.
                xp.multiply(g, lr, out=scratch)
                data -= scratch
                xp.multiply(buf, lr * self.momentum, out=scratch)
                data -= scratch
                return
            g = buf
        xp.multiply(g, lr, out=scratch)
        data -= scratch
