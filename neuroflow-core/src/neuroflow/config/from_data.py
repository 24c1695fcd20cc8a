"""Model options a config computes from the training data: ``[model] anchors = "kmeans"`` for a detector.

A model builder marked with :func:`options_from_data` gets to rewrite the
``[model]`` table's keys once the training set is loaded, before it is
called: yolo_lite (neuroflow-ops-vision) turns ``anchors = "kmeans"`` into the
k-means anchors of the training boxes. The resolver is
``resolver(options, train) -> options``: ``options`` the table's keys (less
``name`` and ``input_shape``), ``train`` the training Dataset; it returns the
keys to call the builder with, and leaves alone what it does not recognise.
A builder with no resolver is called with the table as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

Builder = TypeVar("Builder", bound=Callable[..., Any])
Resolver = Callable[[dict[str, Any], Any], dict[str, Any]]

_ATTRIBUTE = "neuroflow_options_from_data"


def options_from_data(resolver: Resolver) -> Callable[[Builder], Builder]:
    """Mark a model builder: ``resolver(options, train)`` rewrites its config keys from the training set.

    ::

        @options_from_data(anchors_from_data)
        def yolo_lite(num_classes=10, anchors=None, ...): ...
    """

    def mark(builder: Builder) -> Builder:
        setattr(builder, _ATTRIBUTE, resolver)
        return builder

    return mark


def resolver_of(builder: Any) -> Resolver | None:
    """The resolver :func:`options_from_data` gave ``builder``, or None."""
    resolver: Resolver | None = getattr(builder, _ATTRIBUTE, None)
    return resolver
