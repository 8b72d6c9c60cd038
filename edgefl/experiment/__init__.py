"""An experiment: a scenario run end to end, real training against the simulated clock.

prepare: the data, splits, profile, fleet and method (and `Rebuild`, the method remade in a worker
process); loop: the round loop and the run folder; players: how each round mode's rounds are played
(rounds: a round drawn, planned, priced and played as columns; living: on a living fleet;
async_rounds: FedBuff's); rows: the logs and the summary; resume: the checks before a run continues
from its checkpoint, and what it restores; compare: methods over seeds against a reference, paired
(edgefl.compare and `edgefl compare` call it).
"""

from edgefl.experiment.loop import prepare_out, run, start_or_resume
from edgefl.experiment.prepare import Experiment, fitted_profile, prepare
from edgefl.experiment.rows import CLIENTS, EVENTS, METRICS

__all__ = ["CLIENTS", "EVENTS", "METRICS", "Experiment", "fitted_profile", "prepare", "prepare_out", "run",
           "start_or_resume"]
