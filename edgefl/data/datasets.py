"""Datasets as in-memory tensors: scikit-learn's digits (bundled), CIFAR-10, Caltech-256, a user's own
images (`imagefolder`) and `synthetic`.

Images stay in the compact form they load in: CIFAR-10, Caltech-256 and image folders as uint8 in
[0, 255] (Caltech-256 at 224x224 takes 3.6 GB, not the 14 GB of float32), digits and synthetic as
float32 in [0, 1] (small, and drawn or scaled as floats). `to_float` turns a batch into float32 in
[0, 1] where it is used (the training batches, evaluation, the server's samples), on the training
device; a uint8 image v becomes v / 255 in float32, the very value the float dataset held before.
Per-channel mean and std of a uint8 dataset are exact (from a histogram of the 256 levels), so they
may differ from a float32 sum in the last bits.

Digits ship inside scikit-learn, so the quickstart needs no download. `synthetic` draws seeded
uniform images of the shape and class count the scenario asks (`data.synthetic_*`, CIFAR-10's
3x32x32 and 10 classes by default) with uniform labels: nothing to learn, but any model trains
for real on a fresh machine, which is what timing needs.

CIFAR-10 is read from `data.root` in one of three layouts (`LAYOUTS`): (a) a folder holding
torchvision's `cifar-10-batches-py` (read by torchvision, which checks the files' checksums; with
`data.download` it fetches them), (b) an image-folder tree, `train/<class>/<image>` and
`test/<class>/<image>`, at the folder's top or one folder down (`root/cifar10/train/...`), the layout
of torchvision's `ImageFolder` and of the JPEG copies of CIFAR-10 that circulate, or (c) a `.tar` or
`.tar.gz` archive of either, read member by member with `tarfile` (never unpacked outside the cache;
members with absolute paths or `..` are refused). Labels index the sorted class folder names, which
for CIFAR-10's folders is torchvision's class order (`CIFAR10_CLASSES`, alphabetical). `imagefolder`
reads a user's own images in layouts (b) and (c), classes from `data.classes` (empty: the sorted
folder names of train/). Image files are decoded with PIL in sorted path order and each split is kept
in a fixed shuffle of it (so a seed draws the same split from any copy, and `data.test_samples` takes
every class, as from torchvision's mixed batches), grey and RGBA images as RGB, all of one size.

A tree or archive is decoded once: the arrays are kept in `data.cache` as one `.npz` (no pickle) named
by the dataset and the source's digest (`local_arrays`), so later runs read them in seconds.
`data.train_samples` keeps a seeded, class-stratified subset of any dataset's training split, the same
for every run seed (`stratified_subset`).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
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
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
BATCHES = "cifar-10-batches-py"  # torchvision's folder of CIFAR-10's pickled batches
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
    """The dataset, its training split cut to `data.train_samples` (0: all) by `stratified_subset`."""
    data = DATASETS.get(cfg.dataset).load(cfg, where)
    keep = stratified_subset(data.train_y.numpy(), cfg.train_samples)
    if len(keep) == len(data.train_y):
        return data
    index = torch.from_numpy(keep)
    return with_stats(data.train_x[index].numpy(), data.train_y[index].numpy(), data.test_x.numpy(),
                      data.test_y.numpy(), data.num_classes)


def dataset_spec(cfg: DataConfig, where: str = "scenario") -> DatasetSpec:
    """The dataset's shapes and sizes (the training split as `data.train_samples` cuts it); `synthetic`
    takes them from the scenario, `imagefolder` from its images, so a dry run of one's own images
    needs them (read from the cache, or decoded and cached here, once)."""
    spec = DATASETS.get(cfg.dataset)
    if cfg.dataset == "synthetic":
        spec = DatasetSpec(tuple(cfg.synthetic_shape), cfg.synthetic_classes, cfg.synthetic_train, spec.load)
    elif cfg.dataset == "imagefolder":
        a = _imagefolder_arrays(cfg, where)
        spec = DatasetSpec(tuple(a.train_x.shape[1:]), len(a.classes), len(a.train_y), spec.load)
    if 0 < cfg.train_samples < spec.train_samples:
        return replace(spec, train_samples=cfg.train_samples)
    return spec


def stratified_subset(labels: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of `n` of `labels` (0 or at least all: every index), each class's share as in
    `labels` (largest remainders make the total n), drawn with a fixed seed: every run seed, and
    `dataset_spec`, get the same subset."""
    if n <= 0 or n >= len(labels):
        return np.arange(len(labels))
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * n / len(labels)
    take = np.floor(quota).astype(np.int64)
    take[np.argsort(take - quota, kind="stable")[:n - int(take.sum())]] += 1
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(labels == c), k, replace=False)
              for c, k in zip(classes, take, strict=True)]
    return np.sort(np.concatenate(picked))


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
    """CIFAR-10 from `data.root`: an image-folder tree or an archive (`local_arrays`), else
    torchvision's batches (downloaded only with data.download)."""
    root = Path(cfg.root).expanduser()
    if root.is_file() or _tree_top(root, where, cfg.dataset) is not None:
        a = local_arrays(cfg, where)  # labels by the sorted folder names: torchvision's order for CIFAR-10's
        if len(a.classes) != 10 or a.train_x.shape[1:] != (3, 32, 32):
            size = "x".join(map(str, a.train_x.shape[1:]))
            raise EdgeflError(where, "data.dataset", f"CIFAR-10 is 10 classes of 3x32x32 images and {root} "
                              f"holds {len(a.classes)} classes of {size}; read other images with "
                              'data.dataset = "imagefolder"')
        return with_stats(a.train_x, a.train_y, a.test_x, a.test_y, 10)
    if not (root / BATCHES).is_dir() and not cfg.download:
        raise _bad_root(where, root, cfg.dataset, "does not exist" if not root.exists() else
                        "holds no copy in a layout edgefl reads")
    _require(where, "CIFAR-10", root / BATCHES, CIFAR10_FILES, cfg.download)
    train_x, train_y, test_x, test_y = _torchvision_cifar10(root, cfg.download, where)
    return with_stats(train_x, train_y, test_x, test_y, 10)


