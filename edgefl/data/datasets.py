"""Datasets as in-memory tensors: scikit-learn's digits (bundled), CIFAR-10, Caltech-256 and
`synthetic`.

Images stay in the compact form they load in: CIFAR-10 and Caltech-256 as uint8 in [0, 255] (Caltech-256
at 224x224 takes 3.6 GB, not the 14 GB of float32), digits and synthetic as float32 in [0, 1] (small,
and drawn or scaled as floats). `to_float` turns a batch into float32 in [0, 1] where it is used (the
training batches, evaluation, the server's samples), on the training device; a uint8 image v becomes
v / 255 in float32, the very value the float dataset held before. Per-channel mean and std of a uint8
dataset are exact (from a histogram of the 256 levels), so they may differ from a float32 sum in the
last bits.

Digits ship inside scikit-learn, so the quickstart needs no download. `synthetic` draws seeded
uniform images of the shape and class count the scenario asks (`data.synthetic_*`, CIFAR-10's
3x32x32 and 10 classes by default) with uniform labels: nothing to learn, but any model trains
for real on a fresh machine, which is what timing needs. CIFAR-10 loads through
torchvision from `data.root`; when it is missing, the error names the files and the `--download`
way to fetch them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError

import numpy as np
import psutil
import torch

from edgefl.config import DataConfig
from edgefl.errors import EdgeflError
from edgefl.registry import Registry


@dataclass(frozen=True)
class Dataset:
    train_x: torch.Tensor  # (N, C, H, W) float32 in [0, 1] or uint8 in [0, 255] (see `to_float`)
    train_y: torch.Tensor  # (N,) int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


CIFAR10_FILES = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
Loader = Callable[[DataConfig, str], Dataset]


@dataclass(frozen=True)
class DatasetSpec:
    """What is known without the data: the input shape and classes (for partitions and dry runs)."""

    input_shape: tuple[int, ...]
    num_classes: int
    train_samples: int  # the training split's size (a dry run partitions this many)
    load: Loader


DATASETS: Registry[DatasetSpec] = Registry("dataset", "edgefl.datasets")


def register(name: str, input_shape: tuple[int, ...], classes: int,
             train_samples: int) -> Callable[[Loader], Loader]:
    def add(load: Loader) -> Loader:
        DATASETS.register(name)(DatasetSpec(input_shape, classes, train_samples, load))
        return load

    return add


def load_dataset(cfg: DataConfig, where: str) -> Dataset:
    return DATASETS.get(cfg.dataset).load(cfg, where)


def dataset_spec(cfg: DataConfig) -> DatasetSpec:
    """The dataset's shapes and sizes; `synthetic` takes them from the scenario."""
    spec = DATASETS.get(cfg.dataset)
    if cfg.dataset == "synthetic":
        return DatasetSpec(tuple(cfg.synthetic_shape), cfg.synthetic_classes, cfg.synthetic_train, spec.load)
    return spec


def shapes_only(cfg: DataConfig) -> Dataset:
    """A dataset with its shapes and classes but no samples (dry runs, partitions without data);
    its normalisation is a placeholder."""
    spec = dataset_spec(cfg)
    channels = spec.input_shape[0]
    empty = torch.zeros((0, *spec.input_shape))
    return Dataset(empty, torch.zeros(0, dtype=torch.long), empty, torch.zeros(0, dtype=torch.long),
                   spec.num_classes, (0.5,) * channels, (0.25,) * channels)


def to_float(x: torch.Tensor) -> torch.Tensor:
    """Images as float32 in [0, 1]: uint8 ones divided by 255 (a new tensor), float ones as they are."""
    return x.float().div_(255) if x.dtype == torch.uint8 else x


def with_stats(x: np.ndarray, y: np.ndarray, tx: np.ndarray, ty: np.ndarray,
                classes: int) -> Dataset:
    """Wrap arrays (N, C, H, W: float32 in [0, 1] or uint8) with per-channel mean/std of the
    training split; images keep their dtype."""
    mean, std = _uint8_stats(x) if x.dtype == np.uint8 else (
        tuple(float(v) for v in x.mean(axis=(0, 2, 3))), tuple(float(v) for v in x.std(axis=(0, 2, 3))))
    images = (torch.from_numpy(a) if a.dtype == np.uint8 else torch.from_numpy(a).float() for a in (x, tx))
    train_x, test_x = images
    return Dataset(train_x, torch.from_numpy(y).long(), test_x, torch.from_numpy(ty).long(), classes,
                   mean, std)


def _uint8_stats(x: np.ndarray, chunk: int = 1024) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and std of uint8 images / 255, from each channel's histogram of the 256
    levels, counted `chunk` images at a time (no float copy of the dataset)."""
    counts = np.zeros((x.shape[1], 256), dtype=np.int64)
    for i in range(0, len(x), chunk):
        for c in range(x.shape[1]):
            counts[c] += np.bincount(x[i:i + chunk, c].ravel(), minlength=256)
    levels = np.arange(256, dtype=np.float64) / 255
    n = counts.sum(axis=1)
    mean = counts @ levels / n
    var = counts @ levels**2 / n - mean**2
    return tuple(float(v) for v in mean), tuple(float(v) for v in np.sqrt(np.maximum(var, 0)))


@register("digits", (1, 8, 8), 10, 1437)
def digits(cfg: DataConfig, where: str) -> Dataset:
    """1797 8x8 grey digits from scikit-learn, a fixed 80/20 train/test split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None]
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))  # fixed, so seeds share a test set
    cut = int(0.8 * len(order))
    tr, te = order[:cut], order[cut:]
    return with_stats(images[tr], labels[tr], images[te], labels[te], 10)


