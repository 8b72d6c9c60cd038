"""CIFAR-10 and a user's own images from a local copy (edgefl.data.datasets.local_arrays): torchvision's
batches, an image-folder tree (at the top or one folder down) and .tar/.tar.gz archives of them, decoded
once into data.cache; data.classes and data.train_samples."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from edgefl.config import DataConfig
from edgefl.data import datasets, split_clients
from edgefl.data.datasets import CIFAR10_CLASSES, dataset_spec, load_dataset, shapes_only, stratified_subset
from edgefl.errors import EdgeflError
from edgefl.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
CLASSES = CIFAR10_CLASSES  # torchvision's order is the alphabetical one: the folders' sorted names
Images = dict[tuple[str, str, str], np.ndarray]  # (split, class, file) -> H x W x 3 uint8


def tiny_images(classes: tuple[str, ...] = CLASSES, size: tuple[int, int] = (32, 32)) -> Images:
    """3 training and 2 test images per class, seeded noise (PNG: the pixels come back exactly)."""
    r = np.random.default_rng(5)
    return {(split, c, f"{i}.png"): r.integers(0, 256, (*size, 3), dtype=np.uint8)
            for split, n in (("train", 3), ("test", 2)) for c in classes for i in range(n)}


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def write_tree(folder: Path, images: Images) -> Path:
    for (split, c, name), pixels in images.items():
        (folder / split / c).mkdir(parents=True, exist_ok=True)
        (folder / split / c / name).write_bytes(png(pixels))
    return folder


def write_tar(archive: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(archive, "w:gz" if archive.name.endswith(".gz") else "w") as tar:
        for name in sorted(files, reverse=True):  # members out of sorted order: decoding must not care
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    return archive


def tree_files(images: Images, top: str = "") -> dict[str, bytes]:
    return {f"{top}{split}/{c}/{name}": png(pixels) for (split, c, name), pixels in images.items()}


def batch_files(images: Images) -> dict[str, bytes]:
    """torchvision's cifar-10-batches-py: pickled dicts of N x 3072 uint8 rows and labels."""
    def batch(keys: list[tuple[str, str, str]]) -> bytes:
        rows = np.stack([images[k].transpose(2, 0, 1).reshape(-1) for k in keys]) if keys else \
            np.zeros((0, 3072), dtype=np.uint8)
        return pickle.dumps({"data": rows, "labels": [CIFAR10_CLASSES.index(k[1]) for k in keys]})

    train = sorted(k for k in images if k[0] == "train")
    files = {f"cifar-10-batches-py/data_batch_{i + 1}": batch(train[i::5]) for i in range(5)}
    files["cifar-10-batches-py/test_batch"] = batch(sorted(k for k in images if k[0] == "test"))
    files["cifar-10-batches-py/batches.meta"] = pickle.dumps({"label_names": list(CIFAR10_CLASSES)})
    return files


