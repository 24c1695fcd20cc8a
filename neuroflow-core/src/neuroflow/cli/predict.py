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
from neuroflow.cli.evaluate import trained_model, writable_directory
from neuroflow.config import load_config
from neuroflow.errors import ConfigError
from neuroflow.losses.evaluation import FindsObjects, evaluator_of

HELP = "run a saved model on one PNG picture: draw the objects a detector finds, or print a classifier's top classes"
INSTALL = "pip install 'neuroflow-core[plot]' (or pip install matplotlib)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.toml", help="the training configuration (its [model] and [loss])")
    parser.add_argument("image", metavar="IMAGE.png", help="the picture (grey or colour PNG or JPEG; another size than "
                                                             "the detector's is letterboxed to it)")
    parser.add_argument("--model", metavar="FILE", required=True, help="the saved model (neuroflow train --save)")
    parser.add_argument("--out", metavar="PNG", help="draw the objects found on the picture and write it here (a "
                                                      "file name ending in .png, or another format matplotlib "
                                                      "writes: .jpg, .pdf, .svg, ...)")
    parser.add_argument("--conf", type=score_arg, default=0.25,
                        help="the lowest score of an object shown, from 0 to 1 (default 0.25)")
    parser.add_argument("--top", type=positive_int, default=3, help="how many classes to print for a classifier")
    parser.add_argument("--agnostic", action=argparse.BooleanOptionalAction, default=True,
                        help="one box per object: boxes of any class suppress each other (the default); "
                             "--no-agnostic suppresses within a class only, as mAP is measured")


