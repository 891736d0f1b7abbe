"""DataModules: image and tabular data, splits, and fixed disjoint teacher partitions."""

from datamodules.base import DataError, GenerativeDataModule, shared_released_spec
from datamodules.image import ImageDataModule
from datamodules.partition import TeacherBatches, TeacherPartition
from datamodules.tabular import ColumnSpec, TabularDataModule, TabularTransformer, infer_schema

__all__ = [
    "ColumnSpec", "DataError", "GenerativeDataModule", "ImageDataModule", "TabularDataModule",
    "TabularTransformer", "TeacherBatches", "TeacherPartition", "infer_schema", "shared_released_spec",
]
