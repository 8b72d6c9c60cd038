"""CW-inf: Carlini & Wagner's margin loss (S&P 2017) maximised by PGD in the L-inf ball.

As in the robust-FL evaluations (SFAT, Zhu et al., ICLR 2023, §5 and App. E, after the TRADES / FAT
code): the loss is max_{j != y} z_j - z_y on the logits z, raised by signed-gradient steps from a
uniform random start, with the training bound and step (eps 8/255, step 2/255) and 20 steps.
The released code caps the margin at a confidence kappa = 50, which only stops the ascent for
samples already misclassified by 50 logits; accuracy is the same without the cap.
"""

from __future__ import annotations

import torch
from torch import nn

from edgefl.attacks.base import ATTACKS
from edgefl.attacks.pgd import PGD


def cw_margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of max_{j != y} z_j - z_y: positive where another class outscores y."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    is_true = nn.functional.one_hot(y, logits.shape[1]).bool()
    other = logits.masked_fill(is_true, float("-inf")).amax(dim=1)
    return (other - true).mean()


@ATTACKS.register("cw")
class CW(PGD):
    """PGD-Linf (the same loop, random start included) on the CW margin instead of cross-entropy."""

    def __init__(self, eps: float = 8 / 255, step_size: float = 2 / 255, steps: int = 20) -> None:
        super().__init__(eps=eps, step_size=step_size, steps=steps, loss=cw_margin)
