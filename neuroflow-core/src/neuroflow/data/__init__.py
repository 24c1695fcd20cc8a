"""Training data: datasets, the DataLoader, the IDX reader and the MNIST-format datasets."""

from neuroflow.data.dataset import ArrayDataset, Dataset, DatasetSource, as_dataset
from neuroflow.data.idx import read_idx
from neuroflow.data.loader import DataLoader
from neuroflow.data.mnist_datasets import fashion_mnist, mnist

__all__ = ["ArrayDataset", "DataLoader", "Dataset", "DatasetSource", "as_dataset", "fashion_mnist", "mnist", "read_idx"]
