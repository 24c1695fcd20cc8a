"""The Optimizer interface: one vectorised update of a FlatParameters' data from its gradient."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from neuroflow.backends.namespaces import array_namespace
from neuroflow.buffers.flat import FlatParameters
from neuroflow.errors import ConfigError
from neuroflow.tensor import Tensor

#: Elements per chunk of the generic update: the scratch buffer's size. 2^16 float32 values (256 KiB) stay in
#: L2 across the handful of passes an update makes, and 170 chunks of ResNet-18 cost ~1 ms of call overhead.
CHUNK = 1 << 16


def to_host(array: Any) -> np.ndarray:
    """A host numpy copy of a device or host array."""
    if isinstance(array, np.ndarray):
        return array.copy()
    if hasattr(array, "get"):  # cupy and cupy-like device arrays
        return np.asarray(array.get())
    return np.array(array)


def check_range(
    owner: str, name: str, value: float, low: float, high: float = math.inf, *, low_open: bool = False,
    high_open: bool = True,
) -> float:
    """Return ``value`` as a float, or raise ConfigError naming ``owner``, the argument and the accepted range.

    A number is an int or a float (numpy's included), never a bool or a string: ``lr="0.01"`` is refused.
    """
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ConfigError(f"{owner}: {name} must be a number; got {value!r} ({type(value).__name__})")
    number = float(value)
    above_low = number > low if low_open else number >= low
    below_high = number < high if high_open else number <= high
    if not (math.isfinite(number) and above_low and below_high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f"{owner}: {name} must be a finite number in {interval}; got {value!r}")
    return number


class Optimizer:
    """Updates parameters held in a :class:`FlatParameters` in one vectorised pass over the flat buffer.

    An optimizer is created from hyperparameters alone, then :meth:`bind`
    allocates its state (zeroed, same array module and dtype as the flat data)
    and a scratch buffer of :data:`CHUNK` elements once. After that,
    :meth:`step` allocates nothing: it works in place and through ``out=``
    into those buffers, a chunk of the flat buffer at a time (a handful of
    vectorised calls per chunk, the same values as one pass over everything).

    Subclasses list their state arrays in :meth:`state_names` and implement
    :meth:`_update`, usually as a loop over :meth:`_chunks`; :meth:`get_config`
    returns their constructor arguments.
    """

    backend: Any = None  # given to :meth:`bind`; its fused update kernels replace the generic code where it has them

    def __init__(self, lr: float) -> None:
        self.lr = check_range(type(self).__name__, "lr", lr, 0.0, low_open=True)
        self.step_count = 0
        self.state: dict[str, Any] = {}
        self._flat: FlatParameters | None = None
        self._xp: Any = np
        self._scratch: Any = None
        self._pending: dict[str, np.ndarray] | None = None

    # ---------------------------------------------------------------- configuration
    def get_config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this optimizer (saved in checkpoints)."""
        return {"lr": self.lr}

    def state_names(self) -> tuple[str, ...]:
        """Names of the flat state arrays this optimizer keeps between steps (saved in checkpoints)."""
        return ()

    def state_nbytes(self, size: int, itemsize: int) -> int:
        """Bytes :meth:`bind` allocates for ``size`` parameters of ``itemsize`` bytes: state plus one scratch chunk."""
        return (len(self.state_names()) * size + min(size, CHUNK)) * itemsize

    # ---------------------------------------------------------------- binding
    @property
    def flat(self) -> FlatParameters:
        """The flat parameters this optimizer updates; raises before :meth:`bind`."""
        if self._flat is None:
            raise RuntimeError(
                f"{type(self).__name__} is not bound to parameters; "
                "call opt.bind(flat) or opt.bind_parameters(params) before step()"
            )
        return self._flat

    def fused(self, name: str) -> Any:
        """The backend's fused kernel ``name`` when :meth:`bind` was given a backend, else None."""
        return None if self.backend is None else self.backend.fused(name, self.flat.data)

    def bind(self, flat: FlatParameters, backend: Any = None) -> None:
        """Attach to ``flat`` and allocate zeroed state and scratch buffers; the step count restarts at 0.

        ``backend`` (the one ``flat`` lives on) lends its fused update kernels, where it has them.

        State loaded with :meth:`load_state_dict` before binding is copied in
        here instead, and its step count kept.
        """
        if flat.data.ndim != 1 or flat.grad.shape != flat.data.shape:
            raise ValueError(
                f"{type(self).__name__}.bind expects 1-D data and grad of equal size; "
                f"got data {tuple(flat.data.shape)} and grad {tuple(flat.grad.shape)}"
            )
        xp = array_namespace(flat.data)
        size, dtype = int(flat.data.size), flat.data.dtype
        pending = self._pending
        if pending is not None:
            self._check_sizes(pending, size)
        self._pending = None
        self._flat, self._xp, self.backend = flat, xp, backend
        self.state = {name: xp.zeros(size, dtype=dtype) for name in self.state_names()}
        self._scratch = xp.empty(min(size, CHUNK), dtype=dtype)
        if pending is None:
            self.step_count = 0
        else:
            self._copy_state_in(pending)

    def rebind(self, flat: FlatParameters, backend: Any = None) -> None:
        """Attach to ``flat``, the same model's parameters packed again (some frozen or unfrozen since): each
        parameter in both keeps its state, one new to the optimizer starts at zero, and the step count goes on
        (as PyTorch's optimizer keeps the state of the parameters still training when others are frozen)."""
        old, old_state, count = self._flat, self.state, self.step_count
        pending = self._pending is not None  # state loaded for the parameters this binding brings: it wins
        self.bind(flat, backend)
        if old is None or pending:
            return
        self.step_count = count
        before = {id(p): view for p, view in zip(old.params, old.slices)}
        for p, view in zip(flat.params, flat.slices):
            source = before.get(id(p))
            if source is not None:
                for name, array in self.state.items():
                    array[view] = old_state[name][source]

    def bind_parameters(self, params: list[Tensor]) -> FlatParameters:
        """Pack ``params`` into a new :class:`FlatParameters` (their data and grad become views), bind it, return it."""
        if not params:
            raise ValueError(f"{type(self).__name__}.bind_parameters got no parameters")
        flat = FlatParameters(params, array_namespace(params[0].data))
        self.bind(flat)
        return flat

    # ---------------------------------------------------------------- update
    def step(self, lr: float | None = None) -> None:
        """Update ``flat.data`` in place from ``flat.grad``; ``lr`` (a scheduler's value) overrides ``self.lr``."""
        flat = self.flat
        lr = self.begin_step(lr)
        self._update(flat.data, flat.grad, lr, self.state)

    def begin_step(self, lr: float | None = None) -> float:
        """Count a step whose updates then come parameter by parameter through :meth:`update_slice`; returns
        the learning rate to pass them (``lr``, a scheduler's value, or ``self.lr``), checked."""
        # A Python float keeps numpy from promoting float32 buffers (and allocating cast buffers).
        lr = self.lr if lr is None else float(lr)
        if not (math.isfinite(lr) and lr >= 0.0):
            raise ValueError(f"{type(self).__name__}.step: lr must be a finite number >= 0; got {lr!r}")
        self.step_count += 1
        return lr

    def update_slice(self, view: slice, grad: Any, lr: float) -> None:
        """Apply the step :meth:`begin_step` counted to ``flat.data[view]``, one parameter's elements, from
        ``grad`` (its gradient, any shape of that size): the same values as :meth:`step` gives them."""
        state = {name: array[view] for name, array in self.state.items()}
        self._update(self.flat.data[view], grad.reshape(-1), lr, state)

    def _update(self, data: Any, grad: Any, lr: float, state: dict[str, Any]) -> None:
        """Apply step number ``self.step_count`` (1-based) to ``data`` in place, with the matching elements of
        the state arrays in ``state``, allocating nothing."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _update")

    def _chunks(self, *arrays: Any) -> Any:
        """Yield ``(*chunks, scratch)``: matching slices of the flat ``arrays`` and a scratch of their length."""
        size, step = int(arrays[0].shape[0]), int(self._scratch.shape[0])
        for start in range(0, size, step):
            stop = min(start + step, size)
            yield (*(a[start:stop] for a in arrays), self._scratch[:stop - start])

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Type, step count, hyperparameters and state arrays (host numpy copies) for a checkpoint."""
        if self._pending is not None:
            state = {name: array.copy() for name, array in self._pending.items()}
        else:
            state = {name: to_host(array) for name, array in self.state.items()}
        return {"type": type(self).__name__, "step": self.step_count, "hyperparameters": self.get_config(),
                "state": state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; before :meth:`bind` the arrays wait until binding."""
        kind = state_dict.get("type")
        if kind != type(self).__name__:
            raise ValueError(f"state_dict is for optimizer {kind!r}; this optimizer is {type(self).__name__}")
        # Constructing a fresh instance validates the saved hyperparameters.
        saved_config = type(self)(**state_dict["hyperparameters"])
        step = int(state_dict["step"])
        saved = {name: np.asarray(array) for name, array in state_dict["state"].items()}
        expected = sorted(saved_config.state_names())
        # No arrays at step 0: saved before it was ever bound, so the state is fresh zeros.
        if (saved or step) and sorted(saved) != expected:
            raise ValueError(f"{type(self).__name__} state_dict holds state {sorted(saved)}; expected {expected}")
        if self._flat is not None:
            self._check_sizes(saved, self._flat.size)
        for name, value in saved_config.get_config().items():
            setattr(self, name, value)
        if self._flat is None:
            self._pending = saved or None
        else:
            flat = self._flat
            self.state = {name: self._xp.zeros_like(flat.data) for name in self.state_names()}
            self._copy_state_in(saved)
        self.step_count = step

    def _check_sizes(self, saved: dict[str, np.ndarray], size: int) -> None:
        for name, array in saved.items():
            if array.shape != (size,):
                raise ValueError(
                    f"{type(self).__name__} state {name!r} has shape {array.shape}; "
                    f"the bound parameters need ({size},)"
                )

    def _copy_state_in(self, saved: dict[str, np.ndarray]) -> None:
        self._check_sizes(saved, self.flat.size)
        for name, array in saved.items():
            self.state[name][...] = self._xp.asarray(array.astype(self.flat.data.dtype, copy=False))

    def __repr__(self) -> str:
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"