@register("cifar10", (3, 32, 32), 10, 50000)
def cifar10(cfg: DataConfig, where: str) -> Dataset:
    """CIFAR-10 through torchvision, from `data.root` (downloaded only with data.download)."""
    root = Path(cfg.root).expanduser()
    _require(where, "CIFAR-10", root / "cifar-10-batches-py", CIFAR10_FILES, cfg.download)
    try:
        from torchvision.datasets import CIFAR10

        train = CIFAR10(str(root), train=True, download=cfg.download)
        test = CIFAR10(str(root), train=False, download=cfg.download)
    except (OSError, RuntimeError) as exc:
        raise _unloadable(where, "CIFAR-10", root, exc, cfg.download) from None

    def arrays(ds: CIFAR10) -> tuple[np.ndarray, np.ndarray]:
        return (np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)), np.asarray(ds.targets, dtype=np.int64))

    return with_stats(*arrays(train), *arrays(test), 10)


@register("caltech256", (3, 224, 224), 256, 23824)
def caltech256(cfg: DataConfig, where: str) -> Dataset:
    """Caltech-256 (256 object classes, the clutter class left out) resized to 224x224, a seeded
    80/20 split. Held in memory as uint8: about 3.6 GB."""
    root = Path(cfg.root).expanduser()
    _require(where, "Caltech-256", root / "caltech256", ["256_ObjectCategories"], cfg.download)
    try:
        from torchvision import transforms
        from torchvision.datasets import Caltech256

        ds = Caltech256(str(root), download=cfg.download, transform=transforms.Compose(
            [transforms.Lambda(lambda im: im.convert("RGB")), transforms.Resize((224, 224)),
             transforms.PILToTensor()]))
    except (OSError, RuntimeError) as exc:
        raise _unloadable(where, "Caltech-256", root, exc, cfg.download) from None
    keep = [i for i, y in enumerate(ds.y) if y < 256]
    x = np.empty((len(keep), 3, 224, 224), dtype=np.uint8)
    for row, i in enumerate(keep):
        x[row] = ds[i][0].numpy()
    y = np.asarray([ds.y[i] for i in keep], dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(order))
    return with_stats(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]], 256)


def available_bytes() -> int:
    """Memory this machine can give now (psutil), what a dataset drawn in memory must fit in."""
    return int(psutil.virtual_memory().available)


@register("synthetic", (3, 32, 32), 10, 5000)
def synthetic(cfg: DataConfig, where: str) -> Dataset:
    """Uniform images of `synthetic_shape` in [0, 1] and uniform labels, drawn from
    `synthetic_seed` (train, then test)."""
    shape, classes = tuple(cfg.synthetic_shape), cfg.synthetic_classes
    images = cfg.synthetic_train + cfg.synthetic_test
    # the images, and the copy of the training images numpy's std makes (the dataset's statistics)
    need, free = 4 * (images + cfg.synthetic_train) * int(np.prod(shape)), available_bytes()
    if need > free:
        raise EdgeflError(where, "data.synthetic_train", f"{images:,} float32 images of "
                          f"{'x'.join(map(str, shape))} need {need / 1e9:.1f} GB and this machine has "
                          f"{free / 1e9:.1f} GB free; draw fewer (data.synthetic_train, data.synthetic_test) "
                          "or smaller ones (data.synthetic_shape)")
    r = np.random.default_rng(cfg.synthetic_seed)
    x = r.random((cfg.synthetic_train, *shape), dtype=np.float32)
    y = r.integers(classes, size=cfg.synthetic_train).astype(np.int64)
    tx = r.random((cfg.synthetic_test, *shape), dtype=np.float32)
    ty = r.integers(classes, size=cfg.synthetic_test).astype(np.int64)
    return with_stats(x, y, tx, ty, classes)


def _require(where: str, name: str, folder: Path, files: list[str], download: bool) -> None:
    """Stop with the missing files named, unless a download was asked for."""
    missing = [f for f in files if not (folder / f).exists()]
    if missing and not download:
        raise EdgeflError(
            where, "data.dataset",
            f"{name} not found: {', '.join(missing)} missing in {folder}; put the files there, "
            "or rerun with --download (needs the internet)")


def _unloadable(where: str, name: str, root: Path, exc: Exception, download: bool) -> EdgeflError:
    """The error of a dataset torchvision could not fetch or read: the download (offline) or, when
    none was asked for, the files under `data.root` (damaged, partial or of another version: their
    checksums are checked before anything is read)."""
    if isinstance(exc, URLError):  # no route to the dataset's server: offline, or a proxy in the way
        return EdgeflError(where, "data.download", f"{name} could not be downloaded ({exc.reason}); "
                           f"without the internet, fetch its files on a connected machine into {root} and "
                           "unpack them there, or leave its archive there and rerun with --download, "
                           "which then only unpacks it")
    if download:
        return EdgeflError(where, "data.download", f"{name} could not be downloaded into {root} ({exc}); "
                           "fetch the files elsewhere, or check that torchvision matches torch")
    return EdgeflError(where, "data.root", f"{name}'s files in {root} could not be read ({exc}): damaged, "
                       "partial or of another version; delete them and put fresh copies there, or rerun "
                       "with --download")
