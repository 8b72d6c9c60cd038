"""Scenario files: a typed schema with defaults in code, TOML loading, `--set` overrides, clear errors.

A scenario file is a short diff over the defaults below. Unknown keys, wrong types and impossible
values stop before any work with one line naming the file, the key and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgefl.errors import EdgeflError


@dataclass
class DataConfig:
    dataset: str = "digits"  # digits (bundled) | cifar10 | caltech256 | synthetic (seeded noise, no download)
    root: str = "~/.cache/edgefl/data"  # where downloadable datasets live
    download: bool = False  # allow torchvision to download a missing dataset
    partition: str = "iid"  # iid | 20-80 | skew | dirichlet
    alpha: float = 0.5  # Dirichlet concentration
    skew_s: float = 2.0  # Shah et al.'s s, in percent per foreign label group
    shards_per_client: int = 2  # 20-80 split: label-sorted shards per client
    iid_share: float = 0.2  # 20-80 split: share of samples dealt IID
    val_fraction: float = 0.2  # each client's validation slice
    test_samples: int = 0  # evaluate on this many test samples (0 = all)
    synthetic_shape: list[int] = field(default_factory=lambda: [3, 32, 32])  # synthetic: one image, C x H x W
    synthetic_classes: int = 10  # synthetic: label count
    synthetic_train: int = 5000  # synthetic: training samples
    synthetic_test: int = 1000  # synthetic: test samples
    synthetic_seed: int = 0  # synthetic: the draw of images and labels


@dataclass
class ModelConfig:
    name: str = "digits_cnn"


@dataclass
class FleetConfig:
    clients: int = 20
    sample_fraction: float = 0.5  # clients selected per round
    pool: str = "edge"  # device pool name (the `pools` key of device profiles)
    devices: list[str] = field(default_factory=list)  # explicit device list, overrides `pool`
    balance_s: float = 0.0  # P(device) ~ (FLOP/s x memory)^s; 0 balanced, < 0 favours small devices
    apps: list[str] = field(default_factory=list)  # co-running apps drawn from (empty = all)
    app_memory: bool = True  # the co-running app also takes its share of memory
    memory_fraction: list[float] = field(default_factory=lambda: [0.0, 0.2])  # U(lo, hi) x memory
    reserved_memory_mb: float = 1.2  # R_min: available memory never drops below this


@dataclass
class TrainingConfig:
    local_iters: int = 30  # SGD iterations per client per round
    batch_size: int = 32
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.05
    lr_decay: float = 0.994  # x per round
    momentum: float = 0.9
    weight_decay: float = 1e-4
    local_epochs: float = 0.0  # local work in epochs over the client's data (0 = use local_iters)
    objective: str = "pgd_at"  # local adversarial training: pgd_at (Madry) | trades | mart
    beta: float = 6.0  # TRADES / MART robustness weight
    fedbn: bool = True  # keep BatchNorm local to each client (jfat; fedavg_at averages BN)
    warmup_rounds: int = 0  # clean (non-adversarial) rounds first
    precision: str = "fp32"  # fp32 | bf16 (autocast on the training device)
    channels_last: bool = False  # NHWC memory format for conv models (faster on recent GPUs)
    group_clients: bool = True  # train a round's clients of one architecture together (issue 16);
    #   false: one by one, as the time-prediction check needs (edgefl.execution.grouped)


@dataclass
class AttackConfig:
    """The attack used for local adversarial training."""

    name: str = "pgd"  # pgd | fgsm | none
    eps: float = 8 / 255
    step_size: float = 2 / 255
    steps: int = 10


@dataclass
class EvaluationConfig:
    every: int = 1  # evaluate every N rounds (and always after the last)
    attack: str = "pgd"  # the attack behind adv_acc
    extra: list[str] = field(default_factory=list)  # more attacks, a `<name>_acc` column each
    steps: int = 20
    eps: float = 0.0  # 0 = the training attack's eps
    step_size: float = 0.0  # 0 = the training attack's step size


@dataclass
class CostConfig:
    accounting: str = "walk"  # walk (atom-by-atom swap walk) | paper (FedProphet release)
    communication: bool = True  # count download/upload time
    server_s: float = 0.0  # server time per round (aggregation)
    server_gflops: float = 10000.0  # server speed for a method's server-side work (e.g. distillation)
    paper_access_s: float = 0.17  # paper accounting: seconds per storage access


@dataclass
class FedProphetConfig:
    """FedProphet's knobs (Tang et al. §5-6; defaults from its release)."""

    mu: float = 1e-5  # strong-convexity weight on the module output (Eq. 7)
    alpha: float = 0.3  # APA's starting scale of the feature perturbation (0.4 for Caltech)
    alpha_step: float = 0.1  # APA step (Eq. 10)
    delta: float = 0.05  # APA threshold on the clean/adversarial accuracy ratio (Eq. 10)
    warmup_rounds: int = 0  # clean rounds at the start of every module (the release: 100 of 500)
    grace: float = 0.05  # share of a module's budget, after its warm-up, with no validation score
    #   (so no best state and no patience); the release scores from 100 + 25 = 125 of 500
    patience: float = 0.1  # advance a module after this share of its budget in scored rounds
    #   without gain (the release: 50 of 500)
    stage_lr_decay: float = 1.0  # module m (from 0) trains at lr x this^m (the release's
    #   --stage_lr_decay; 1 = off, its default)
    module_rounds: list[int] = field(default_factory=list)  # dry runs: rounds each module runs,
    #   warm-up included (one per module); empty = the whole budget ceil(rounds / modules)
    head_side: int = 0  # auxiliary heads pool a C-channel map to at least this side; 0 = the
    #   release's ceil(sqrt(classes / C)) (global pooling when C >= classes)
    val_samples: int = 512  # validation samples (from the clients' slices) the server scores
    apa_samples: int = 512  # client samples the perturbation size d* is measured on (Eq. 9)


