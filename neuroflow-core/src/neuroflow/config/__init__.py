"""Training configuration files: TOML in, model, data and Trainer out (see :mod:`neuroflow.config.file`)."""

from neuroflow.config.file import Config, load_config, resolve_model_config
from neuroflow.config.schema import TRAINER_KEYS, match_name
from neuroflow.config.series import SeriesWindows

__all__ = ["TRAINER_KEYS", "Config", "SeriesWindows", "load_config", "match_name",
           "resolve_model_config"]