def _torchvision_cifar10(root: Path, download: bool, where: str) -> tuple[np.ndarray, ...]:
    """torchvision's CIFAR-10 under `root` (its checksums checked) as uint8 N x 3 x 32 x 32 arrays and
    int64 labels: train, then test."""
    try:
        from torchvision.datasets import CIFAR10

        train = CIFAR10(str(root), train=True, download=download)
        test = CIFAR10(str(root), train=False, download=download)
    except (OSError, RuntimeError) as exc:
        raise _unloadable(where, "CIFAR-10", root, exc, download) from None

    def arrays(ds: CIFAR10) -> tuple[np.ndarray, np.ndarray]:
        return (np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)), np.asarray(ds.targets, dtype=np.int64))

    return (*arrays(train), *arrays(test))


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
            where, "data.root",
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


# --- local copies: an image-folder tree or an archive, decoded once into data.cache -------------------

SPLITS = ("train", "test")
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff"})
TREE = ("(b) an image-folder tree, train/<class>/<image> and test/<class>/<image> (PNG, JPEG...), at its "
        "top or one folder down")
LAYOUTS = {  # what data.root may be, per dataset
    "cifar10": f"(a) a folder holding {BATCHES}/ with data_batch_1 ... data_batch_5 and test_batch, {TREE}, "
               "or (c) a .tar or .tar.gz archive of either",
    "imagefolder": f"{TREE}, or (c) a .tar or .tar.gz archive of it",
}
Entry = tuple[str, Callable[[], bytes] | None]  # a path inside the source, and its bytes (None: a folder)


@dataclass(frozen=True)
class Arrays:
    """A local copy as decoded: uint8 N x 3 x H x W images, int64 labels indexing `classes`."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: tuple[str, ...]


@dataclass
class _Found:
    """What one pass over a source's entries found."""

    images: dict[tuple[str, str, str], np.ndarray] = field(default_factory=dict)  # (split, class, file)
    folders: set[tuple[str, str]] = field(default_factory=set)  # (split, class)
    tops: set[str] = field(default_factory=set)  # the folder the tree is in ("" at the top)
    batches: dict[str, bytes] = field(default_factory=dict)  # cifar-10-batches-py's files, by name


@register("imagefolder", (3, 0, 0), 0, 0)  # placeholders: dataset_spec reads the real ones off the images
def imagefolder(cfg: DataConfig, where: str) -> Dataset:
    """A user's own images at `data.root` (an image-folder tree or an archive of one), classes from
    `data.classes` (empty: the sorted folder names of train/)."""
    a = _imagefolder_arrays(cfg, where)
    return with_stats(a.train_x, a.train_y, a.test_x, a.test_y, len(a.classes))


