"""Learning-rate schedulers: the learning rate for each optimisation step of a training run."""

from neuroflow.schedulers.base import Scheduler
from neuroflow.schedulers.constant import Constant
from neuroflow.schedulers.cosine import Cosine
from neuroflow.schedulers.step import Step

__all__ = ["Constant", "Cosine", "Scheduler", "Step"]
