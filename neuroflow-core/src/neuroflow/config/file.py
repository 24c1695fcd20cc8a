"""Training configuration files: TOML in, model, data and Trainer out.

A config holds the Trainer's keyword arguments at the top level and one
table per component::

    epochs = 2
    batch_size = 64

    [model]
    layers = [{type = "Linear", in_features = 784, out_features = 10}]

    [data]
    dataset = "mnist"

    [optimizer]
    type = "AdamW"
    lr = 1e-3

``[model] name = "yolo_lite"`` calls a registered model builder with the table's
other keys (some computed from the training data, such as a detector's
``anchors = "kmeans"``: see :mod:`neuroflow.config.from_data`); ``[loss] type``
names a loss of :mod:`neuroflow.losses` or of a plugin (see
:mod:`neuroflow.config.components`).
``[model] from = "base.safetensors"`` starts from a saved model instead, and
a ``[lora]`` table puts LoRA adapters on the model. ``[data] dataset``
names a ``neuroflow_datasets`` entry, whose own keys the table then holds.
Relative paths (``[model] from``, ``[data] train/test`` and a data set's
path keys such as ``path``, ``[output] save``, ``checkpoint_dir``) are
resolved against the directory of the config file.
Every key is checked when the file is read: an unknown key or a value of the
wrong type raises ConfigError naming the key, its table and what is valid.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from neuroflow import random, registry
from neuroflow.checkpoint import load
from neuroflow.composites import Sequential
from neuroflow.config.components import build_component
from neuroflow.config.from_data import resolver_of
from neuroflow.config.schema import (
    COMPONENTS,
    LORA_KEYS,
    MODEL_KEYS,
    NPZ_KEYS,
    OUTPUT_KEYS,
    TABLES,
    TRAINER_KEYS,
    call_checked,
    check_keys,
    check_type,
    dataset_source,
    match_name,
)
from neuroflow.errors import ConfigError, NeuroFlowError, UnknownNameError
from neuroflow.lora import LoRAAdapter, apply_lora
from neuroflow.operator import Operator
from neuroflow.trainer import Trainer, TrainerOptions


@dataclass
class Config:
    """A validated training configuration; ``build_*`` turn it into live objects."""

    trainer: dict[str, Any] = field(default_factory=dict)
    epochs: int = 1
    validate: bool = False
    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] | None = None
    loss: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    lora: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    source: Path | None = None

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: Path | None = None) -> Config:
        """Validate a parsed TOML document; raises ConfigError on any unknown key or wrong type."""
        trainer: dict[str, Any] = {}
        tables: dict[str, dict[str, Any]] = {}
        for key, value in raw.items():
            if key in TABLES:
                check_type("the config", key, value, dict)
                tables[key] = dict(value)
            elif key in TRAINER_KEYS:
                check_type("the top level", key, value, TRAINER_KEYS[key])
                trainer[key] = value
            else:
                valid = [*TRAINER_KEYS, *(f"[{t}]" for t in TABLES)]
                raise ConfigError(f"unknown key {key!r} at the top level; valid keys: {', '.join(valid)}")
        epochs = trainer.pop("epochs", 1)
        validate = trainer.pop("validate", False)
        model = tables.get("model")
        if model is None:
            raise ConfigError("the config has no [model] table; give [model] name = ..., layers = [...] or from = ...")
        cls._check_model(model)
        if "data" in tables:
            cls._check_data(tables["data"])
        if "lora" in tables:
            cls._check_lora(tables["lora"])
        if "output" in tables:
            check_keys("[output]", tables["output"], OUTPUT_KEYS)
            if "save" not in tables["output"] and tables["output"]:
                raise ConfigError("[output] 'fuse' and 'quantize' go with save = \"<file>.safetensors\"")
        for name in COMPONENTS:
            if name in tables and not isinstance(tables[name].get("type"), str):
                raise ConfigError(f"[{name}] needs type = \"...\" (a string); got {tables[name].get('type')!r}")
        return cls(trainer=trainer, epochs=epochs, validate=validate, model=model, data=tables.get("data"),
                   loss=tables.get("loss"), optimizer=tables.get("optimizer"), scheduler=tables.get("scheduler"), lora=tables.get("lora"),
                   output=tables.get("output"), source=source)

    @staticmethod
    def _check_model(model: dict[str, Any]) -> None:
        given = [key for key in ("name", "layers", "from") if key in model]
        if len(given) != 1:
            raise ConfigError("[model] needs exactly one of name = \"<registered model>\", layers = [...] and "
                              f"from = \"<file>.safetensors\"; got {', '.join(given) or 'none'}")
        if "name" not in model:  # a builder's other keys are its arguments, checked when it is called
            check_keys("[model]", model, MODEL_KEYS)
        if "layers" in model:
            if not model["layers"]:
                raise ConfigError("[model] layers is empty; list at least one {type = \"...\"} table")
            for i, layer in enumerate(model["layers"]):
                if not isinstance(layer, dict) or not isinstance(layer.get("type"), str):
                    raise ConfigError(f"[model] layers[{i}] must be a table with type = \"<op name>\"; got {layer!r}")
        elif "name" in model:
            check_type("[model]", "name", model["name"], str)
        shape = model.get("input_shape")
        if shape is not None and not (isinstance(shape, list) and shape
                                      and all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                              for s in shape)):
            raise ConfigError(f"[model]: 'input_shape' must be an array of positive integers (one sample); got {shape!r}")

    @staticmethod
    def _check_data(data: dict[str, Any]) -> None:
        if ("dataset" in data) == ("train" in data):
            raise ConfigError("[data] needs exactly one of dataset = \"mnist\" and train = \"<file>.npz\"")
        if "dataset" not in data:
            unknown = [key for key in data if key not in NPZ_KEYS]
            if unknown:
                raise ConfigError(f"unknown key {unknown[0]!r} in [data] with train = \"<file>.npz\"; valid keys: "
                                  f"{', '.join(NPZ_KEYS)} (the others go with dataset = \"...\"; .npz files are used "
                                  "as they are)")
            check_keys("[data]", data, NPZ_KEYS)
        elif "test" in data:
            raise ConfigError("[data] 'test' goes with train = \"<file>.npz\"; a dataset brings its own test split")
        else:
            dataset_source(data)  # checks the data set's keys and values; reads nothing

    @staticmethod
    def _check_lora(lora: dict[str, Any]) -> None:
        check_keys("[lora]", lora, LORA_KEYS)
        targets = lora.get("targets")
        if targets is not None and not (targets and all(isinstance(t, str) for t in targets)):
            raise ConfigError("[lora] 'targets' must be a non-empty array of op type names or layer paths, "
                              f"e.g. [\"Linear\"] or [\"0\", \"4\"]; got {targets!r}")

    def with_overrides(self, **changes: Any) -> Config:
        """A copy with top-level keys replaced (command-line flags); None values are ignored."""
        trainer, epochs = dict(self.trainer), self.epochs
        for key, value in changes.items():
            if value is None:
                continue
            if key not in TRAINER_KEYS:
                raise ConfigError(f"unknown key {key!r}; valid keys: {', '.join(TRAINER_KEYS)}")
            check_type("the command line", key, value, TRAINER_KEYS[key])
            if key == "epochs":
                epochs = value
            else:
                trainer[key] = value
        return dataclasses.replace(self, trainer=trainer, epochs=epochs)

    def path(self, value: str) -> Path:
        """``value`` as a path, relative ones taken from the config file's directory."""
        path = Path(value).expanduser()
        if not path.is_absolute() and self.source is not None:
            path = self.source.parent / path
        return path

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        """The shape of one sample as ``[model] input_shape`` gives it, if it does."""
        shape = self.model.get("input_shape")
        return None if shape is None else tuple(shape)

    # ------------------------------------------------------------------ building
    def build_model(self, train: Any = None) -> Operator:
        """The model (loaded, built by a registered builder, or a Sequential of the listed layers) with its adapters.

        A builder that computes options from the training data (``anchors =
        "kmeans"``, see :mod:`neuroflow.config.from_data`) is given ``train``,
        the training set (loaded here when not given). ``[lora]`` adapters are applied last. Raises ConfigError, before any
        training, when ``lora_fusion`` or ``[output]`` ask for adapters the
        model lacks, or for quantizing adapters that are not fused.
        """

        if "seed" in self.trainer:
            random.manual_seed(self.trainer["seed"])
        model = self._base_model(train)
        if self.lora is not None:

            try:
                model = apply_lora(model, **self.lora)
            except (NeuroFlowError, ValueError, TypeError) as exc:
                raise ConfigError(f"[lora]: {exc}") from exc
        self._check_adapters(model)
        return model

    def _check_adapters(self, model: Operator) -> None:

        output = self.output or {}
        if any(isinstance(op, LoRAAdapter) for op in model.modules()):
            if "quantize" in output and not output.get("fuse"):
                raise ConfigError(
                    f"[output] quantize = {output['quantize']!r} needs fuse = true: the model has LoRA adapters, "
                    "and quantizing comes after they are merged into the float weights, never before"
                )
            return
        wanted = [what for what, on in (("lora_fusion = true", self.trainer.get("lora_fusion")),
                                        ("[output] fuse = true", output.get("fuse"))) if on]
        if wanted:
            raise ConfigError(f"{' and '.join(wanted)} need LoRA adapters, and the model has none; "
                              "add a [lora] table (rank, alpha, targets)")

    def _base_model(self, train: Any = None) -> Operator:

        if "from" in self.model:

            path = self.path(self.model["from"])
            if not path.is_file():
                raise ConfigError(f"[model] from: file {str(path)!r} not found; save a trained model there first "
                                  "([output] save = ..., or neuroflow train CONFIG --save PATH)")
            return load(path, device="cpu")  # the Trainer moves it to the config's device
        if "name" in self.model:
            kwargs = {k: v for k, v in self.model.items() if k not in ("name", "input_shape")}
            try:
                builder = registry.models.get(self.model["name"])
            except NeuroFlowError as exc:
                raise ConfigError(f"[model] name: {exc}") from exc
            where = f"[model] ({self.model['name']})"
            resolver = resolver_of(builder)
            if resolver is not None:  # options computed from the training set, such as anchors = "kmeans"
                try:
                    kwargs = resolver(kwargs, train if train is not None else self.build_data()[0])
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"{where}: {exc}") from exc
            model = call_checked(where, builder, kwargs)
            if not isinstance(model, Operator):
                raise ConfigError(f"model builder {self.model['name']!r} returned {type(model).__name__}, not an Operator")
            return model
        layers = []
        for i, spec in enumerate(self.model["layers"]):
            where = f"[model] layers[{i}]"
            try:
                name = match_name(spec["type"], registry.ops.names()) or spec["type"]
                cls = registry.ops.get(name)
            except NeuroFlowError as exc:
                raise ConfigError(f"{where}: {exc}") from exc
            layers.append(call_checked(f"{where} ({name})", cls, {k: v for k, v in spec.items() if k != "type"}))
        return Sequential(*layers)

    def build_loss(self, model: Operator | None = None) -> Any:
        """The ``[loss]`` object; without one, the data set's own (MSE for a series) or None (the Trainer's CrossEntropy).

        A loss that reads its configuration from the model (``for_model``, see
        :mod:`neuroflow.config.components`) needs ``model``.
        """
        if self.loss is None and self.data is not None and "dataset" in self.data:
            default = dataset_source(self.data).loss
            if default is not None:
                return build_component("loss", {"type": default}, model)
        return self._component("loss", model)

    def _component(self, table: str, model: Operator | None = None) -> Any:
        spec = getattr(self, table)
        return None if spec is None else build_component(table, spec, model)

    def build_trainer(self, model: Operator) -> Any:
        """A Trainer for ``model`` with this config's loss, optimizer, scheduler and top-level keys."""
        settings = dict(self.trainer)
        for key in settings:
            if key not in TRAINER_KEYS:
                raise ConfigError(f"{key!r} is not an argument of this Trainer; remove it from the config")
        loss, optimizer, scheduler = self.build_loss(model), self._component("optimizer"), self._component("scheduler")
        if "checkpoint_dir" in settings:
            settings["checkpoint_dir"] = self.path(settings["checkpoint_dir"])
        try:
            return Trainer(model, loss=loss, optimizer=optimizer, scheduler=scheduler,
                           options=TrainerOptions(**settings))
        except (ValueError, TypeError) as exc:
            raise ConfigError(str(exc)) from exc

    def build_data(self) -> tuple[Any, Any | None]:
        """``(train, test)`` datasets; test is None when the config names none."""
        if self.data is None:
            raise ConfigError("the config has no [data] table; add dataset = \"mnist\" or train = \"<file>.npz\"")
        if "dataset" in self.data:
            source = dataset_source(self.data, self.path)
            try:
                train, test = source.load()
            except ValueError as exc:  # a value the data set refuses once it sees the data (too short a series)
                raise ConfigError(f"[data] {exc}") from exc
            return train, test
        test = self.data.get("test")
        return self._npz("train"), None if test is None else self._npz("test")

    def build_test_data(self) -> Any | None:
        """The held-out dataset alone (None when the config names none), for a command that only evaluates.

        An ``.npz`` config reads only its test file. A data set builds only its
        held-out split when its source has ``load_test()`` (an optional
        :class:`~neuroflow.data.dataset.DatasetSource` method); otherwise both
        splits are loaded and the training one is dropped.
        """
        if self.data is None:
            return self.build_data()[1]  # raises the missing [data] table's error
        if "dataset" not in self.data:
            return self._npz("test") if "test" in self.data else None
        source = dataset_source(self.data, self.path)
        load_test = getattr(source, "load_test", None)
        try:
            return load_test() if load_test is not None else source.load()[1]
        except ValueError as exc:  # as in build_data: a value the data set refuses once it sees the data
            raise ConfigError(f"[data] {exc}") from exc

    def _npz(self, key: str) -> Any:
        from neuroflow.data import ArrayDataset  # lazy: importing neuroflow.data would slow every CLI start

        path = self.path(self.data[key]) if self.data else Path()
        if not path.is_file():
            raise ConfigError(f"[data] {key}: file {str(path)!r} not found")
        try:
            with np.load(path) as arrays:
                found = list(arrays.files)
                x, y = (arrays[k] if k in found else None for k in ("x", "y"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"[data] {key}: cannot read {path} as .npz: {exc}") from exc
        if x is None or y is None:
            raise ConfigError(f"[data] {key}: {path} must hold arrays 'x' and 'y'; it has: {', '.join(found) or 'none'}")
        # Models are float32 unless told otherwise; integer images would fail every op's dtype check.
        return ArrayDataset(x.astype(np.float32, copy=False) if x.dtype != np.float32 else x, y)


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML config file."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return Config.from_dict(raw, source=path.resolve())


def resolve_model_config(spec: str) -> Config:
    """A config from a TOML file, or from a registered model name (``resnet18``) when no such file exists."""
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        return load_config(path)

    if spec not in registry.models:
        raise UnknownNameError("model", spec, registry.models.names(),
                               registry.KNOWN_PROVIDERS["neuroflow_models"].get(spec))
    return Config(model={"name": spec})
