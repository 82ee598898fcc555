"""Datasets and client partitions (augmentation is a client-side tensor op: ``hetfl.augment``)."""

from .datasets import DATASET_NAMES, Dataset, load_dataset
from .partition import class_histogram, partition, split_train_test

__all__ = ["DATASET_NAMES", "Dataset", "class_histogram", "load_dataset", "partition", "split_train_test"]
