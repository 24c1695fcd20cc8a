"""What one forward and backward of a model gives, for comparing two ways of running the same model."""

from __future__ import annotations

import numpy as np

import neuroflow as nf


def forward_backward(model: nf.Operator, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Output, input gradient, every parameter's gradient and every buffer after one forward/backward (cross
    entropy against ``y``), as copies."""
    loss = nf.losses.CrossEntropy()
    for p in model.parameters():
        p.grad = np.zeros_like(p.data)
    out = model.forward(x)
    loss.forward(out, y)
    gx = model.backward(loss.backward())
    return [out.copy(), gx.copy(), *(p.grad.copy() for p in model.parameters()),
            *(b.data.copy() for _, b in model.named_buffers())]
