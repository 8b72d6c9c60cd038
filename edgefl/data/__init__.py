"""Datasets (bundled digits, torchvision ones) and federated partitions."""

from edgefl.data.datasets import DATASETS, Dataset, load_dataset
from edgefl.data.partition import PARTITIONS, ClientSplit, split_clients
from edgefl.registry import import_folder

import_folder(__name__, __path__)  # a dataset's own file registers it (edgefl.data.datasets.register)

__all__ = ["DATASETS", "PARTITIONS", "ClientSplit", "Dataset", "load_dataset", "split_clients"]