@dataclass
class ProxConfig:
    """FedProx (Li et al., MLSys 2020): mu/2 ||w - w_global||^2 on the local loss."""

    mu: float = 0.01


@dataclass
class CurvConfig:
    """FedCurv (Shah et al. §2.2): lambda sum_j (w - w_j)^T diag(F_j) (w - w_j)."""

    lam: float = 5.0  # Shah et al. use 5 for NIN and VGG


@dataclass
class DynConfig:
    """FedDynAT's local-epoch schedule (Shah et al. Alg. 2): E_t = floor(E0 gamma^floor(t / F))."""

    e0: float = 50.0
    gamma: float = 0.5
    f: int = 5


@dataclass
class SFATConfig:
    """SFAT (Zhu et al., ICLR 2023): the k_hat lowest-loss clients weighted (1 + a) / (1 - a)."""

    alpha: float = 1 / 6  # (1 + a) / (1 - a) = 1.4 on CIFAR-10; 1/11 on CIFAR-100 and SVHN
    k_hat: int = 1
    base: str = "fedavg"  # fedavg | fedprox | scaffold


@dataclass
class GMAConfig:
    """GMA (Tenison et al., TMLR): sign-agreement soft mask on the averaged update."""

    tau: float = 0.4
    base: str = "fedavg"  # client side: fedavg | fedprox
    server: str = "sgd"  # server optimizer: sgd (FedAvg) | adam (FedAdam) | yogi (FedYogi)
    server_lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    adapt_eps: float = 1e-3  # tau of Reddi et al.'s adaptive optimizers


@dataclass
class WidthConfig:
    """HeteroFL / FedDrop / FedRolex (FedProphet §7.2): width-reduced sub-models that fit memory."""

    levels: list[float] = field(default_factory=list)  # allowed fractions (empty = any, as the release)
    min_fraction: float = 0.0625  # never narrower than this (at least one channel per layer)


