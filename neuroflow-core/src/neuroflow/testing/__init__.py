"""Testing tools for op authors: float64 gradient checks and backend parity.

Third-party op packages get the same checks through the pytest plugin
(``pytest11`` entry point ``neuroflow``): fixtures ``nf_backend`` and
``nf_gradcheck``, and the :class:`OpTestCase` base class.
"""

from neuroflow.testing.gradcheck import GradcheckError, gradcheck
from neuroflow.testing.op_case import OpTestCase, installed_backends

__all__ = ["GradcheckError", "OpTestCase", "gradcheck", "installed_backends"]
