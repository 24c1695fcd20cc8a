"""Optimizers that update flat parameter buffers in place, and global gradient-norm clipping."""

from neuroflow.optim.adam import Adam, AdamW
from neuroflow.optim.base import Optimizer
from neuroflow.optim.clip import clip_grad_norm
from neuroflow.optim.sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm"]
