"""FedProphet's knobs, the `[fedprophet]` section of a scenario (Tang, Wang et al., FedProphet
§5-6; defaults from the authors' release)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgefl.config import Check, Knobs, knob_section


@knob_section("fedprophet")
@dataclass
class FedProphetConfig(Knobs):
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

    def checks(self) -> list[Check]:
        return [
            ("mu", self.mu >= 0, "must be non-negative"),
            ("alpha", self.alpha > 0, "must be positive"),
            ("alpha_step", self.alpha_step >= 0, "must be non-negative"),
            ("delta", 0 <= self.delta < 1, "must be in [0, 1)"),
            ("warmup_rounds", self.warmup_rounds >= 0, "must be non-negative"),
            ("grace", 0 <= self.grace < 1, "must be a fraction in [0, 1)"),
            ("patience", 0 < self.patience <= 1, "must be a fraction in (0, 1]"),
            ("stage_lr_decay", 0 < self.stage_lr_decay <= 1, "must be in (0, 1]"),
            ("module_rounds", all(n >= 1 for n in self.module_rounds),
             "every module must run at least 1 round"),
            ("head_side", self.head_side >= 0, "must be 0 (the release's rule) or a side"),
            ("val_samples", self.val_samples >= 1, "must be at least 1"),
            ("apa_samples", self.apa_samples >= 1, "must be at least 1"),
        ]
