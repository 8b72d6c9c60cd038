"""FedProphet (Tang, Wang et al.): memory-efficient federated adversarial training by cascade
learning. knobs: its `[fedprophet]` scenario section; partition: Alg. 1; cascade: the client's
adversarial cascade learning (Eq. 7, 11); coordinator: APA, DMA and stage control (Eq. 9-13);
method: the server loop (Alg. 2) with the partial average (Eq. 14-15)."""

from edgefl.methods.fedprophet.method import FedProphet

__all__ = ["FedProphet"]
