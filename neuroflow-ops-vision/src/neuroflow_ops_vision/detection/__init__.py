"""Object detection: digit canvases, NeuroFlow-YOLO-lite, its loss, NMS and mAP@0.5.

The parts, bottom to top: :mod:`.canvases`, :mod:`.targets`, :mod:`.dataset` and :mod:`.anchors` (data);
:mod:`.boxes`, :mod:`.nms`, :mod:`.metric` and :mod:`.evaluation` (decoding, suppression, the metric);
:mod:`.assignment`, :mod:`.ciou` and :mod:`.loss` (training); :mod:`.model` (the network). Example::

    from neuroflow_ops_vision.detection import DetectionDataset, DetectionLoss, yolo_lite
    train = DetectionDataset.canvases("train", 2000)
    model = yolo_lite(num_classes=10)
    trainer = nf.Trainer(model, DetectionLoss.for_model(model))
"""

from neuroflow_ops_vision.detection.anchors import kmeans_anchors
from neuroflow_ops_vision.detection.boxes import box_iou, decode
from neuroflow_ops_vision.detection.canvases import digit_canvases
from neuroflow_ops_vision.detection.dataset import DetectionDataset, DigitCanvases
from neuroflow_ops_vision.detection.evaluation import DetectionEvaluator
from neuroflow_ops_vision.detection.loss import DetectionLoss
from neuroflow_ops_vision.detection.metric import mean_average_precision, write_coco_json
from neuroflow_ops_vision.detection.model import YoloLite, yolo_lite
from neuroflow_ops_vision.detection.nms import non_max_suppression
from neuroflow_ops_vision.detection.targets import check_targets, pad_targets, unpad_targets

__all__ = [
    "DetectionDataset", "DetectionEvaluator", "DetectionLoss", "DigitCanvases", "YoloLite", "box_iou",
    "check_targets", "decode", "digit_canvases", "kmeans_anchors", "mean_average_precision", "non_max_suppression",
    "pad_targets", "unpad_targets", "write_coco_json", "yolo_lite",
]
