"""Small data sets for recurrent models, shipped with the package, and the windowing that feeds them."""

from neuroflow_ops_recurrent.data.sunspots import sunspots
from neuroflow_ops_recurrent.data.windows import one_step_windows

__all__ = ["one_step_windows", "sunspots"]
