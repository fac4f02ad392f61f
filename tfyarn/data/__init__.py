"""tfyarn's data layer: TFRecords over any fsspec filesystem, a manifest, an epoch planner with equal steps per
worker, and a prefetching feeder of numpy batches.

Importing this package never imports TensorFlow (gateways have none; ``tfyarn data index`` runs there). Only the
feeder's parser thread imports it, lazily.
"""

from tfyarn.data.errors import DataError, NoDataError
from tfyarn.data.feeder import Feeder
from tfyarn.data.manifest import FileInfo, Manifest, build_manifest, summarize
from tfyarn.data.planner import EpochPlan, RecordRange, plan
from tfyarn.data.synth import write_synthetic
from tfyarn.data.tfrecord import TFRecordWriter
from tfyarn.data.tf_dataset import steps_per_epoch, train_dataset

__all__ = [
    "build_manifest",
    "plan",
    "Feeder",
    "EpochPlan",
    "RecordRange",
    "write_synthetic",
    "summarize",
    "Manifest",
    "FileInfo",
    "DataError",
    "NoDataError",
    "TFRecordWriter",
    "train_dataset",
    "steps_per_epoch",
]
