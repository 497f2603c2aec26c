"""Input side: image folders, image files, videos and live captures -> model input tensors.

Everything produces float32 ``[3, H, W]`` frames (or ``[N, 3, H, W]`` batches) in [0, 1],
preprocessed bit-exactly like the reference LingBot-Map loader (see :mod:`.images`).
Video support needs PyAV (``pip install av``), live capture needs OpenCV.

On the output side, :mod:`.atomic` writes every file the package produces (a temp file, then
a rename), so that an interrupted write never leaves a partial file.
"""
from mapstream.io.images import (
    IMAGE_EXTENSIONS,
    list_images,
    load_images,
    natural_sort_key,
    open_image,
    pad_to_common_shape,
    preprocess_image,
    resized_shape,
)
from mapstream.io.sources import FrameSource, open_source
from mapstream.io.video import (
    VIDEO_EXTENSIONS,
    VideoFrame,
    VideoInfo,
    iter_video_frames,
    iter_video_tensors,
    probe_video,
    sample_interval,
)

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "FrameSource",
    "VideoFrame",
    "VideoInfo",
    "iter_video_frames",
    "iter_video_tensors",
    "list_images",
    "load_images",
    "natural_sort_key",
    "open_image",
    "open_source",
    "pad_to_common_shape",
    "preprocess_image",
    "probe_video",
    "resized_shape",
    "sample_interval",
]
