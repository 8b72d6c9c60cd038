"""The scenario schema: typed dataclasses with defaults in code and a comment per key.

A scenario file is a short diff over the defaults below. Each method's own knobs (`[fedprophet]`,
`[prox]`, `[width]`, ...) are declared next to the method and registered here with `knob_section`;
`Scenario.knobs(cls)` reads them typed. This module is a leaf: reading, `--set` overrides, checks
and writing back are edgefl.scenario's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import ClassVar, TypeVar

from edgefl.registry import load_group

# bounds on a client's local work: far above any edge device's, and what pricing stays quick and exact
# at (a batch of 10^8, micro-batched by the swap walk, took minutes and GBs; 10^300 epochs overflowed)
MAX_ITERS, MAX_EPOCHS, MAX_BATCH = 1_000_000, 10_000, 65_536
MAX_STEPS = 1_000  # an attack's steps: the papers' attacks take 10-20 (PGD), AutoAttack's APGD 100
# bounds on the fleet and the server, far beyond any study's, that keep simulated hours finite
MAX_SECONDS = 1e9  # a deadline or a server's seconds per round: about 32 years
MAX_BUFFER, MAX_OVER_SELECTION, MAX_BALANCE_S = 10_000, 10.0, 4.0
MAX_CHANNELS, MAX_SIDE, MAX_CLASSES = 64, 4096, 100_000  # synthetic images: ImageNet-21k has 21,841 classes
MAX_THREADS = 1024  # far more than any CPU has; torch aborts natively on absurd counts
MAX_SEEDS = 1_000  # seeds of one comparison: each is a run per method
MAX_WIDTH = 16.0  # model.width: VGG16 at 16x is 3.8e9 parameters, beyond any edge device


@dataclass
class DataConfig:
    dataset: str = "digits"  # digits (bundled) | cifar10 | caltech256 | imagefolder (one's own images) |
    #   synthetic (seeded noise, no download)
    root: str = "~/.cache/edgefl/data"  # where downloadable datasets live, or a local copy: a folder of
    #   train/<class>/<image> and test/<class>/<image>, or a .tar/.tar.gz of one (edgefl.data.datasets)
    cache: str = "~/.cache/edgefl/datasets"  # a local copy's decoded arrays, one .npz per source digest
    classes: list[str] = field(default_factory=list)  # imagefolder: class folders in label order (empty
    #   = the sorted folder names of train/; folders left out are not used)
    download: bool = False  # allow torchvision to download a missing dataset
    partition: str = "iid"  # iid | 20-80 | skew | dirichlet
    alpha: float = 0.5  # Dirichlet concentration
    skew_s: float = 2.0  # Shah et al.'s s, in percent per foreign label group
    shards_per_client: int = 2  # 20-80 split: label-sorted shards per client
    iid_share: float = 0.2  # 20-80 split: share of samples dealt IID
    val_fraction: float = 0.2  # each client's validation slice
    test_samples: int = 0  # evaluate on this many test samples (0 = all)
    train_samples: int = 0  # train on a seeded class-stratified subset of this many (0 = all), the same
    #   subset for every run seed
    synthetic_shape: list[int] = field(default_factory=lambda: [3, 32, 32])  # synthetic: one image, C x H x W
    synthetic_classes: int = 10  # synthetic: label count
    synthetic_train: int = 5000  # synthetic: training samples
    synthetic_test: int = 1000  # synthetic: test samples
    synthetic_seed: int = 0  # synthetic: the draw of images and labels


@dataclass
class ModelConfig:
    name: str = "digits_cnn"  # a registered zoo model (edgefl.models), torchvision:NAME or timm:NAME
    width: float = 1.0  # channels of every conv and hidden layer x this (VGG and ResNet families)
    kwargs: dict[str, int | float | bool | str] = field(default_factory=dict)  # keywords to a
    #   torchvision:NAME or timm:NAME model's constructor (edgefl.models.vision), e.g. { in_chans = 1 }


@dataclass
class FleetConfig:
    clients: int = 20  # devices in the fleet, each a client with its own data split
    sample_fraction: float = 0.5  # clients selected per round
    pool: str = "edge"  # device pool name (the `pools` key of device profiles)
    devices: list[str] = field(default_factory=list)  # explicit device list, overrides `pool`
    balance_s: float = 0.0  # P(device) ~ (FLOP/s x memory)^s; 0 balanced, < 0 favours small devices
    apps: list[str] = field(default_factory=list)  # co-running apps drawn from (empty = all)
    app_memory: bool = True  # the co-running app also takes its share of memory
    memory_fraction: list[float] = field(default_factory=lambda: [0.0, 0.2])  # U(lo, hi) x memory
    reserved_memory_mb: float = 1.2  # R_min: available memory never drops below this
    availability: str = "always"  # always | diurnal (night charging, edgefl.sim.availability) |
    #   a trace file: .csv/.json of online intervals, FedScale's active/inactive/duration layout
    online_start_h: float = 22.0  # diurnal: local hour a device goes online (plugged in to charge)
    online_hours: float = 8.0  # diurnal: hours a day it stays online (24 = always)
    tz_spread_h: float = 0.0  # diurnal: devices' local time zones spread uniformly over this many hours
    trace_pickle: bool = False  # a .pkl/.pickle trace (FedScale's own) is read only when this is true;
    #   even then only plain dicts, lists and numbers are accepted


@dataclass
class TrainingConfig:
    local_iters: int = 30  # SGD iterations per client per round
    batch_size: int = 32  # samples per local SGD iteration
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.05  # the local learning rate in round 0
    lr_decay: float = 0.994  # x per round
    momentum: float = 0.9  # SGD momentum (adam: beta1)
    weight_decay: float = 1e-4  # L2 penalty of the local optimizer
    local_epochs: float = 0.0  # local work in epochs over the client's data (0 = use local_iters)
    objective: str = "pgd_at"  # local adversarial training: pgd_at (Madry) | trades | mart
    beta: float = 6.0  # TRADES / MART robustness weight
    fedbn: bool = True  # keep BatchNorm local to each client (jfat; fedavg_at averages BN)
    warmup_rounds: int = 0  # clean (non-adversarial) rounds first
    precision: str = "fp32"  # fp32 | bf16 (autocast on the training device)
    channels_last: bool = False  # NHWC memory format for conv models (faster on recent GPUs)
    group_clients: bool = True  # train a round's clients of one architecture together (issue 16);
    #   false: one by one, as the time-prediction check needs (edgefl.training.grouped)


@dataclass
class AttackConfig:
    """The attack used for local adversarial training."""

    name: str = "pgd"  # pgd | pgd_l2 | fgsm | cw | none
    eps: float = 8 / 255  # the perturbation budget (L-inf on [0, 1] pixels; L2 radius for pgd_l2)
    step_size: float = 2 / 255  # the attack's step
    steps: int = 10  # gradient steps per attack (PGD-10, Madry et al.)


@dataclass
class EvaluationConfig:
    every: int = 1  # evaluate every N rounds (and always after the last)
    attack: str = "pgd"  # the attack behind adv_acc
    extra: list[str] = field(default_factory=list)  # more attacks, a `<name>_acc` column each
    steps: int = 20  # the evaluation attack's steps (PGD-20 in the papers)
    eps: float = 0.0  # 0 = the training attack's eps
    step_size: float = 0.0  # 0 = the training attack's step size


@dataclass
class CostConfig:
    accounting: str = "walk"  # walk (atom-by-atom swap walk) | paper (FedProphet release)
    communication: bool = True  # count download/upload time
    server_s: float = 0.0  # server time per round (aggregation)
    server_gflops: float = 10000.0  # server speed for a method's server-side work (e.g. distillation)
    paper_access_s: float = 0.17  # paper accounting: seconds per storage access

    @property
    def counts_communication(self) -> bool:
        """Whether download and upload are priced: the paper accounting leaves them out (as the
        FedProphet release does), the walk prices them unless `communication = false`."""
        return self.communication and self.accounting != "paper"


@dataclass
class RoundConfig:
    """How a round closes (edgefl.sim.living_round, edgefl.sim.fedbuff): all selected clients (sync),
    a deadline with over-selection (FedScale), or buffered asynchronous aggregation (FedBuff)."""

    mode: str = "sync"  # sync | deadline | async
    deadline_s: float = 600.0  # deadline: the round closes this many seconds after it starts
    over_selection: float = 1.3  # deadline: select ceil(this x target) clients; target = the sample
    buffer: int = 4  # async: the server aggregates every `buffer` updates (FedBuff's K)
    max_staleness: int = 8  # async: updates staler than this many aggregations are dropped
    concurrency: int = 8  # async: clients training at once (at most the fleet); a new one starts as one ends


@dataclass
class EnergyConfig:
    """Each client's joules per round (edgefl.sim.energy) and the devices' batteries."""

    enabled: bool = False  # price energy: clients.csv and metrics.csv gain `energy_j` (and battery columns)
    batteries: bool = False  # battery devices drain (a living fleet: edgefl.sim.battery); one that
    #   cannot cover its round is dropped, an empty one is offline until it charges
    battery_start: list[float] = field(default_factory=lambda: [1.0, 1.0])  # charge at the start,
    #   U(lo, hi) x capacity per device, seeded
    charge_w: float = 0.0  # watts a battery gains while its device is plugged in (0: never charges)
    charge_start_h: float = 22.0  # local hour devices are plugged in (time zones: fleet.tz_spread_h)
    charge_hours: float = 8.0  # hours a day they stay plugged in


@dataclass
class ServerConfig:
    """The server: the rule that folds a round's updates (edgefl.server), and its links, shared by
    concurrent transfers (edgefl.sim.links): each carries its fixed Mbit/s plus a share per device of
    the fleet (`fleet.clients`), a capacity that grows with the fleet as a CDN's or an edge tier's
    does; 0 in all = unlimited."""

    rule: str = ""  # the server rule of a whole-model method (docs: Methods), e.g. fedyogi, gma, krum;
    #   "" = the method's own (fedavg_at: mean, fedyogi_at: fedyogi, gma: gma, sfat: slack)
    down_mbit_s: float = 0.0  # Mbit/s the server sends to all clients together (0 = unlimited)
    up_mbit_s: float = 0.0  # Mbit/s the server receives from all clients together (0 = unlimited)
    down_mbit_s_per_device: float = 0.0  # Mbit/s added to down_mbit_s for each device of the fleet
    up_mbit_s_per_device: float = 0.0  # Mbit/s added to up_mbit_s for each device of the fleet


@dataclass
class CompareConfig:
    """`edgefl compare`: per-method round counts, as the paper trains them (FedProphet §7.1: jFAT 500,
    baselines 1000, FedProphet 7 modules x 500 at most), and the seeds each method runs on."""

    rounds: dict[str, int] = field(default_factory=dict)  # method -> rounds (unlisted: `rounds`)
    seeds: list[int] = field(default_factory=list)  # every method once per seed (empty: `seed` alone)


@dataclass
class RayConfig:
    """The Ray executor: client updates on Ray workers (`executor = "ray"`)."""

    address: str = ""  # "" starts a local Ray; "auto" or "ray://HOST:10001" joins a cluster
    trust_address: bool = False  # a cluster not on this machine receives pickled code: say you trust it
    workers: int = 0  # concurrent client tasks (0 = one per CPU)
    max_retries: int = 3  # a task whose worker dies is retried this many times


@dataclass
class OutputConfig:
    """How a run logs its per-client rows (clients and events) and what its trace keeps."""

    format: str = "auto"  # csv | parquet | auto (parquet above `parquet_above` client-rounds, else csv)
    parquet_above: int = 100000  # auto: expected client-rounds (rounds x clients per round) for parquet
    trace_clients: int = 256  # trace.json shows at most this many clients (all of a smaller fleet),
    # a sample drawn from the seed


@dataclass
class SelectionConfig:
    """Which clients the server picks each round (edgefl.selection)."""

    policy: str = "uniform"  # uniform (seeded draw) | oort (Lai et al. 2021) | power_of_choice
    #   (Cho et al. 2020) | memory_fit (devices whose memory this round holds the workload); a policy's
    #   knobs are its own section ([oort], [power_of_choice])


Check = tuple[str, bool, str]  # (key within the section, whether its value is fine, the fix)
Named = tuple[str, str, list[str]]  # (key within the section, a name it gives, the names known)


class Knobs:
    """The base of a method's knob section: a dataclass registered with `knob_section(name)`."""

    section: ClassVar[str] = ""  # the TOML section, set by `knob_section`

    def checks(self) -> list[Check]:
        """Range checks; a scenario stops on the first that fails."""
        return []

    def named(self) -> list[Named]:
        """Values that must name something registered (a model, a dataset...)."""
        return []

    def fits(self, s: Scenario) -> list[Check]:
        """Checks against the rest of the scenario (a count within the fleet)."""
        return []