@dataclass
class DistillConfig:
    """FedDF / FedET (FedProphet §7.2): clients train family members, the server distils."""

    family: list[str] = field(default_factory=list)  # models, largest first (empty = model.name only)
    public_samples: int = 5000  # taken from the training set before the clients' split
    server_iters: int = 128
    server_batch: int = 64
    server_lr: float = 1e-3  # Adam, as FedDF
    temperature: float = 1.0
    diversity: float = 0.05  # FedET's lambda on the ensemble-diversity term


@dataclass
class CompareConfig:
    """`edgefl compare`: per-method round counts, as the paper trains them (FedProphet §7.1: jFAT 500,
    baselines 1000, FedProphet 7 modules x 500 at most)."""

    rounds: dict[str, int] = field(default_factory=dict)  # method -> rounds (unlisted: `rounds`)


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
class Scenario:
    method: str = "jfat"
    rounds: int = 20
    seed: int = 0
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
    fedprophet: FedProphetConfig = field(default_factory=FedProphetConfig)
    prox: ProxConfig = field(default_factory=ProxConfig)
    curv: CurvConfig = field(default_factory=CurvConfig)
    dyn: DynConfig = field(default_factory=DynConfig)
    sfat: SFATConfig = field(default_factory=SFATConfig)
    gma: GMAConfig = field(default_factory=GMAConfig)
    width: WidthConfig = field(default_factory=WidthConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read (UTF-8, a byte-order mark allowed), override, type-check and validate a scenario file; a
    file with no key at all and no `--set` is refused rather than silently run as the defaults.
    Defaults the user did not set that cannot fit the chosen dataset are scaled to it (`fit_defaults`)."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise EdgeflError(where, "file", "not found; give the path of a scenario .toml or the name of a "
                          "bundled scenario (edgefl scenarios list)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeflError(where, "file", f"cannot be read ({exc})") from None
    try:
        raw = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, an int over 4300 digits, deep nesting
        raise EdgeflError(where, "syntax", f"not valid TOML ({exc})") from None
    for item in overrides or []:
        apply_override(raw, item)
    if not raw:
        raise EdgeflError(where, "file", "is empty (no key set); a scenario sets at least one key, e.g. "
                          "method = \"jfat\" (edgefl scenarios list shows complete ones)")
    try:
        scenario = build(Scenario, raw, where, "")
        validate(scenario, where)
    except EdgeflError as exc:
        raise blame_set(exc, where, overrides or []) from None
    return fit_defaults(scenario, raw)


PUBLIC_SHARE = 5  # a default public split is at most 1/5 of the training set


def fit_defaults(s: Scenario, raw: dict[str, Any]) -> Scenario:
    """Scale the defaults sized for CIFAR-10 that the chosen dataset cannot hold, when the user did not
    set them (a value the user set is kept, and refused later with one line if it does not fit):
    `distill.public_samples` (5000) of a method that distils becomes at most a fifth of the training
    set (287 of the 1437 digits)."""
    from edgefl.data.datasets import dataset_spec
    from edgefl.methods import METHODS

    user_set = "public_samples" in raw.get("distill", {})
    if getattr(METHODS.get(s.method), "uses_public", False) and not user_set:
        cap = max(1, dataset_spec(s.data).train_samples // PUBLIC_SHARE)
        s.distill.public_samples = min(s.distill.public_samples, cap)
    return s


def blame_set(exc: EdgeflError, where: str, overrides: list[str]) -> EdgeflError:
    """`exc` as an error of the --set flag when it is about `where`'s key that an override set."""
    keys = [item.partition("=")[0].strip() for item in overrides]
    if exc.where != where or not any(_same_key(k, exc.key) for k in keys):
        return exc
    return EdgeflError("--set", exc.key, exc.fix)


def _same_key(set_key: str, error_key: str) -> bool:
    """Whether an error about `error_key` is about the value `--set set_key=...` gave."""
    return (set_key == error_key or set_key.startswith(error_key + ".")
            or error_key.startswith(set_key + "."))


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `--set a.b=value`; the value is read as TOML, or as a bare string."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise EdgeflError("--set", _printable(item), "write it as KEY=VALUE, e.g. rounds=5")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):  # TOMLDecodeError, an int over 4300 digits, deep nesting
        value = text
    *parents, leaf = key.strip().split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise EdgeflError("--set", _printable(key), f"{part!r} is not a section")
    node[leaf] = value


def build(cls: type, raw: Any, where: str, prefix: str) -> Any:
    """Build dataclass `cls` from a TOML table, rejecting unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise EdgeflError(where, prefix.rstrip(".") or "file", "must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise EdgeflError(
            where, prefix + _printable(unknown[0]), f"unknown key; known keys here: {', '.join(fields)}"
        )
    values = {}
    for name, value in raw.items():
        key, hint = prefix + name, hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = build(hint, value, where, key + ".")  # type: ignore[arg-type]
        else:
            values[name] = check_type(value, hint, where, key)
    return cls(**values)


def _printable(text: str) -> str:
    """A key or `--set` item as typed, or quoted when it holds a newline or other control character."""
    return text if text.isprintable() else repr(text)


def check_type(value: Any, hint: Any, where: str, key: str) -> Any:
    """Check one scalar or list value against its annotation; ints are accepted for floats.

    Integers must fit TOML's 64 bits (a seed beyond them overflows torch.manual_seed) and floats must
    be finite: NaN passes no range check, and inf would pass "must be positive".
    """
    origin = typing.get_origin(hint)
    if origin is dict:
        _, inner = typing.get_args(hint)
        if not isinstance(value, dict):
            raise EdgeflError(where, key, f"must be a table of name = {inner.__name__}, got {value!r}")
        return {k: check_type(v, inner, where, f"{key}.{_printable(k)}") for k, v in value.items()}
    if origin is list:
        (inner,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise EdgeflError(where, key, f"must be a list of {inner.__name__}, got {value!r}")
        return [check_type(v, inner, where, key) for v in value]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if hint in (int, float) and is_int and not -(2**63) <= value < 2**63:
        raise EdgeflError(where, key, f"must be a 64-bit integer (TOML's range), got {value}")
    if hint is float and is_int:
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise EdgeflError(where, key, f"must be {hint.__name__}, got {value!r}")
    if hint is float and not math.isfinite(value):
        raise EdgeflError(where, key, f"must be a finite number, got {value!r}")
    if hint is str and not _is_utf8(value):
        raise EdgeflError(where, key, f"must be valid UTF-8 text, got {value!r} (a file name in another "
                          "encoding cannot be saved in scenario.toml: rename it or link to it)")
    return value


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes a UTF-8 system could not decode
        return False
    return True


def validate(s: Scenario, where: str) -> None:
    """Range checks and known-name checks, each failing on the first bad key."""
    checks: list[tuple[str, bool, str]] = [
        ("rounds", s.rounds >= 1, "must be at least 1"),
        ("seed", s.seed >= 0, "must be a non-negative integer"),
        ("threads", 0 <= s.threads <= MAX_THREADS,
         f"must be 0 (PyTorch's default) or a positive count up to {MAX_THREADS}"),
        ("executor", s.executor in ("local", "ray"), "must be local or ray"),
        ("checkpoint_every", s.checkpoint_every >= 0, "must be 0 (no checkpoints) or a round count"),
        ("output.format", s.output.format in ("auto", "csv", "parquet"), "must be auto, csv or parquet"),
        ("output.parquet_above", s.output.parquet_above >= 0, "must be a client-round count, 0 or more"),
        ("output.trace_clients", s.output.trace_clients >= 0, "must be a client count, 0 or more"),
        ("data.alpha", s.data.alpha > 0, "must be positive"),
        ("data.skew_s", 0 <= s.data.skew_s < 100, "must be a percentage in [0, 100)"),
        ("data.shards_per_client", s.data.shards_per_client >= 1, "must be at least 1"),
        ("data.iid_share", 0 <= s.data.iid_share <= 1, "must be a fraction in [0, 1]"),
        ("data.val_fraction", 0 <= s.data.val_fraction < 1, "must be a fraction in [0, 1)"),
        ("data.test_samples", s.data.test_samples >= 0, "must be 0 (all) or positive"),
        ("data.synthetic_shape", len(s.data.synthetic_shape) == 3 and min(s.data.synthetic_shape) >= 1,
         "must be [channels, height, width], each at least 1"),
        ("data.synthetic_classes", s.data.synthetic_classes >= 2, "must be at least 2"),
        ("data.synthetic_train", s.data.synthetic_train >= 1, "must be at least 1"),
        ("data.synthetic_test", s.data.synthetic_test >= 1, "must be at least 1"),
        ("data.synthetic_seed", s.data.synthetic_seed >= 0, "must be a non-negative integer"),
        ("fleet.clients", s.fleet.clients >= 1, "must be at least 1"),
        ("fleet.sample_fraction", 0 < s.fleet.sample_fraction <= 1, "must be a fraction in (0, 1]"),
        ("fleet.memory_fraction", _is_range(s.fleet.memory_fraction, 0, 1),
         "must be [low, high] with 0 <= low <= high <= 1"),
        ("fleet.reserved_memory_mb", s.fleet.reserved_memory_mb > 0, "must be positive (MB)"),
        ("training.local_iters", s.training.local_iters >= 1, "must be at least 1"),
        ("training.batch_size", s.training.batch_size >= 1, "must be at least 1"),
        ("training.optimizer", s.training.optimizer in ("sgd", "adam"), "must be sgd or adam"),
        ("training.lr", s.training.lr > 0, "must be positive"),
        ("training.lr_decay", 0 < s.training.lr_decay <= 1, "must be in (0, 1]"),
        ("training.momentum", 0 <= s.training.momentum < 1, "must be in [0, 1)"),
        ("training.weight_decay", s.training.weight_decay >= 0, "must be non-negative"),
        ("training.warmup_rounds", s.training.warmup_rounds >= 0, "must be non-negative"),
        ("training.local_epochs", s.training.local_epochs >= 0, "must be 0 (use local_iters) or positive"),
        ("training.beta", s.training.beta >= 0, "must be non-negative"),
        ("training.precision", s.training.precision in ("fp32", "bf16"), "must be fp32 or bf16"),
        ("attack.eps", s.attack.eps >= 0, "must be non-negative"),
        ("attack.step_size", s.attack.step_size >= 0, "must be non-negative"),
        ("attack.steps", s.attack.steps >= 1, "must be at least 1"),
        ("evaluation.every", s.evaluation.every >= 1, "must be at least 1"),
        ("evaluation.steps", s.evaluation.steps >= 1, "must be at least 1"),
        ("evaluation.eps", s.evaluation.eps >= 0, "must be non-negative"),
        ("evaluation.step_size", s.evaluation.step_size >= 0, "must be non-negative"),
        ("cost.accounting", s.cost.accounting in ("walk", "paper"), "must be walk or paper"),
        ("cost.server_s", s.cost.server_s >= 0, "must be non-negative (seconds)"),
        ("cost.server_gflops", s.cost.server_gflops > 0, "must be positive (GFLOP/s)"),
        ("cost.paper_access_s", s.cost.paper_access_s >= 0, "must be non-negative (seconds)"),
        ("fedprophet.mu", s.fedprophet.mu >= 0, "must be non-negative"),
        ("fedprophet.alpha", s.fedprophet.alpha > 0, "must be positive"),
        ("fedprophet.alpha_step", s.fedprophet.alpha_step >= 0, "must be non-negative"),
        ("fedprophet.delta", 0 <= s.fedprophet.delta < 1, "must be in [0, 1)"),
        ("fedprophet.warmup_rounds", s.fedprophet.warmup_rounds >= 0, "must be non-negative"),
        ("fedprophet.grace", 0 <= s.fedprophet.grace < 1, "must be a fraction in [0, 1)"),
        ("fedprophet.patience", 0 < s.fedprophet.patience <= 1, "must be a fraction in (0, 1]"),
        ("fedprophet.stage_lr_decay", 0 < s.fedprophet.stage_lr_decay <= 1, "must be in (0, 1]"),
        ("fedprophet.module_rounds", all(n >= 1 for n in s.fedprophet.module_rounds),
         "every module must run at least 1 round"),
        ("fedprophet.head_side", s.fedprophet.head_side >= 0, "must be 0 (the release's rule) or a side"),
        ("fedprophet.val_samples", s.fedprophet.val_samples >= 1, "must be at least 1"),
        ("fedprophet.apa_samples", s.fedprophet.apa_samples >= 1, "must be at least 1"),
        ("prox.mu", s.prox.mu >= 0, "must be non-negative"),
        ("curv.lam", s.curv.lam >= 0, "must be non-negative"),
        ("dyn.e0", s.dyn.e0 >= 1, "must be at least one epoch"),
        ("dyn.gamma", 0 < s.dyn.gamma <= 1, "must be in (0, 1]"),
        ("dyn.f", s.dyn.f >= 1, "must be at least 1 round"),
        ("sfat.alpha", 0 <= s.sfat.alpha < 1, "must be in [0, 1)"),
        ("sfat.k_hat", s.sfat.k_hat >= 1, "must be at least 1"),
        ("sfat.base", s.sfat.base in ("fedavg", "fedprox", "scaffold"),
         "must be fedavg, fedprox or scaffold"),
        ("gma.tau", 0 <= s.gma.tau <= 1, "must be in [0, 1]"),
        ("gma.base", s.gma.base in ("fedavg", "fedprox"), "must be fedavg or fedprox"),
        ("gma.server", s.gma.server in ("sgd", "adam", "yogi"), "must be sgd, adam or yogi"),
        ("gma.server_lr", s.gma.server_lr > 0, "must be positive"),
        ("gma.beta1", 0 <= s.gma.beta1 < 1, "must be in [0, 1)"),
        ("gma.beta2", 0 <= s.gma.beta2 < 1, "must be in [0, 1)"),
        ("gma.adapt_eps", s.gma.adapt_eps > 0, "must be positive"),
        ("width.levels", all(0 < v <= 1 for v in s.width.levels), "every level must be in (0, 1]"),
        ("width.min_fraction", 0 < s.width.min_fraction <= 1, "must be in (0, 1]"),
        ("distill.public_samples", s.distill.public_samples >= 1, "must be at least 1"),
        ("distill.server_iters", s.distill.server_iters >= 0, "must be non-negative"),
        ("distill.server_batch", s.distill.server_batch >= 1, "must be at least 1"),
        ("distill.server_lr", s.distill.server_lr > 0, "must be positive"),
        ("distill.temperature", s.distill.temperature > 0, "must be positive"),
        ("distill.diversity", s.distill.diversity >= 0, "must be non-negative"),
        ("ray.workers", s.ray.workers >= 0, "must be 0 (one per CPU) or positive"),
        ("ray.max_retries", s.ray.max_retries >= 0, "must be non-negative"),
        *((f"compare.rounds.{_printable(m)}", n >= 1, "must be at least 1")
          for m, n in s.compare.rounds.items()),
        ("ray.address", s.ray.trust_address or is_local_address(s.ray.address),
         "joins a Ray cluster that is not on this machine; Ray runs code it receives pickled, so set "
         "ray.trust_address = true only for a cluster you trust, or leave the address empty"),
        ("evaluation.extra", s.evaluation.attack not in s.evaluation.extra,
         f"must not repeat evaluation.attack ({s.evaluation.attack!r}, already the adv_acc column)"),
        ("evaluation.extra", len(set(s.evaluation.extra)) == len(s.evaluation.extra),
         "names an attack twice; give each once"),
    ]
    if s.data.partition == "skew":
        checks.append(("data.skew_s", (s.fleet.clients - 1) * s.data.skew_s < 100,
                       "skew gives each client s % of every other group: (clients - 1) x s "
                       "must stay below 100"))
    for key, ok, fix in checks:
        if not ok:
            raise EdgeflError(where, key, fix)
    _check_names(s, where)
    check_device(s.device, where)


MAX_THREADS = 1024  # far more than any CPU has; torch aborts natively on absurd counts
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


def is_local_address(address: str) -> bool:
    """"" (a new local Ray) or an address on this machine; "auto" may join any cluster."""
    host = address.removeprefix("ray://").rpartition(":")[0] or address.removeprefix("ray://")
    return address == "" or host in LOCAL_HOSTS


def check_device(name: str, where: str) -> None:
    """auto, cpu, cuda or cuda:N naming a GPU this machine has."""
    import re

    import torch

    match = re.fullmatch(r"cuda(?::(\d{1,4}))?", name)
    if name not in ("auto", "cpu") and match is None:
        raise EdgeflError(where, "device", f"unknown {name!r}; choose auto, cpu, cuda or cuda:N")
    if match is None:
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(match.group(1) or 0) >= count:
        have = f"GPUs 0 to {count - 1}" if count else "no GPU PyTorch can use"
        raise EdgeflError(where, "device", f"{name} is not on this machine ({have}); choose auto or cpu")


def _is_range(values: list[float], low: float, high: float) -> bool:
    return len(values) == 2 and low <= values[0] <= values[1] <= high


def _check_names(s: Scenario, where: str) -> None:
    """Names that must exist in a registry or along the scenario's profile search path."""
    from edgefl.attacks import ATTACKS
    from edgefl.data import DATASETS, PARTITIONS
    from edgefl.devices.catalog import catalog_for
    from edgefl.execution.objectives import OBJECTIVES
    from edgefl.methods import METHODS
    from edgefl.models import MODELS

    named = [
        ("method", s.method, METHODS.names()),
        ("model.name", s.model.name, MODELS.names()),
        ("data.dataset", s.data.dataset, DATASETS.names()),
        ("data.partition", s.data.partition, PARTITIONS.names()),
        ("attack.name", s.attack.name, [*ATTACKS.names(), "none"]),
        ("training.objective", s.training.objective, OBJECTIVES.names()),
        ("evaluation.attack", s.evaluation.attack, ATTACKS.names()),
    ]
    named += [("evaluation.extra", a, ATTACKS.names()) for a in s.evaluation.extra]
    named += [("compare.rounds", m, METHODS.names()) for m in s.compare.rounds]
    named += [("distill.family", m, MODELS.names()) for m in s.distill.family]
    catalog = catalog_for(where)
    named += [("fleet.devices", d, sorted(catalog.devices)) for d in s.fleet.devices]
    named += [("fleet.apps", a, sorted(catalog.apps)) for a in s.fleet.apps]
    for key, value, known in named:
        if value not in known:
            raise EdgeflError(where, key, f"unknown {value!r}; choose one of: {', '.join(known)}")
    for key in getattr(METHODS.get(s.method), "ignores", ()):
        section, _, leaf = key.partition(".")
        value, default = getattr(getattr(s, section), leaf), getattr(getattr(Scenario(), section), leaf)
        if value != default:
            raise EdgeflError(where, key, f"method {s.method} ignores it (it would have no effect); leave "
                              f"it at its default {_toml_value(default)} or choose another method")
    if not s.fleet.devices and not catalog.pool(s.fleet.pool):
        raise EdgeflError(
            where, "fleet.pool",
            f"no device profile is in pool {s.fleet.pool!r}; pools: {', '.join(catalog.pools())}",
        )


def to_toml(s: Scenario) -> str:
    """The resolved scenario as TOML (saved in every run directory)."""
    top, sections = [], []
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        if dataclasses.is_dataclass(value):
            body = "\n".join(f"{k} = {_toml_value(v)}" for k, v in vars(value).items())
            sections.append(f"[{f.name}]\n{body}\n")
        else:
            top.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(top) + "\n\n" + "\n".join(sections)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table; keys quoted, as any string may name a method
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)