def _imagefolder_arrays(cfg: DataConfig, where: str) -> Arrays:
    return _relabelled(local_arrays(cfg, where), tuple(cfg.classes), where)


CACHE_FORMAT = 2  # the arrays' layout in a cache file (2: each split in a fixed shuffle)


def local_arrays(cfg: DataConfig, where: str) -> Arrays:
    """The copy at `data.root` (an image-folder tree, or an archive of one or of CIFAR-10's batches),
    read from `data.cache` when it holds this source's arrays, else decoded and cached there. The cache
    is `<dataset>-v<CACHE_FORMAT>-<digest>.npz`, the digest the sha256 of an archive's bytes, or, for a
    tree, the sha256 of its sorted relative paths with each file's size and mtime_ns (a changed file
    gives a new digest, so a new cache); a cache whose stored digest or shapes do not match is
    refused and rebuilt."""
    root = Path(cfg.root).expanduser()
    source = root if root.is_file() else _tree_top(root, where, cfg.dataset)
    if source is None:
        raise _bad_root(where, root, cfg.dataset, "does not exist" if not root.exists() else
                        "holds no copy in a layout edgefl reads")
    digest = file_digest(source) if source.is_file() else tree_digest(source)
    path = Path(cfg.cache).expanduser() / f"{cfg.dataset}-v{CACHE_FORMAT}-{digest[:16]}.npz"
    cached = _read_cache(path, digest)
    if cached is not None:
        return cached
    entries = _tar_entries(source, where, cfg.dataset) if source.is_file() else _folder_entries(source)
    found = _collect(entries, source, where, cfg.dataset)
    arrays = (_batch_arrays(found.batches, cfg, source, where) if found.batches
              else _tree_arrays(found, source, where, cfg.dataset))
    _write_cache(path, digest, arrays, where)
    return arrays


def _tree_top(root: Path, where: str, dataset: str) -> Path | None:
    """The folder holding train/ and test/: `root` or the one folder below it that does (None: neither)."""
    if not root.is_dir():
        return None
    if any((root / split).is_dir() for split in SPLITS):
        return root
    below = sorted(d for d in root.iterdir() if d.is_dir() and any((d / s).is_dir() for s in SPLITS))
    if len(below) > 1:
        raise _bad_root(where, root, dataset, f"holds {len(below)} image-folder trees ("
                        f"{', '.join(d.name for d in below)}); point data.root at one of them")
    return below[0] if below else None


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_digest(top: Path) -> str:
    """sha256 over the sorted relative paths under top/train and top/test, each file's with its size
    and mtime_ns: a file added, removed, resized or rewritten changes it, without reading any."""
    h = hashlib.sha256()
    for path in _tree_paths(top):
        stat = path.stat()
        extra = "" if path.is_dir() else f"\0{stat.st_size}\0{stat.st_mtime_ns}"
        h.update(f"{path.relative_to(top).as_posix()}{extra}\n".encode())
    return h.hexdigest()


def _tree_paths(top: Path) -> list[Path]:
    return sorted(p for split in SPLITS if (top / split).is_dir() for p in (top / split).rglob("*"))


def _folder_entries(top: Path) -> Iterator[Entry]:
    for path in _tree_paths(top):
        yield path.relative_to(top).as_posix(), None if path.is_dir() else path.read_bytes


def _tar_entries(archive: Path, where: str, dataset: str) -> Iterator[Entry]:
    """An archive's folders and regular files, streamed (each file's bytes must be read before the next
    entry); links and devices are skipped, a member with an absolute path or `..` stops the read."""

    def unreadable(exc: Exception) -> EdgeflError:
        return _bad_root(where, archive, dataset, f"could not be read as an archive ({exc})")

    try:
        with tarfile.open(archive, "r|*") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts:
                    raise EdgeflError(where, "data.root", f"{archive} holds the member {member.name!r}, a "
                                      "path outside the archive: refused; pack it again with relative paths")
                if member.isdir():
                    yield "/".join(name.parts), None
                elif member.isfile():
                    yield "/".join(name.parts), _member_reader(tar, member, unreadable)
    except UNREADABLE as exc:
        raise unreadable(exc) from None


