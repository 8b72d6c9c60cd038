"""Federated partitions (iid, dirichlet, 20-80, skew), client validation slices and the datasets."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from edgefl.config import DataConfig
from edgefl.data import DATASETS, PARTITIONS, load_dataset, split_clients
from edgefl.data.datasets import CIFAR10_FILES
from edgefl.errors import EdgeflError

CLASSES, PER_CLASS = 10, 100
N = CLASSES * PER_CLASS


def labels_10x100() -> np.ndarray:
    """10 classes x 100 samples, in shuffled order (so index order says nothing about the label)."""
    return np.random.default_rng(123).permutation(np.repeat(np.arange(CLASSES), PER_CLASS))


def partition(name: str, labels: np.ndarray, clients: int, seed: int = 0, **cfg: object) -> list[np.ndarray]:
    return PARTITIONS.get(name)(labels, clients, DataConfig(partition=name, **cfg),
                                np.random.default_rng(seed))


def assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    every = np.concatenate(parts)
    assert len(every) == n, "some index is missing or dealt twice"
    assert np.array_equal(np.sort(every), np.arange(n))


def label_counts(labels: np.ndarray, part: np.ndarray) -> np.ndarray:
    return np.bincount(labels[part], minlength=CLASSES)


def test_registry_names_the_four_partitions():
    assert set(PARTITIONS.names()) == {"iid", "dirichlet", "20-80", "skew"}
    with pytest.raises(KeyError, match="iid"):
        PARTITIONS.get("shards")


PARTITION_CFG: dict[str, dict[str, object]] = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "20-80": {"iid_share": 0.2, "shards_per_client": 2},
    "skew": {"skew_s": 2.0},
}


@pytest.mark.parametrize("name", sorted(PARTITION_CFG))
@pytest.mark.parametrize("clients", [5, 10])
def test_every_partition_is_a_disjoint_cover(name: str, clients: int):
    parts = partition(name, labels_10x100(), clients, **PARTITION_CFG[name])
    assert len(parts) == clients
    assert_disjoint_cover(parts, N)


# iid ---------------------------------------------------------------------------------------------


def test_iid_sizes_differ_by_at_most_one():
    # 1000 = 7 x 142 + 6: six clients get 143, one gets 142
    sizes = sorted(len(p) for p in partition("iid", labels_10x100(), 7))
    assert sizes == [142] + [143] * 6


# 20-80 -------------------------------------------------------------------------------------------


def test_20_80_without_iid_share_deals_pure_label_shards():
    # 1000 label-sorted samples cut into 10 x 2 = 20 shards of 50: every class (100 samples) is
    # exactly 2 shards, so every shard holds one label and every client 2 shards = 100 samples.
    labels = labels_10x100()
    parts = partition("20-80", labels, 10, iid_share=0.0, shards_per_client=2)
    assert_disjoint_cover(parts, N)
    for part in parts:
        counts = label_counts(labels, part)
        assert len(part) == 100
        assert set(counts[counts > 0].tolist()) <= {50, 100}
        assert 1 <= np.count_nonzero(counts) <= 2


def test_20_80_deals_an_iid_fifth_and_two_label_shards():
    # iid part: int(0.2 x 1000) = 200 samples, 20 per client; the other 800 are label-sorted and cut
    # into 10 x 2 = 20 shards of 40, 2 per client: every client holds 20 + 2 x 40 = 100 samples.
    # A shard of 40 consecutive label-sorted samples spans at most 2 labels as long as no label keeps
    # fewer than 39 of its 100 samples in the sorted 80 % (it would need > 61 of the 200 iid draws,
    # about 11 standard deviations above the expected 20). So the 80 samples a client takes from its
    # shards lie in at most 2 x 2 = 4 labels: its 4 most frequent labels hold at least 80 samples.
    labels = labels_10x100()
    parts = partition("20-80", labels, 10, iid_share=0.2, shards_per_client=2)
    assert_disjoint_cover(parts, N)
    assert [len(p) for p in parts] == [100] * 10
    for part in parts:
        counts = np.sort(label_counts(labels, part))[::-1]
        assert counts[:4].sum() >= 80
    # and the 20 % really is dealt IID: the clients together hold far more labels than shards alone give
    assert sum(np.count_nonzero(label_counts(labels, p)) for p in parts) > 10 * 4


# skew --------------------------------------------------------------------------------------------


def test_skew_5_clients_s2_keeps_92_percent_of_the_own_group():
    # 10 labels x 100 sorted into K = 5 groups of 200 (group g = labels 2g and 2g + 1). Own share
    # 100 - (5 - 1) x 2 = 92 % -> 184 samples; s = 2 % of each other group -> 4 samples.
    # Cuts: floor(cumsum(shares) x 200), e.g. group 0 -> [184, 188, 192, 196] -> chunks 184, 4, 4, 4, 4.
    labels = labels_10x100()
    parts = partition("skew", labels, 5, skew_s=2.0)
    assert_disjoint_cover(parts, N)
    for k, part in enumerate(parts):
        groups = np.bincount(labels[part] // 2, minlength=5)
        expected = [184 if g == k else 4 for g in range(5)]
        assert groups.tolist() == expected, f"client {k}"
        assert len(part) == 184 + 4 * 4


def test_skew_counts_are_exact_when_the_percentages_are():
    # K = 2, s = 29 on 2 groups of 100: client k holds 71 % = 71 of group k and 29 % = 29 of the
    # other group. (Truncating the float cut 0.29 x 100 = 28.999... would give 28 / 72.)
    labels = np.repeat([0, 1], 100)
    parts = partition("skew", labels, 2, skew_s=29.0)
    assert_disjoint_cover(parts, 200)
    assert np.bincount(labels[parts[0]], minlength=2).tolist() == [71, 29]
    assert np.bincount(labels[parts[1]], minlength=2).tolist() == [29, 71]


# dirichlet ---------------------------------------------------------------------------------------


def test_dirichlet_huge_alpha_is_close_to_uniform_per_class():
    # Dir(1e6) shares are 1/10 +- about 1e-4: each client gets 100 / 10 = 10 of every class,
    # give or take the one sample that cutting at whole indices can move.
    labels = labels_10x100()
    parts = partition("dirichlet", labels, 10, alpha=1e6)
    assert_disjoint_cover(parts, N)
    counts = np.stack([label_counts(labels, p) for p in parts])  # clients x classes
    assert np.abs(counts - 10).max() <= 1
    assert counts.sum(axis=0).tolist() == [PER_CLASS] * CLASSES


def test_dirichlet_tiny_alpha_gives_each_class_mostly_to_one_client():
    labels = labels_10x100()
    parts = partition("dirichlet", labels, 10, alpha=0.01)
    assert_disjoint_cover(parts, N)
    counts = np.stack([label_counts(labels, p) for p in parts])
    top = counts.max(axis=0)  # per class, the share of its biggest holder
    assert np.count_nonzero(top > 50) >= 8
    assert np.median(top) >= 90


# split_clients -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PARTITION_CFG))
def test_split_is_seeded(name: str):
    labels = labels_10x100()
    cfg = DataConfig(partition=name, **PARTITION_CFG[name])
    a = split_clients(labels, 10, cfg, 3, "s.toml")
    b = split_clients(labels, 10, cfg, 3, "s.toml")
    c = split_clients(labels, 10, cfg, 4, "s.toml")
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.train, y.train)
        assert np.array_equal(x.val, y.val)
    assert any(not np.array_equal(x.train, y.train) for x, y in zip(a, c, strict=True))


def test_split_holds_out_a_validation_slice_per_client():
    # iid over 7 clients: six hold 143 -> round(28.6) = 29 val, 114 train; one holds 142 -> 28 val, 114 train
    labels = labels_10x100()
    splits = split_clients(labels, 7, DataConfig(partition="iid", val_fraction=0.2), 0, "s.toml")
    assert sorted((len(s.train), len(s.val)) for s in splits) == [(114, 28)] + [(114, 29)] * 6
    for s in splits:
        assert not set(s.train.tolist()) & set(s.val.tolist())
    assert_disjoint_cover([x for s in splits for x in (s.train, s.val)], N)


def test_split_with_no_validation():
    splits = split_clients(labels_10x100(), 10, DataConfig(partition="iid", val_fraction=0.0), 0, "s.toml")
    assert [(len(s.train), len(s.val)) for s in splits] == [(100, 0)] * 10


def test_too_many_clients_for_the_data_is_an_edgefl_error():
    # 3 samples over 5 clients: two clients get nothing to train on
    with pytest.raises(EdgeflError) as info:
        split_clients(np.array([0, 1, 2]), 5, DataConfig(partition="iid"), 0, "s.toml")
    assert info.value.key == "fleet.clients"
    assert str(info.value).startswith("s.toml: fleet.clients:")


# datasets ----------------------------------------------------------------------------------------


def test_digits_is_a_fixed_80_20_split_in_unit_range():
    data = load_dataset(DataConfig(dataset="digits"), "s.toml")
    # 1797 images: int(0.8 x 1797) = 1437 train, 360 test
    assert data.train_x.shape == (1437, 1, 8, 8)
    assert data.test_x.shape == (360, 1, 8, 8)
    assert data.train_y.shape == (1437,)
    assert data.test_y.shape == (360,)
    assert data.input_shape == (1, 8, 8)
    assert data.num_classes == 10
    assert data.train_x.dtype == torch.float32
    assert data.train_y.dtype == torch.int64
    for x in (data.train_x, data.test_x):
        assert float(x.min()) == 0.0
        assert float(x.max()) == 1.0  # the grey levels run 0..16, divided by 16
    assert set(data.train_y.tolist()) == set(range(10))
    assert len(data.mean) == len(data.std) == 1
    assert data.mean[0] == pytest.approx(float(data.train_x.mean()), rel=1e-5)
    assert data.std[0] == pytest.approx(float(data.train_x.std(unbiased=False)), rel=1e-4)
    again = load_dataset(DataConfig(dataset="digits"), "s.toml")
    for a, b in [(data.train_x, again.train_x), (data.train_y, again.train_y),
                 (data.test_x, again.test_x), (data.test_y, again.test_y)]:
        assert torch.equal(a, b)


def test_digits_train_and_test_together_are_all_of_digits():
    from sklearn.datasets import load_digits

    data = load_dataset(DataConfig(dataset="digits"), "s.toml")
    everything = torch.cat([data.train_y, data.test_y]).numpy()
    assert np.array_equal(np.bincount(everything), np.bincount(load_digits().target))


def test_dataset_registry():
    assert {"digits", "cifar10"} <= set(DATASETS.names())
    with pytest.raises(KeyError, match="digits"):
        load_dataset(DataConfig(dataset="mnist-but-not-really"), "s.toml")


def test_cifar10_missing_files_name_them_and_download(tmp_path, monkeypatch):
    # the files are checked before torchvision is imported: make any import of it fail
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    cfg = DataConfig(dataset="cifar10", root=str(tmp_path), download=False)
    with pytest.raises(EdgeflError) as info:
        load_dataset(cfg, "c.toml")
    message = str(info.value)
    assert "data_batch_1" in message
    assert "test_batch" in message
    assert "--download" in message
    assert message.startswith("c.toml: ")
    assert "\n" not in message


def test_cifar10_names_only_the_missing_files(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(b"")
    with pytest.raises(EdgeflError) as info:
        load_dataset(DataConfig(dataset="cifar10", root=str(tmp_path)), "c.toml")
    message = str(info.value)
    assert "test_batch" in message
    assert "data_batch_1" not in message
    assert "--download" in message


def test_damaged_cifar10_files_name_data_root_not_the_download(tmp_path):
    """Every file there, but garbage: torchvision's checksums refuse them (nothing is unpickled)."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in CIFAR10_FILES:
        (folder / name).write_bytes(b"not cifar")
    with pytest.raises(EdgeflError) as info:
        load_dataset(DataConfig(dataset="cifar10", root=str(tmp_path)), "c.toml")
    message = str(info.value)
    assert message.startswith(f"c.toml: data.root: CIFAR-10's files in {tmp_path} could not be read")
    assert "delete them" in message and "\n" not in message