K = TypeVar("K", bound=Knobs)


class KnobSections:
    """Section name -> knob dataclass, filled by `knob_section` as the methods are imported."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Knobs]] = {}

    def register(self, name: str) -> Callable[[type[K]], type[K]]:
        def add(cls: type[K]) -> type[K]:
            if name in self._classes or name in {f.name for f in fields(Scenario)}:
                raise ValueError(f"knob section [{name}] registered twice or named like a scenario key")
            cls.section = name
            self._classes[name] = cls
            return cls

        return add

    def classes(self) -> dict[str, type[Knobs]]:
        """Every registered section (plugins' methods' and policies' included), sorted by name (so
        files and messages do not depend on which method was imported first)."""
        load_group("edgefl.methods")
        load_group("edgefl.policies")
        return dict(sorted(self._classes.items()))

    def defaults(self) -> dict[str, Knobs]:
        return {name: cls() for name, cls in self.classes().items()}


KNOBS = KnobSections()
knob_section = KNOBS.register  # @knob_section("prox") on a method's knob dataclass


@dataclass
class Scenario:
    method: str = "jfat"  # a registered method (docs: Methods)
    rounds: int = 20  # federated rounds to play
    seed: int = 0  # seeds the data split, device draws, selection and training
    device: str = "auto"  # auto | cpu | cuda | cuda:N (a GPU this machine has)
    threads: int = 0  # CPU threads for PyTorch (0 = PyTorch's default; at most 1024); 1 suits tiny models
    executor: str = "local"  # local (in-process) | ray
    checkpoint_every: int = 1  # rounds between checkpoints (0 = none), for `edgefl run --resume`
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    sections: dict[str, Knobs] = field(default_factory=KNOBS.defaults)  # the methods' knobs,
    #   [section] -> its dataclass (every registered section, by name)
    ray: RayConfig = field(default_factory=RayConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    round: RoundConfig = field(default_factory=RoundConfig)  # how a round closes (a living fleet)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)

    @property
    def living(self) -> bool:
        """Whether the scenario needs a living fleet (edgefl.experiment.living): any availability or
        round mode but the defaults, or batteries."""
        return self.fleet.availability != "always" or self.round.mode != "sync" or self.energy.batteries

    def knobs(self, cls: type[K]) -> K:
        """The scenario's section of the knob dataclass `cls` (e.g. `s.knobs(ProxConfig).mu`)."""
        if not cls.section:
            raise TypeError(f"{cls.__name__} is not registered with knob_section")
        value = self.sections.setdefault(cls.section, cls())  # defaults if made before registration
        if not isinstance(value, cls):
            raise TypeError(f"[{cls.section}] holds a {type(value).__name__}, not a {cls.__name__}")
        return value