def expected(images: Images, split: str, order: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The split as the loader gives it: sorted (class folder, file), CHW, labels by `order`."""
    keys = sorted(k for k in images if k[0] == split)
    return (np.stack([images[k].transpose(2, 0, 1) for k in keys]),
            np.array([order.index(k[1]) for k in keys]))


def assert_holds(data: datasets.Dataset, images: Images, order: tuple[str, ...] = CIFAR10_CLASSES) -> None:
    for split, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
        want_x, want_y = expected(images, split, order)
        assert x.dtype == np.uint8 or str(x.dtype) == "torch.uint8"
        assert sorted(map(bytes, x.numpy())) == sorted(map(bytes, want_x))  # the pixels, exactly
        order_of = {bytes(im): i for i, im in enumerate(want_x)}
        got = [order_of[bytes(im)] for im in x.numpy()]
        assert np.array_equal(y.numpy(), want_y[got])  # each image keeps its own label


def cfg(root: Path, tmp_path: Path, **kw: object) -> DataConfig:
    dataset = str(kw.pop("dataset", "cifar10"))
    return DataConfig(dataset=dataset, root=str(root), cache=str(tmp_path / "cache"), **kw)  # type: ignore[arg-type]


def cache_files(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "cache"
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.fixture
def no_checksums(monkeypatch):
    """Our own batches are not CIFAR-10's files: torchvision's md5 checks would refuse them."""
    cifar = pytest.importorskip("torchvision.datasets.cifar")
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)


@pytest.mark.parametrize("layout", ["tree", "tree one down", "tar", "tar.gz", "tar.gz one down"])
def test_an_image_tree_reads_exactly_what_was_written(tmp_path, layout):
    images = tiny_images()
    top = "cifar10/" if "one down" in layout else ""
    if layout.startswith("tree"):
        root = tmp_path / "copy"
        write_tree(root / top, images)
    else:
        root = write_tar(tmp_path / f"copy.{layout.split()[0]}", tree_files(images, top))
    data = load_dataset(cfg(root, tmp_path), "c.toml")
    assert tuple(data.train_x.shape) == (30, 3, 32, 32) and tuple(data.test_x.shape) == (20, 3, 32, 32)
    assert data.num_classes == 10
    assert_holds(data, images)


def test_cifar10_refuses_other_images_and_names_imagefolder(tmp_path):
    root = write_tree(tmp_path / "copy", tiny_images(("airplane", "automobile")))
    with pytest.raises(EdgeflError, match=r"data.dataset: CIFAR-10 is 10 classes of 3x32x32 images and .* "
                       r"holds 2 classes of 3x32x32; read other images with data.dataset = \"imagefolder\""):
        load_dataset(cfg(root, tmp_path), "c.toml")


@pytest.mark.parametrize("packed", [False, True])
def test_torchvisions_batches_in_a_folder_or_an_archive(tmp_path, no_checksums, packed):
    images = tiny_images()
    files = batch_files(images)
    if packed:
        root = write_tar(tmp_path / "cifar-10-python.tar.gz", files)
    else:
        root = tmp_path / "copy"
        for name, data in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
    data = load_dataset(cfg(root, tmp_path), "c.toml")
    assert_holds(data, images)
    if packed:  # decoded once into the cache, the unpacked batches gone
        assert [p.suffix for p in cache_files(tmp_path)] == [".npz"]


def test_the_cache_is_read_again_and_a_changed_source_is_decoded_again(tmp_path, monkeypatch):
    images = tiny_images()
    root = write_tree(tmp_path / "copy", images)
    config = cfg(root, tmp_path, dataset="imagefolder")
    load_dataset(config, "c.toml")
    [cache] = cache_files(tmp_path)
    assert cache.name.startswith("imagefolder-") and cache.suffix == ".npz"
    stamp = cache.stat().st_mtime_ns

    def no_decoding(*args):
        raise AssertionError("decoded although cached")

    with monkeypatch.context() as m:
        m.setattr(datasets, "_decode", no_decoding)
        assert_holds(load_dataset(config, "c.toml"), images, CLASSES)
    assert cache.stat().st_mtime_ns == stamp

    changed = dict(images)
    changed[("train", "airplane", "0.png")] = 255 - images[("train", "airplane", "0.png")]
    (root / "train" / "airplane" / "0.png").write_bytes(png(changed[("train", "airplane", "0.png")]))
    os.utime(root / "train" / "airplane" / "0.png", ns=(1, 1))  # a new mtime, whatever the clock's grain
    assert_holds(load_dataset(config, "c.toml"), changed, CLASSES)
    assert len(cache_files(tmp_path)) == 2  # a new digest, a new cache beside the old


def test_a_cache_that_does_not_match_its_source_is_refused_and_rebuilt(tmp_path):
    images = tiny_images()
    root = write_tar(tmp_path / "copy.tar", tree_files(images))
    config = cfg(root, tmp_path)
    load_dataset(config, "c.toml")
    [cache] = cache_files(tmp_path)
    with np.load(cache) as z:
        arrays = dict(z)
    arrays["digest"] = np.array("0" * 64)  # another source's arrays under this name
    with open(cache, "wb") as f:
        np.savez(f, **arrays)
    with pytest.warns(UserWarning, match="refused"):
        assert_holds(load_dataset(config, "c.toml"), images, CLASSES)
    with np.load(cache) as z:
        assert str(z["digest"]) == datasets.file_digest(root)
    cache.write_bytes(b"half a zip")  # damaged
    with pytest.warns(UserWarning, match="refused"):
        assert_holds(load_dataset(config, "c.toml"), images, CLASSES)
    assert [p.name for p in cache_files(tmp_path)] == [cache.name]  # no temporary file left


@pytest.mark.parametrize("dataset", ["cifar10", "imagefolder"])
def test_a_missing_path_is_one_error_naming_data_root_and_the_layouts(tmp_path, dataset):
    missing = tmp_path / "nowhere"
    with pytest.raises(EdgeflError) as info:
        load_dataset(cfg(missing, tmp_path, dataset=dataset), "c.toml")
    message = str(info.value)
    assert message.startswith(f"c.toml: data.root: {missing} does not exist; ")
    assert "train/<class>/<image>" in message and ".tar.gz" in message and "\n" not in message
    assert ("--download" in message) == (dataset == "cifar10")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("damage", ["no test", "empty class", "classes differ", "not an archive", "unsafe"])
def test_a_partial_or_unusable_copy_is_one_error_and_caches_nothing(tmp_path, damage):
    images = tiny_images()
    if damage == "not an archive":
        root = tmp_path / "copy.tar.gz"
        root.write_bytes(b"not a tar")
    elif damage == "unsafe":
        root = write_tar(tmp_path / "copy.tar", {**tree_files(images), "../evil/x.png": b"x"})
    else:
        root = write_tree(tmp_path / "copy", images)
        if damage == "no test":
            for path in sorted((root / "test").rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            (root / "test").rmdir()
        elif damage == "empty class":
            for path in (root / "test" / "automobile").iterdir():
                path.unlink()
        else:
            (root / "test" / "automobile").rename(root / "test" / "lorry")
    with pytest.raises(EdgeflError) as info:
        load_dataset(cfg(root, tmp_path), "c.toml")
    message = str(info.value)
    assert message.startswith(f"c.toml: data.root: {root} ") and "\n" not in message
    assert {"no test": "test/ is missing", "empty class": "test/automobile holds no images",
            "classes differ": "test/'s classes", "not an archive": "could not be read as an archive",
            "unsafe": "'../evil/x.png'"}[damage] in message
    assert not cache_files(tmp_path)


def test_images_of_two_sizes_name_the_file_and_both_sizes(tmp_path):
    images = tiny_images(size=(8, 6))
    images[("train", "automobile", "1.png")] = np.zeros((5, 7, 3), dtype=np.uint8)
    root = write_tree(tmp_path / "copy", images)
    with pytest.raises(EdgeflError, match=r"train/automobile/1.png in .* is 7x5 pixels and the first image, "
                       r"test/airplane/0.png, 6x8"):
        load_dataset(cfg(root, tmp_path, dataset="imagefolder"), "c.toml")


def test_imagefolder_takes_its_classes_and_shape_from_the_images(tmp_path):
    """Grey and RGBA images come out RGB; data.classes orders (and picks) the labels; the spec that
    dry runs use is read off the images."""
    from PIL import Image

    images = tiny_images(("cats", "dogs", "owls"), size=(6, 8))
    root = write_tree(tmp_path / "mine", images)
    Image.fromarray(images[("train", "cats", "0.png")][:, :, 0]).save(root / "train" / "cats" / "0.png")
    rgba = np.dstack([images[("test", "dogs", "1.png")], np.full((6, 8), 7, dtype=np.uint8)])
    Image.fromarray(rgba).save(root / "test" / "dogs" / "1.png")
    images[("train", "cats", "0.png")] = np.repeat(images[("train", "cats", "0.png")][:, :, :1], 3, axis=2)

    data = load_dataset(cfg(root, tmp_path, dataset="imagefolder"), "c.toml")
    assert (data.num_classes, data.input_shape) == (3, (3, 6, 8))
    assert_holds(data, images, ("cats", "dogs", "owls"))

    picked = cfg(root, tmp_path, dataset="imagefolder", classes=["owls", "cats"])
    data = load_dataset(picked, "c.toml")
    assert data.num_classes == 2 and len(data.train_y) == 6
    assert_holds(data, {k: v for k, v in images.items() if k[1] != "dogs"}, ("owls", "cats"))
    spec = dataset_spec(picked)
    assert (spec.input_shape, spec.num_classes, spec.train_samples) == ((3, 6, 8), 2, 6)
    assert shapes_only(picked).input_shape == (3, 6, 8)

    with pytest.raises(EdgeflError, match=r"data.classes: names birds; the class folders are cats, dogs, "):
        load_dataset(cfg(root, tmp_path, dataset="imagefolder", classes=["birds"]), "c.toml")


def test_train_samples_keeps_a_seeded_stratified_subset(tmp_path):
    labels = np.repeat(np.arange(4), [40, 30, 20, 10])
    keep = stratified_subset(labels, 10)
    assert np.array_equal(np.bincount(labels[keep]), [4, 3, 2, 1])
    assert np.array_equal(keep, stratified_subset(labels, 10)) and np.all(np.diff(keep) > 0)
    assert len(stratified_subset(labels, 7)) == 7
    assert len(stratified_subset(labels, 0)) == len(stratified_subset(labels, 500)) == 100

    images = {("train", c, f"{i:02}.png"): np.full((4, 4, 3), i, dtype=np.uint8)
              for c in ("cats", "dogs") for i in range(20)}
    images |= {("test", c, "0.png"): np.zeros((4, 4, 3), dtype=np.uint8) for c in ("cats", "dogs")}
    root = write_tree(tmp_path / "copy", images)
    config = cfg(root, tmp_path, dataset="imagefolder", train_samples=10)
    data, again = load_dataset(config, "c.toml"), load_dataset(config, "c.toml")
    assert np.array_equal(np.bincount(data.train_y.numpy()), [5, 5]) and len(data.test_y) == 2
    assert np.array_equal(data.train_x.numpy(), again.train_x.numpy())
    assert dataset_spec(config).train_samples == 10
    assert dataset_spec(DataConfig(dataset="cifar10", train_samples=256)).train_samples == 256
    assert dataset_spec(DataConfig(dataset="digits", train_samples=5000)).train_samples == 1437
    with pytest.raises(EdgeflError, match=r"data\.train_samples: must be 0"):
        load_scenario(ROOT / "scenarios" / "quickstart.toml", ["data.train_samples=-1"])


def test_a_full_disk_while_caching_is_one_error_and_leaves_no_file(tmp_path, monkeypatch):
    root = write_tree(tmp_path / "copy", tiny_images())

    def full(*args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(EdgeflError, match=r"data\.cache: cannot write .*No space left"):
        load_dataset(cfg(root, tmp_path), "c.toml")
    assert cache_files(tmp_path) == []


@pytest.mark.parametrize("partition", ["20-80", "skew"])
def test_the_label_partitions_split_a_local_copy(tmp_path, partition):
    images = tiny_images(CIFAR10_CLASSES)
    data = load_dataset(cfg(write_tree(tmp_path / "copy", images), tmp_path), "c.toml")
    splits = split_clients(data.train_y.numpy(), 3, DataConfig(partition=partition, skew_s=1.0), 0, "c.toml")
    held = np.sort(np.concatenate([np.concatenate([s.train, s.val]) for s in splits]))
    assert np.array_equal(held, np.arange(len(data.train_y)))


def shared_copy() -> Path:
    return Path(os.environ.get("EDGEFL_CIFAR10", ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"))


@pytest.mark.slow
@pytest.mark.skipif(not shared_copy().is_file(), reason="no shared CIFAR-10 copy (set EDGEFL_CIFAR10 to "
                    "cifar10-jpeg.tar.gz, or put it at ../shared/data/ beside the repository)")
def test_the_shared_cifar10_copy_loads_whole_and_trains_two_rounds_from_its_cache(tmp_path, monkeypatch):
    """The development copy: 60,000 JPEGs decoded once (about 20 s on two cores); then the CPU-sized
    reproduction trains two rounds on 256 of its images, read from the cache without decoding any."""
    from edgefl.cli import main

    cache = tmp_path / "cache"
    data = load_dataset(DataConfig(dataset="cifar10", root=str(shared_copy()), cache=str(cache)), "c.toml")
    assert tuple(data.train_x.shape) == (50000, 3, 32, 32) and tuple(data.test_x.shape) == (10000, 3, 32, 32)
    assert str(data.train_x.dtype) == "torch.uint8"
    assert np.array_equal(np.bincount(data.train_y.numpy()), [5000] * 10)
    assert np.array_equal(np.bincount(data.test_y.numpy()), [1000] * 10)
    assert len(np.unique(data.test_y.numpy()[:100])) == 10  # a first-n test subset holds every class

    def decode(*args: object) -> None:
        raise AssertionError("decoded again: the cache was not used")

    monkeypatch.setattr(datasets, "_decode", decode)
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "scenarios" / "fedprophet-cifar10-cpu.toml"), "--quiet", "--out", str(out),
                 "--set", f"data.root={shared_copy()}", "--set", f"data.cache={cache}",
                 "--set", "data.train_samples=256", "--set", "data.test_samples=64", "--set", "rounds=2",
                 "--set", "fleet.clients=4", "--set", "fleet.sample_fraction=0.5",
                 "--set", "training.local_iters=1", "--set", "training.batch_size=16",
                 "--set", "fedprophet.warmup_rounds=1", "--set", "evaluation.steps=2"]) == 0
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[-1].split(",")[-1] != ""  # two rounds, the last evaluated