def test_a_download_without_the_internet_says_to_fetch_the_files_elsewhere(tmp_path, monkeypatch):
    """torchvision's download fails on a machine without a network: the error says so, not that
    torchvision may not match torch."""
    import urllib.request
    from urllib.error import URLError

    def offline(*args, **kwargs):
        raise URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", offline)
    with pytest.raises(EdgeflError) as info:
        load_dataset(DataConfig(dataset="cifar10", root=str(tmp_path), download=True), "c.toml")
    message = str(info.value)
    assert message.startswith("c.toml: data.download: CIFAR-10 could not be downloaded")
    assert f"fetch its files on a connected machine into {tmp_path}" in message
    assert "torchvision matches" not in message


def test_synthetic_is_seeded_and_honours_its_shape():
    cfg = DataConfig(dataset="synthetic", synthetic_shape=[2, 5, 7], synthetic_classes=4,
                     synthetic_train=30, synthetic_test=6, synthetic_seed=3)
    a, b = load_dataset(cfg, "t"), load_dataset(cfg, "t")
    assert a.input_shape == (2, 5, 7) and a.num_classes == 4
    assert (len(a.train_y), len(a.test_y)) == (30, 6)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert float(a.train_x.min()) >= 0 and float(a.train_x.max()) <= 1
    assert set(a.train_y.tolist()) <= {0, 1, 2, 3}
    other = load_dataset(DataConfig(dataset="synthetic", synthetic_shape=[2, 5, 7], synthetic_classes=4,
                                    synthetic_train=30, synthetic_test=6, synthetic_seed=4), "t")
    assert not torch.equal(a.train_x, other.train_x)


