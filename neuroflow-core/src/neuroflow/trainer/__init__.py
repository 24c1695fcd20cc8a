"""The Trainer and the parts it is made of; see :mod:`neuroflow.trainer.trainer`."""

from neuroflow.trainer.options import TrainerOptions
from neuroflow.trainer.session import MemorySession
from neuroflow.trainer.trainer import Trainer

__all__ = ["MemorySession", "Trainer", "TrainerOptions"]
