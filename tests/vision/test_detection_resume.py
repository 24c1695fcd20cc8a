"""A detector's training stopped mid-epoch and resumed from its checkpoint ends bit-identical to a run that never
stopped: the model's BatchNorm statistics, AdamW's state, the cosine schedule, the shuffled order of the canvases
and the epoch's running sums all come back. (``kill -9`` mid-run and ``neuroflow train --resume`` was checked by
hand the same way: bit-identical.)"""

from __future__ import annotations

import numpy as np

import neuroflow as nf
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager
from neuroflow_ops_vision.detection.dataset import DetectionDataset
from neuroflow_ops_vision.detection.loss import DetectionLoss
from neuroflow_ops_vision.detection.model import yolo_lite

EPOCHS = 2


def _data() -> DetectionDataset:
    return DetectionDataset.canvases("train", 12, size=32, max_objects=3, seed=4, scales=(12, 16))


def _trainer(**options: object) -> nf.Trainer:
    nf.manual_seed(3)
    model = yolo_lite(num_classes=10, image_size=32, width=0.25)
    return nf.Trainer(model, DetectionLoss.for_model(model), nf.optim.AdamW(lr=2e-3, weight_decay=5e-4),
                      scheduler=nf.schedulers.Cosine(warmup_steps=2), batch_size=4, seed=5, progress=False,
                      **options)


class StopAt:
    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def neuroflow_step_end(self, trainer: nf.Trainer, step: int) -> None:
        if step == self.step:
            trainer.request_stop()


def test_a_stopped_and_resumed_detector_run_equals_an_uninterrupted_one(tmp_path) -> None:
    data = _data()
    straight = _trainer()
    straight.fit(data, epochs=EPOCHS)

    first = _trainer(checkpoint_dir=tmp_path, checkpoint_every=1)
    stopper = StopAt(4)  # the first step of the second epoch: mid-run, mid-schedule
    plugin_manager().register(stopper)
    try:
        first.fit(data, epochs=EPOCHS)
    finally:
        plugin_manager().unregister(stopper)
    assert first.step == 4 and first.history.interrupted

    nf.manual_seed(999)  # a new process: its generator is whatever it is
    resumed = _trainer(checkpoint_dir=tmp_path)
    assert resumed.resume().step == 4
    resumed.fit(data, epochs=EPOCHS)
    assert resumed.step == straight.step == 6
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)  # running stats included
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]