def test_synthetic_images_larger_than_free_memory_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """(30 + 6) images of 2x5x7 float32, and a copy of the 30 training ones for their std, need
    (36 + 30) x 70 x 4 = 18,480 bytes: refused with 18,479 free, before any is drawn."""
    from edgefl.data import datasets

    monkeypatch.setattr(datasets, "available_bytes", lambda: 18_479)
    cfg = DataConfig(dataset="synthetic", synthetic_shape=[2, 5, 7], synthetic_train=30, synthetic_test=6)
    with pytest.raises(EdgeflError) as info:
        load_dataset(cfg, "s.toml")
    assert info.value.key == "data.synthetic_train" and "36 float32 images of 2x5x7" in info.value.fix
    monkeypatch.setattr(datasets, "available_bytes", lambda: 18_480)
    assert len(load_dataset(cfg, "s.toml").train_y) == 30


def test_synthetic_defaults_are_cifar10_shaped():
    from edgefl.data.datasets import shapes_only

    data = shapes_only(DataConfig(dataset="synthetic"))
    assert (data.input_shape, data.num_classes) == ((3, 32, 32), 10)


@pytest.mark.parametrize(("partition", "key"), [("dirichlet", "data.alpha"), ("iid", "fleet.clients")])
def test_a_client_left_without_a_training_sample_is_told_which_key_to_change(partition: str,
                                                                              key: str) -> None:
    """30 samples of 10 classes: Dirichlet at alpha 0.01 gives each class almost wholly to one of 5
    clients, so some get none (the key is alpha, not the client count); an IID split of 30 over 40
    clients leaves ten empty (the client count)."""
    labels = np.repeat(np.arange(10), 3)
    clients = 5 if partition == "dirichlet" else 40
    with pytest.raises(EdgeflError) as info:
        cfg = DataConfig(partition=partition, alpha=0.01, val_fraction=0.0)
        split_clients(labels, clients, cfg, 0, "s.toml")
    assert info.value.key == key and "gets no training sample" in str(info.value)