UNREADABLE = (tarfile.TarError, OSError, EOFError, zlib.error)  # a damaged or truncated archive


def _member_reader(tar: tarfile.TarFile, member: tarfile.TarInfo,
                   unreadable: Callable[[Exception], EdgeflError]) -> Callable[[], bytes]:
    def read() -> bytes:
        try:
            f = tar.extractfile(member)
            return f.read() if f is not None else b""
        except UNREADABLE as exc:
            raise unreadable(exc) from None

    return read


def _collect(entries: Iterator[Entry], source: Path, where: str, dataset: str) -> _Found:
    """One pass over a source: the image-folder tree's folders and decoded images, and (CIFAR-10 only)
    the files of cifar-10-batches-py; anything else is skipped unread."""
    found = _Found()
    for name, read in entries:
        parts = name.split("/")
        if dataset == "cifar10" and len(parts) <= 3 and parts[-2:-1] == [BATCHES] and read is not None:
            found.batches[parts[-1]] = read()
            continue
        top, rest = ("", parts) if parts[0] in SPLITS else (parts[0], parts[1:])
        if not 2 <= len(rest) <= 3 or rest[0] not in SPLITS:
            continue
        found.tops.add(top)
        found.folders.add((rest[0], rest[1]))
        if len(rest) == 3 and read is not None and _is_image(rest[2]):
            found.images[(rest[0], rest[1], rest[2])] = _decode(read(), f"{name} in {source}", where)
    return found


def _is_image(file: str) -> bool:
    return not file.startswith(".") and PurePosixPath(file).suffix.lower() in IMAGE_SUFFIXES


def _decode(data: bytes, label: str, where: str) -> np.ndarray:
    """One image file as uint8 3 x H x W (grey, palette and RGBA images converted to RGB)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise EdgeflError(where, "data.root", f"{label} is not an image PIL can read ({exc}); replace or "
                          "delete it") from None
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def _tree_arrays(found: _Found, source: Path, where: str, dataset: str) -> Arrays:
    """The decoded tree as arrays, each split in a fixed shuffle of its sorted paths, labels indexing
    the sorted class folders of train/; a partial tree or images of two sizes stop here."""
    if len(found.tops) > 1:
        raise _bad_root(where, source, dataset, f"holds {len(found.tops)} image-folder trees "
                        f"({', '.join(sorted(found.tops))}); keep one")
    classes = tuple(sorted(c for s, c in found.folders if s == "train"))
    for part in SPLITS:
        named = tuple(sorted(c for s, c in found.folders if s == part))
        if not named:
            raise _bad_root(where, source, dataset, f"is a partial copy: {part}/ is missing or holds no "
                            "class folders")
        if named != classes:
            raise _bad_root(where, source, dataset, f"is a partial copy: test/'s classes "
                            f"({', '.join(named)}) are not train/'s ({', '.join(classes)})")
    keys = sorted(found.images)
    held = {(s, c) for s, c, _ in keys}
    if empty := [f"{s}/{c}" for s in SPLITS for c in classes if (s, c) not in held]:
        raise _bad_root(where, source, dataset, f"is a partial copy: {', '.join(empty[:3])}"
                        f"{' and more' if len(empty) > 3 else ''} holds no images")
    first = found.images[keys[0]].shape
    for key in keys:
        if (shape := found.images[key].shape) != first:
            raise EdgeflError(where, "data.root", f"{'/'.join(key)} in {source} is {shape[2]}x{shape[1]} "
                              f"pixels and the first image, {'/'.join(keys[0])}, {first[2]}x{first[1]}; all "
                              "images must have one size: resize them first")
    label = {c: i for i, c in enumerate(classes)}

    def split(name: str) -> tuple[np.ndarray, np.ndarray]:
        chosen = [k for k in keys if k[0] == name]
        order = np.random.default_rng(0).permutation(len(chosen))  # classes mixed, as torchvision's
        chosen = [chosen[i] for i in order]  # batches are, so a first-n test subset holds them all
        return (np.stack([found.images.pop(k) for k in chosen]),
                np.array([label[k[1]] for k in chosen], dtype=np.int64))

    (train_x, train_y), (test_x, test_y) = split("train"), split("test")
    return Arrays(train_x, train_y, test_x, test_y, classes)


def _batch_arrays(batches: dict[str, bytes], cfg: DataConfig, archive: Path, where: str) -> Arrays:
    """CIFAR-10's batches found in an archive, read by torchvision from a temporary folder in the cache."""
    if missing := [f for f in CIFAR10_FILES if f not in batches]:
        raise _bad_root(where, archive, cfg.dataset, f"is a partial copy: its {BATCHES}/ lacks "
                        f"{', '.join(missing)}")
    cache = Path(cfg.cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".unpacking-") as folder:
        (Path(folder) / BATCHES).mkdir()
        for name, data in batches.items():
            (Path(folder) / BATCHES / name).write_bytes(data)
        train_x, train_y, test_x, test_y = _torchvision_cifar10(Path(folder), False, where)
    return Arrays(train_x, train_y, test_x, test_y, CIFAR10_CLASSES)


