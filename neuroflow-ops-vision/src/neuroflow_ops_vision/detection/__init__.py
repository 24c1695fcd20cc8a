"""Object detection: digit canvases, NeuroFlow-YOLO-lite, its loss, NMS and mAP@0.5."""
