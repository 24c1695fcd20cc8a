"""clip_grad_norm: rescale the whole flat gradient so its global L2 norm stays below a bound."""

from __future__ import annotations

import math
import numbers
from typing import Any

from neuroflow.backends.namespaces import array_namespace


def clip_grad_norm(grad_flat: Any, max_norm: float) -> float:
    """Scale ``grad_flat`` in place to norm ``max_norm`` when its L2 norm exceeds it; return the norm before.

    A non-finite norm (NaN or Inf in the gradient) is returned as is and the
    gradient is left unscaled, so the caller can skip the step. Allocates no
    array: the norm is one dot product over the flat buffer, in its dtype.

    Example::

        norm = clip_grad_norm(flat.grad, max_norm=1.0)
    """
    if not isinstance(max_norm, numbers.Real) or isinstance(max_norm, bool) or not 0.0 < max_norm < math.inf:
        raise ValueError(f"clip_grad_norm: max_norm must be a finite number > 0; got {max_norm!r}")
    max_norm = float(max_norm)
    if grad_flat.ndim != 1:
        raise ValueError(f"clip_grad_norm expects the 1-D flat gradient buffer; got shape {tuple(grad_flat.shape)}")
    xp = array_namespace(grad_flat)
    norm = math.sqrt(float(xp.dot(grad_flat, grad_flat)))
    if math.isfinite(norm) and norm > max_norm:
        grad_flat *= max_norm / norm
    return norm