def _relabelled(a: Arrays, classes: tuple[str, ...], where: str) -> Arrays:
    """`a` with labels indexing `classes` (empty: a's own), a subset of its class folders in any order;
    images of the folders it leaves out are dropped."""
    if not classes or classes == a.classes:
        return a
    unknown = sorted(set(classes) - set(a.classes))
    if unknown or len(set(classes)) < len(classes):
        raise EdgeflError(where, "data.classes", f"names {', '.join(unknown) or 'a class twice'}; the class "
                          f"folders are {', '.join(a.classes)}: name each at most once")
    new = np.full(len(a.classes), -1, dtype=np.int64)
    new[[a.classes.index(c) for c in classes]] = np.arange(len(classes))

    def pick(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = new[y] >= 0
        return (x, new[y]) if keep.all() else (x[keep], new[y][keep])

    (train_x, train_y), (test_x, test_y) = pick(a.train_x, a.train_y), pick(a.test_x, a.test_y)
    return Arrays(train_x, train_y, test_x, test_y, classes)


def _read_cache(path: Path, digest: str) -> Arrays | None:
    """The arrays cached at `path`, or None when there are none; a cache of another digest, or damaged,
    or whose shapes do not agree, is refused with a warning (and rebuilt by the caller)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            stored, classes = str(z["digest"]), tuple(str(c) for c in z["classes"])
            a = Arrays(z["train_x"], z["train_y"], z["test_x"], z["test_y"], classes)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        stored = ""
    if stored == digest and _consistent(a):
        return a
    warnings.warn(f"the dataset cache {path} does not hold the arrays of digest {digest[:16]}: refused, "
                  "decoding the source again", stacklevel=3)
    return None


def _consistent(a: Arrays) -> bool:
    labels_ok = all(y.dtype == np.int64 and y.ndim == 1 and (y.size == 0 or 0 <= y.min() <= y.max() <
                                                              len(a.classes)) for y in (a.train_y, a.test_y))
    return (a.train_x.dtype == a.test_x.dtype == np.uint8 and a.train_x.ndim == 4 and a.train_x.shape[1] == 3
            and a.test_x.shape[1:] == a.train_x.shape[1:] and len(a.train_x) == len(a.train_y)
            and len(a.test_x) == len(a.test_y) and labels_ok and len(a.classes) > 0)


def _write_cache(path: Path, digest: str, a: Arrays, where: str) -> None:
    """Write the arrays to `path` through a temporary file and os.replace: a killed run, or a full
    disk, leaves no half-written cache."""
    temp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, digest=np.array(digest), classes=np.array(a.classes), train_x=a.train_x,
                     train_y=a.train_y, test_x=a.test_x, test_y=a.test_y)
        os.replace(temp, path)
    except OSError as exc:
        raise EdgeflError(where, "data.cache", f"cannot write the decoded dataset into {path.parent} "
                          f"({exc}); point data.cache at a writable folder with "
                          f"{(a.train_x.nbytes + a.test_x.nbytes) / 1e6:.0f} MB free") from None
    finally:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def _bad_root(where: str, root: Path, dataset: str, problem: str) -> EdgeflError:
    """data.root is not a copy edgefl reads: what is wrong, the layouts it takes and what to do."""
    fetch = " or rerun with --download (needs the internet) for (a)" if dataset == "cifar10" else ""
    return EdgeflError(where, "data.root", f"{root} {problem}; data.root takes {LAYOUTS[dataset]}: put a "
                       f"complete copy there{fetch}")
