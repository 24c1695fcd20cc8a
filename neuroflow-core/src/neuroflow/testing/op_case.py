"""OpTestCase: one test class that runs forward, backward and gradcheck on every installed backend."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from neuroflow import registry
from neuroflow.backends.base import Backend
from neuroflow.errors import NeuroFlowError
from neuroflow.operator import Operator
from neuroflow.testing.gradcheck import as_tuple, gradcheck


def installed_backends() -> list[str]:
    """Names of the installed backends that can run on this machine."""
    names = []
    for name in registry.backends.names():
        try:
            if registry.backends.get(name).is_available():
                names.append(name)
        except NeuroFlowError:
            continue
    return names


class OpTestCase:
    """Subclass, set ``make_op`` and ``input_shapes``, and pytest runs the standard checks.

    - ``test_gradcheck``: float64 finite differences on the cpu backend;
    - ``test_backend_parity``: forward and backward on ``nf_backend`` (every
      installed backend) match the cpu backend within ``rtol``/``atol``.
    """

    input_shapes: Sequence[tuple[int, ...]] = ()
    rtol = 1e-4
    atol = 1e-5
    seed = 0

    def make_op(self) -> Operator:
        raise NotImplementedError

    def make_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal(shape) for shape in self.input_shapes]

    def prepare(self, op: Operator) -> None:
        """Runs before every forward; reseed stochastic ops here."""

    def test_gradcheck(self) -> None:
        op = self.make_op()
        inputs = self.make_inputs(np.random.default_rng(self.seed))
        gradcheck(op, inputs, prepare=lambda: self.prepare(op))

    def test_backend_parity(self, nf_backend: Backend) -> None:
        rng = np.random.default_rng(self.seed)
        reference = self.make_op()
        other = copy.deepcopy(reference).to(nf_backend)
        inputs = [x.astype(np.float32) for x in self.make_inputs(rng)]
        results = []
        for op, backend in ((reference, None), (other, nf_backend)):
            self.prepare(op)
            device_inputs = [backend.from_host(x) if backend else x for x in inputs]
            out = as_tuple(op.forward(*device_inputs))
            host_out = [np.asarray(backend.to_host(o) if backend else o) for o in out]
            grads_out = [np.random.default_rng(1).standard_normal(o.shape).astype(np.float32) for o in host_out]
            device_grads = [backend.from_host(g) if backend else g for g in grads_out]
            gin = as_tuple(op.backward(*device_grads) if len(device_grads) > 1 else op.backward(device_grads[0]))
            host_gin = [np.asarray(backend.to_host(g) if backend else g) for g in gin]
            param_grads = [
                np.asarray(backend.to_host(p.grad) if backend else p.grad)
                for p in op.trainable_parameters() if p.grad is not None
            ]
            results.append((host_out, host_gin, param_grads))
        for kind, ref, got in zip(("output", "input gradient", "parameter gradient"), results[0], results[1]):
            for a, b in zip(ref, got):
                np.testing.assert_allclose(b, a, rtol=self.rtol, atol=self.atol, err_msg=f"{kind} on {nf_backend.name}")
