"""``neuroflow predict CONFIG --model FILE IMAGE.png``: what a saved model sees in one picture.

For a model whose loss's evaluator finds objects (a detector: see
:class:`~neuroflow.losses.evaluation.FindsObjects`) it prints the objects and,
with ``--out boxes.png``, draws them on the picture with their class and
score; for any other model it prints the top classes of the loss's
predictions (a classifier's probabilities). Pictures are read and drawn with
matplotlib, an optional extra: ``pip install 'neuroflow-core[plot]'``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from neuroflow.cli.arguments import positive_int
from neuroflow.cli.evaluate import trained_model
from neuroflow.config import load_config
from neuroflow.errors import ConfigError
from neuroflow.losses.evaluation import FindsObjects, evaluator_of

HELP = "run a saved model on one PNG picture: draw the objects a detector finds, or print a classifier's top classes"
INSTALL = "pip install 'neuroflow-core[plot]' (or pip install matplotlib)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.toml", help="the training configuration (its [model] and [loss])")
    parser.add_argument("image", metavar="IMAGE.png", help="the picture (grey or colour PNG)")
    parser.add_argument("--model", metavar="FILE", required=True, help="the saved model (neuroflow train --save)")
    parser.add_argument("--out", metavar="PNG", help="draw the objects found on the picture and write it here")
    parser.add_argument("--conf", type=float, default=0.25, help="the lowest score of an object shown (default 0.25)")
    parser.add_argument("--top", type=positive_int, default=3, help="how many classes to print for a classifier")


def _matplotlib() -> Any:
    """matplotlib, drawing off-screen (Agg), with its image, patches and pyplot modules loaded."""
    try:
        import matplotlib  # lazy: an optional extra, only this command and mem-profile --png need it
    except ImportError:
        raise ConfigError(f"neuroflow predict reads and draws pictures with matplotlib, which is not installed: "
                          f"{INSTALL}") from None
    matplotlib.use("Agg")
    import matplotlib.image
    import matplotlib.patches
    import matplotlib.pyplot  # noqa: F401  (loaded for draw)

    return matplotlib


def read_picture(path: Path) -> np.ndarray:
    """The PNG at ``path`` as float32 (H, W) grey or (H, W, 3) colour values in [0, 1]."""
    if not path.is_file():
        raise ConfigError(f"picture {str(path)!r} not found")
    image_module = _matplotlib().image
    try:
        image = np.asarray(image_module.imread(path), dtype=np.float32)
    except (OSError, ValueError, SyntaxError) as exc:
        raise ConfigError(f"cannot read {str(path)!r} as a PNG picture: {exc}") from exc
    if image.dtype.kind == "u" or image.max(initial=0) > 1:
        image = image / 255.0
    if image.ndim == 3:
        image = image[..., :3]  # drop alpha
        if np.allclose(image, image[..., :1]):
            image = image[..., 0]
    return image


def model_input(image: np.ndarray, shape: tuple[int, ...] | None) -> np.ndarray:
    """A batch of one sample from ``image``: NCHW, grey as one channel, reshaped to ``[model] input_shape`` if given."""
    sample = image[None] if image.ndim == 2 else np.moveaxis(image, -1, 0)
    if shape is not None:
        if sample.size != int(np.prod(shape)):
            raise ConfigError(f"the picture is {' x '.join(map(str, image.shape))} ({sample.size} values); the model "
                              f"takes input_shape {list(shape)} ({int(np.prod(shape))} values)")
        sample = sample.reshape(shape)
    return np.ascontiguousarray(sample[None], dtype=np.float32)


def draw(image: np.ndarray, objects: np.ndarray, out: Path) -> None:
    """Write ``image`` with ``objects`` (rows x1, y1, x2, y2, score, class) drawn as labelled boxes to ``out``."""
    matplotlib = _matplotlib()
    plt = matplotlib.pyplot
    height, width = image.shape[:2]
    scale = max(1.0, 480 / max(height, width))  # small canvases are drawn larger, so the labels are legible
    fig = plt.figure(figsize=(width * scale / 100, height * scale / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(image, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_axis_off()
    colours = matplotlib.colormaps["tab10"]
    for x1, y1, x2, y2, score, cls in objects:
        colour = colours(int(cls) % 10)
        ax.add_patch(matplotlib.patches.Rectangle((x1 - 0.5, y1 - 0.5), x2 - x1, y2 - y1, fill=False,
                                                  edgecolor=colour, linewidth=2))
        ax.text(x1 - 0.5, y1 - 0.5, f"{int(cls)} {score:.2f}", color="white", fontsize=9, va="bottom",
                bbox={"facecolor": colour, "edgecolor": "none", "pad": 1})
    fig.savefig(out, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    image = read_picture(Path(args.image))
    out = None if args.out is None else Path(args.out)
    trainer = trained_model(config, args.model)
    evaluator = evaluator_of(trainer.loss)
    if out is not None and not isinstance(evaluator, FindsObjects):
        raise ConfigError(f"--out draws the objects a detector finds; the loss {type(trainer.loss).__name__} "
                          "finds no objects (leave out --out to print the top classes)")
    predictions = trainer.predict(model_input(image, config.input_shape))
    if isinstance(evaluator, FindsObjects):
        found = np.asarray(evaluator.objects(predictions)[0])
        found = found[found[:, 4] >= args.conf] if len(found) else found.reshape(0, 6)
        print(f"{len(found)} object(s) with score >= {args.conf:g} in {args.image}:")
        for x1, y1, x2, y2, score, cls in found:
            print(f"  class {int(cls)}  score {score:.3f}  box ({x1:.1f}, {y1:.1f}, {x2:.1f}, {y2:.1f})")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            draw(image, found, out)
            print(f"wrote {out}")
        return 0
    scores = predictions.reshape(len(predictions), -1)[0]
    top = np.argsort(-scores, kind="stable")[:args.top]
    print(f"top classes of {args.image}:")
    for cls in top:
        print(f"  class {int(cls)}  {scores[cls]:.4f}")
    return 0
