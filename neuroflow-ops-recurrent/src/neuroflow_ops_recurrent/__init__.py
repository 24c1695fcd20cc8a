"""Recurrent operators for NeuroFlow: Elman, WaveletElman, GRU and LSTM.

Found as ``neuroflow.ops.Elman`` (etc.) through the ``neuroflow_ops`` entry points once installed.
"""

from neuroflow_ops_recurrent.elman import Elman
from neuroflow_ops_recurrent.gru import GRU
from neuroflow_ops_recurrent.lstm import LSTM
from neuroflow_ops_recurrent.wavelet_elman import WaveletElman

__all__ = ["GRU", "LSTM", "Elman", "WaveletElman"]
