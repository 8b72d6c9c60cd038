"""Datasets (bundled digits, torchvision ones) and federated partitions."""

from edgefl.data.datasets import DATASETS, Dataset, load_dataset
from edgefl.data.partition import PARTITIONS, ClientSplit, split_clients

__all__ = ["DATASETS", "PARTITIONS", "ClientSplit", "Dataset", "load_dataset", "split_clients"]
