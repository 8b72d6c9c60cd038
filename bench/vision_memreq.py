"""MemReq against measured peak memory for torchvision and timm models cut into atoms (issue 53).

The same measurement as bench/memreq.py (whose `measure` and table this reuses: MemReq of one
PGD-K adversarial SGD-momentum iteration against the allocator's peak over two real iterations of
edgefl's `train_local`), for `torchvision:NAME` and `timm:NAME` models cut into atoms by
edgefl.models.cut, on 3xSxS inputs (S = --side, 32 by default) with CIFAR-10's statistics and 10
classes.

Run:
    .venv/bin/python bench/vision_memreq.py          # timm:resnet18, torchvision:mobilenet_v3_small
    .venv/bin/python bench/vision_memreq.py --side 128
    .venv/bin/python bench/vision_memreq.py --models torchvision:resnet18 --batch 64 --steps 10

At batch 32 and PGD-3 the two default models take about a minute on a 2-core CPU (--side 128: about
two). Figures only: nothing is asserted. On 32x32 inputs an ImageNet-stem ResNet's last stage runs
on 1x1 maps, where oneDNN's weight-gradient kernel takes a scratch of 4x the weights per thread,
which MemReq does not model (docs/scenarios.md).
"""

from __future__ import annotations

import argparse

import torch
from memreq import CIFAR_MEAN, CIFAR_STD, Case, measure, print_table

from edgefl.training.local import resolve_device

MODELS = ["timm:resnet18", "torchvision:mobilenet_v3_small"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=MODELS, help="torchvision:NAME or timm:NAME models")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="PGD steps (default 3)")
    parser.add_argument("--iters", type=int, default=2, help="training iterations measured (default 2)")
    parser.add_argument("--side", type=int, default=32, help="input side (default 32: 3x32x32)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"PGD-{args.steps}, batch {args.batch} of 3x{args.side}x{args.side}, {args.iters} iterations "
          "from a fresh model")
    cases = [Case(name, (3, args.side, args.side), CIFAR_MEAN, CIFAR_STD, args.batch, 8 / 255, 2 / 255)
             for name in args.models]
    rows = [measure(case, args.batch, device, args.iters, args.steps) for case in cases]
    how = ("torch.cuda.max_memory_allocated" if device.type == "cuda" else "CPU allocator events from "
           "torch.profiler(profile_memory=True): peak running sum + weights and buffers")
    print_table(rows, how)


if __name__ == "__main__":
    main()