def score_arg(text: str) -> float:
    """An argparse type: a score from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a score from 0 to 1; got {text!r}") from None
    if not 0 <= value <= 1:  # nan too
        raise argparse.ArgumentTypeError(f"expected a score from 0 to 1; got {text}")
    return value


def out_path(text: str) -> Path:
    """``--out FILE``, checked before the model runs: a picture format matplotlib writes (its name's ending), not a
    directory, in a directory that is created now and writable. ConfigError otherwise."""
    path = Path(text)
    if path.is_dir():
        raise ConfigError(f"--out: {text!r} is a directory; give a picture file name, such as "
                          f"{str(path / 'boxes.png')!r}")
    formats = matplotlib_modules().backend_bases.FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        ending = f"ends in {path.suffix!r}" if path.suffix else "has no ending"
        raise ConfigError(f"--out: {text!r} {ending}; give a file name ending in .png (or another format "
                          f"matplotlib writes: {', '.join(sorted(formats))})")
    writable_directory(str(path.parent), "--out")
    return path


def matplotlib_modules() -> Any:
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
    """The picture at ``path`` (PNG, or JPEG and what else Pillow reads) as float32 (H, W) grey or (H, W, 3) colour
    values in [0, 1]: 8- and 16-bit PNGs, grey with alpha, and 8-bit JPEGs all come out alike."""
    if path.is_dir():
        raise ConfigError(f"picture {str(path)!r} is a directory; give one picture file (IMAGE.png)")
    if not path.is_file():
        raise ConfigError(f"picture {str(path)!r} not found")
    image_module = matplotlib_modules().image
    try:
        raw = np.asarray(image_module.imread(path))
    except (OSError, ValueError, SyntaxError) as exc:
        raise ConfigError(f"cannot read {str(path)!r} as a picture (PNG or JPEG): {exc}") from exc
    if raw.ndim not in (2, 3) or raw.size == 0 or (raw.ndim == 3 and raw.shape[2] not in (1, 2, 3, 4)):
        raise ConfigError(f"{str(path)!r} holds an array of shape {raw.shape}; expected a grey or colour picture")
    # matplotlib gives PNGs as floats in [0, 1], other formats (JPEG) as integers of their bit depth
    image = raw.astype(np.float32) / float(np.iinfo(raw.dtype).max) if raw.dtype.kind in "ui" else raw.astype(np.float32)
    if image.ndim == 3:
        image = image[..., :3] if image.shape[2] >= 3 else image[..., 0]  # drop alpha
    if image.ndim == 3 and np.allclose(image, image[..., :1]):
        image = image[..., 0]
    return np.ascontiguousarray(image)


def as_channels(image: np.ndarray, channels: int | None) -> np.ndarray:
    """``image`` with the model's number of channels: colour made grey (ITU-R 601 luma) for a one-channel model,
    grey repeated for a three-channel one."""
    if channels == 1 and image.ndim == 3:
        return np.asarray(image @ np.array([0.299, 0.587, 0.114], dtype=np.float32), dtype=np.float32)
    if channels == 3 and image.ndim == 2:
        return np.repeat(image[..., None], 3, axis=2)
    return image


def letterbox(image: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    """``image`` scaled (bilinear, aspect kept) so its longer side is ``size`` and padded with black at the right
    and bottom to ``size`` x ``size``, as YOLOv5 letterboxes; with the scale (model pixels per picture pixel)."""
    height, width = image.shape[:2]
    scale = size / max(height, width)
    if (height, width) == (size, size):
        return image, 1.0
    new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
    ys = np.clip((np.arange(new_h) + 0.5) / scale - 0.5, 0, height - 1)
    xs = np.clip((np.arange(new_w) + 0.5) / scale - 0.5, 0, width - 1)
    y0, x0 = np.floor(ys).astype(np.int64), np.floor(xs).astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, height - 1), np.minimum(x0 + 1, width - 1)
    wy, wx = (ys - y0).astype(np.float32), (xs - x0).astype(np.float32)
    if image.ndim == 3:
        wy, wx = wy[:, None], wx[:, None]
    top = image[y0][:, x0] * (1 - wx[None]) + image[y0][:, x1] * wx[None]
    bottom = image[y1][:, x0] * (1 - wx[None]) + image[y1][:, x1] * wx[None]
    scaled = top * (1 - wy[:, None]) + bottom * wy[:, None]
    out = np.zeros((size, size) + image.shape[2:], dtype=np.float32)
    out[:new_h, :new_w] = scaled
    return out, scale


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
    plt = matplotlib_modules().pyplot
    fig = labelled_figure(image, objects)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def labelled_figure(image: np.ndarray, objects: np.ndarray) -> Any:
    """A matplotlib Figure of ``image`` with ``objects`` (rows x1, y1, x2, y2, score, class) drawn as labelled boxes.

    Each label sits on its box's top-left corner, inside the box when there is
    no room above it; a label that would cover one already drawn (objects
    close together) moves down, then up, by its height until it is clear, and
    none leaves the picture, so every label stays readable.
    """
    matplotlib = matplotlib_modules()
    height, width = image.shape[:2]
    scale = max(1.0, 480 / max(height, width))  # small canvases are drawn larger, so the labels are legible
    fig = matplotlib.pyplot.figure(figsize=(width * scale / 100, height * scale / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(image, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_axis_off()
    colours = matplotlib.colormaps["tab10"]
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []  # the labels' boxes on the canvas (display pixels)
    for x1, y1, x2, y2, score, cls in objects:
        colour = colours(int(cls) % 10)
        ax.add_patch(matplotlib.patches.Rectangle((x1 - 0.5, y1 - 0.5), x2 - x1, y2 - y1, fill=False,
                                                  edgecolor=colour, linewidth=2))
        label = ax.text(x1 - 0.5, y1 - 0.5, f"{int(cls)} {score:.2f}", color="white", fontsize=9, va="bottom",
                        bbox={"facecolor": colour, "edgecolor": "none", "pad": 1})
        place_label(label, placed, renderer)
    return fig


def place_label(label: Any, placed: list[Any], renderer: Any, tries: int = 12) -> None:
    """Move ``label`` (a matplotlib Text) into the picture, then down or up by its height until it overlaps none of
    ``placed``, staying inside the picture; add it. A label with no room above its anchor goes below it."""
    start = label.get_window_extent(renderer).expanded(1.05, 1.1)
    picture = label.figure.bbox
    transform = label.axes.transData
    x, y = transform.transform(label.get_position())
    below = -start.height if start.y1 > picture.y1 else 0.0  # no room above the box: inside it, under its top edge
    dx = min(0.0, picture.x1 - start.x1) or max(0.0, picture.x0 - start.x0)  # past the right or left edge: back in
    dy = min(0.0, picture.y1 - start.y1 - below) or max(0.0, picture.y0 - start.y0 - below)
    start, x, y = start.translated(dx, below + dy), x + dx, y + below + dy
    for step in range(tries + 1):
        shift = (step + 1) // 2 * start.height * (1 if step % 2 else -1)  # 0, down, up, 2 down, 2 up, ...
        box = start.translated(0, shift)
        if _within(box, picture) and not any(box.overlaps(other) for other in placed):
            label.set_position(transform.inverted().transform((x, y + shift)))
            placed.append(box)
            return
    label.set_position(transform.inverted().transform((x, y)))  # crowded beyond ``tries`` heights: where it fits
    placed.append(start)


def _within(box: Any, picture: Any, slack: float = 1e-6) -> bool:
    """Whether ``box`` lies inside ``picture`` (display pixels; ``slack`` for the rounding of a box moved flush)."""
    return bool(picture.x0 - slack <= box.x0 and box.x1 <= picture.x1 + slack
                and picture.y0 - slack <= box.y0 and box.y1 <= picture.y1 + slack)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    image = read_picture(Path(args.image))
    out = None if args.out is None else out_path(args.out)
    trainer = trained_model(config, args.model)
    evaluator = evaluator_of(trainer.loss)
    if out is not None and not isinstance(evaluator, FindsObjects):
        raise ConfigError(f"--out draws the objects a detector finds; the loss {type(trainer.loss).__name__} "
                          "finds no objects (leave out --out to print the top classes)")
    image = as_channels(image, getattr(trainer.model, "in_channels", None))
    if isinstance(evaluator, FindsObjects):
        return _detect(args, trainer, evaluator, image, out)
    predictions = trainer.predict(model_input(image, config.input_shape))
    if predictions.ndim != 2:  # a detector's boxes, a map: scores per class they are not
        raise ConfigError(f"--model: the model gives outputs of shape {tuple(predictions.shape)} per batch, not the "
                          f"(batch, classes) scores of a classifier, which the config's loss "
                          f"({type(trainer.loss).__name__}) reads; use the config the model was trained with")
    scores = predictions[0]
    top = np.argsort(-scores, kind="stable")[:args.top]
    print(f"top classes of {args.image}:")
    for cls in top:
        print(f"  class {int(cls)}  {scores[cls]:.4f}")
    return 0


def _detect(args: argparse.Namespace, trainer: Any, evaluator: FindsObjects, image: np.ndarray,
            out: Path | None) -> int:
    """Find, print and (with ``--out``) draw the objects in ``image``; a picture of another size than the
    detector's is letterboxed to it and the boxes mapped back onto the picture."""
    size = getattr(trainer.model, "image_size", None)
    sample, scale = (image, 1.0) if size is None else letterbox(image, int(size))
    if scale != 1.0:
        print(f"the picture is {image.shape[1]} x {image.shape[0]} px; the detector takes {size} x {size}: "
              f"scaled by {scale:.3g} and padded (letterboxed), boxes mapped back")
    predictions = trainer.predict(model_input(sample, None))
    found = np.asarray(evaluator.objects(predictions, agnostic=args.agnostic)[0], dtype=np.float32).reshape(-1, 6)
    found = found[found[:, 4] >= args.conf]
    found[:, :4] = np.clip(found[:, :4] / scale, 0, [image.shape[1], image.shape[0]] * 2)
    print(f"{len(found)} object(s) with score >= {args.conf:g} in {args.image}:")
    for x1, y1, x2, y2, score, cls in found:
        print(f"  class {int(cls)}  score {score:.3f}  box ({x1:.1f}, {y1:.1f}, {x2:.1f}, {y2:.1f})")
    if out is not None:
        draw(image, found, out)
        print(f"wrote {out}")
    return 0
