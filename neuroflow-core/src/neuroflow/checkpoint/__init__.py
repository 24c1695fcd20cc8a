"""Model files and training checkpoints: safetensors, no pickle, rebuilt through the op registry."""

from neuroflow.checkpoint.errors import CheckpointError
from neuroflow.checkpoint.lock import DirectoryLockedError
from neuroflow.checkpoint.model_file import ModelFile, SaveReport, load, open_model_file, quantization_of, save
from neuroflow.checkpoint.quantize import QuantizationReport, TensorQuantization
from neuroflow.checkpoint.state_dict_file import LoadedKeys, load_state_dict_file
from neuroflow.checkpoint.topology import register_children
from neuroflow.checkpoint.training import (
    ResumeInfo,
    latest_checkpoint,
    list_checkpoints,
    load_training_checkpoint,
    save_training_checkpoint,
)

__all__ = [
    "CheckpointError", "DirectoryLockedError", "LoadedKeys", "ModelFile", "QuantizationReport", "ResumeInfo", "SaveReport",
    "TensorQuantization", "latest_checkpoint", "list_checkpoints", "load", "load_state_dict_file",
    "load_training_checkpoint", "open_model_file", "quantization_of", "register_children", "save", "save_training_checkpoint",
]
