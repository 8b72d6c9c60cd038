"""A network cut into atoms where one tensor flows between its parts (issue 53): torchvision and
timm models in runs.

torch.fx traces the network's forward to its operators in order (Reed et al., "torch.fx: Practical
Program Capture and Transformation for Deep Learning in Python", MLSys 2022), torch.nn's layers and
every module that holds tensors of its own (timm's BatchNormAct2d) or no submodules kept whole
(`LeafTracer`). Each operator belongs to a block: the module it runs in, taken from the root down
through plain containers (Sequential, ModuleList, ModuleDict) to the first module that is not one
(torchvision's BasicBlock `layer1.0`, MobileNetV3's `features.3`). A block is one atom; the layers
between blocks (a stem's conv, BN, ReLU and max-pool; a head's pool, flatten and linear) make one
atom up to the next conv or linear after one that holds weights (VGG's conv-ReLU-pool triples).

The network is cut between two atoms only where exactly one value computed before is used after and
it is a tensor, no module or constant is used on both sides, and no operator after writes it in
place; otherwise the two atoms are one. Each atom is a GraphModule running its
operators on the parameters of the network (the same tensors), so the atoms in sequence compute the
network's forward. Atoms are named by their module paths, dots as underscores (`layer1_0`), a run of
layers by its first and last (`conv1_to_maxpool`).

A network is refused, in one line, when its forward does not trace, differs between training and
evaluation outside its layers (fx records the branch taken while tracing: GoogLeNet's auxiliary
heads), needs other inputs than one image batch (optional ones keep their defaults) or returns
other than one tensor, or has no cut.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from edgefl.errors import EdgeflError

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)  # exact types: subclasses are blocks
STARTS = (nn.modules.conv._ConvNd, nn.Linear)  # the layers that open a new atom of loose layers
KEY = "model.name"


class LeafTracer(fx.Tracer):
    """Keeps torch.nn's layers, modules without submodules and modules that hold tensors of their
    own whole: their forward may branch on `self.training`, which must stay live."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        own = bool(m._parameters) or bool(m._buffers)
        return super().is_leaf_module(m, module_qualified_name) or own or next(m.children(), None) is None


@dataclass
class Unit:
    """Consecutive operators of one block (`loose` when it is a layer between blocks)."""

    name: str
    nodes: list[fx.Node]
    loose: bool
    starts: bool  # a conv or linear layer
    weighted: bool  # runs a layer that holds parameters


def cut(net: nn.Module, input_shape: tuple[int, ...], label: str, where: str) -> list[tuple[str, nn.Module]]:
    """`net`'s atoms, named, in order; one line naming `label` when it cannot be cut."""
    gm = _traced(net, label, where)
    x = torch.rand(2, *input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gm.eval()(x)  # an input the network cannot take fails here, as the network itself would
        ShapeProp(gm).propagate(x)
    gm.train()
    nodes = list(gm.graph.nodes)
    result = nodes[-1].args[0]
    if not (isinstance(result, fx.Node) and isinstance(result.meta.get("tensor_meta"), TensorMetadata)):
        raise EdgeflError(where, KEY, f"{label}'s forward returns {type(result).__name__} values, not one "
                          "tensor of logits; runs need a network that maps an image batch to logits")
    ops = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
    atoms = _merged(_atoms(_units(net, ops)), gm)
    if len(atoms) < 2:
        raise EdgeflError(where, KEY, f"{label} has no point where one tensor alone flows from a part of its "
                          "forward to the rest, so it cannot be cut into atoms; FedProphet's modules, the "
                          "profiler and the cost model need them (choose another model)")
    ends = [nodes[0], *(out for _, out in atoms[:-1]), result]
    return [(name, _atom(gm, group, ends[k], ends[k + 1])) for k, (name, group) in enumerate(_named(atoms))]


def _traced(net: nn.Module, label: str, where: str) -> fx.GraphModule:
    """`net` traced in training mode, its optional arguments at their defaults, checked to trace as
    in evaluation mode and to take one input."""
    params = list(inspect.signature(net.forward).parameters.values())[1:]
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    if required:
        raise EdgeflError(where, KEY, f"{label}'s forward also needs {', '.join(required)}; runs give it "
                          "one image batch")
    defaults = {p.name: p.default for p in params}
    try:
        graphs = [_fixed(LeafTracer().trace(net.train(mode), defaults)) for mode in (False, True)]
    except Exception as e:  # fx raises many kinds on code it cannot trace
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise EdgeflError(where, KEY, f"{label}'s forward cannot be traced by torch.fx ({why}), so it "
                          "cannot be cut into atoms; choose another model") from None
    if graphs[0].python_code("self").src != graphs[1].python_code("self").src:
        raise EdgeflError(where, KEY, f"{label}'s forward runs differently in training and evaluation "
                          "outside its layers (a branch on self.training), which a traced atom would "
                          "fix to one mode; choose another model or turn the branch off in model.kwargs")
    return fx.GraphModule(net, graphs[1])


def _fixed(graph: fx.Graph) -> fx.Graph:
    """`graph` without the inputs after the first, traced at their defaults, and fx's checks of them."""
    doomed: list[fx.Node] = [n for n in graph.nodes if n.op == "placeholder"][1:]
    for node in doomed:
        doomed += [u for u in node.users if u not in doomed]
    for node in reversed(list(graph.nodes)):
        if node in doomed:
            graph.erase_node(node)
    return graph


def _units(net: nn.Module, ops: list[fx.Node]) -> list[Unit]:
    """Runs of consecutive operators of one block."""
    units: list[Unit] = []
    for node in ops:
        block = _block(net, _owner(node))
        if units and units[-1].name == (block or node.name) and block:
            units[-1].nodes.append(node)
            continue
        module = net.get_submodule(block) if block else None
        called = node.op == "call_module" and node.target == block
        loose = module is None or (called and _is_layer(module)) or next(module.parameters(), None) is None
        units.append(Unit(block or node.name, [node], loose, called and isinstance(module, STARTS),
                          module is not None and next(module.parameters(), None) is not None))
    return units


def _is_layer(module: nn.Module) -> bool:
    """A module without submodules, or one of torch.nn's layers (timm's BatchNormAct2d, a
    BatchNorm2d running its activation); not a block kept whole for its own tensors (ConvNeXt's)."""
    return next(module.children(), None) is None or any(
        c.__module__.startswith("torch.nn.modules.") and c not in (nn.Module, *CONTAINERS)
        for c in type(module).__mro__)


def _owner(node: fx.Node) -> str:
    """The module path `node` runs in ("" for the root's own operators)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def _block(net: nn.Module, path: str) -> str:
    """The block `path` lies in: its first module below the root that is not a plain container."""
    parts: list[str] = []
    module = net
    for part in path.split(".") if path else []:
        module, parts = module.get_submodule(part), [*parts, part]
        if type(module) not in CONTAINERS:
            break
    return ".".join(parts)


def _atoms(units: list[Unit]) -> list[list[Unit]]:
    """Blocks alone; loose layers together, a conv or linear after a layer with weights opening anew."""
    atoms: list[list[Unit]] = []
    for u in units:
        last = atoms[-1] if atoms else None
        if last and u.loose and last[-1].loose and not (u.starts and any(v.weighted for v in last)):
            last.append(u)
        else:
            atoms.append([u])
    return atoms


def _merged(atoms: list[list[Unit]], gm: fx.GraphModule) -> list[tuple[list[Unit], fx.Node | None]]:
    """Neighbouring atoms joined where the network cannot be cut between them, each with the one
    tensor flowing out of it (`_flowing`; None for the last)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    out: list[tuple[list[Unit], fx.Node | None]] = []
    for atom in atoms:
        flowing = _flowing(out[-1][0][-1].nodes[-1], order, gm) if out else None
        if out and flowing is None:
            out[-1] = (out[-1][0] + atom, None)
        else:
            if out:
                out[-1] = (out[-1][0], flowing)
            out.append((list(atom), None))
    return out


def _flowing(last: fx.Node, order: dict[fx.Node, int], gm: fx.GraphModule) -> fx.Node | None:
    """The one tensor flowing from the operators up to `last` to those after, or None where more
    flows, a module or constant is used on both sides, or an operator after writes it in place."""
    i = order[last]
    live = [n for n in gm.graph.nodes if order[n] <= i and n.op != "get_attr"
            and any(order[u] > i for u in n.users)]
    if len(live) != 1 or not isinstance(live[0].meta.get("tensor_meta"), TensorMetadata):
        return None
    spans: dict[object, list[int]] = {}
    for n in gm.graph.nodes:
        if n.op in ("call_module", "get_attr"):
            spans.setdefault(n.target, []).append(order[n])
    crossed = any(min(s) <= i < max(s) for s in spans.values())
    written = any(_writes(u, live[0], gm) for u in live[0].users if order[u] > i)
    return None if crossed or written else live[0]


def _writes(node: fx.Node, value: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether `node` writes `value`, its first input, in place (an in-place module or `x.add_`)."""
    if not node.args or node.args[0] is not value:
        return False
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(str(node.target)), "inplace", False))
    name = getattr(node.target, "__name__", str(node.target))
    return bool(node.kwargs.get("inplace")) or (name.endswith("_") and not name.endswith("__"))


def _named(atoms: Sequence[tuple[list[Unit], fx.Node | None]]) -> list[tuple[str, list[fx.Node]]]:
    """Each atom's name (its module path, or its first and last layers') and operators."""
    named: list[tuple[str, list[fx.Node]]] = []
    for k, (units, _) in enumerate(atoms):
        ends = [units[0].name] if len(units) == 1 else [units[0].name, units[-1].name]
        name = "_to_".join(e.replace(".", "_") for e in ends)
        taken = name in {n for n, _ in named} or name == "norm"  # the input normalisation's
        named.append((f"{name}_{k}" if taken else name, [n for u in units for n in u.nodes]))
    return named


def _atom(gm: fx.GraphModule, nodes: list[fx.Node], source: fx.Node, result: fx.Node) -> fx.GraphModule:
    """The GraphModule running `nodes` on the tensor `source` flowing in, giving `result`."""
    graph = fx.Graph()
    env = {source: graph.placeholder("x")}
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in env:  # a constant (get_attr): the cut let no other value in
                env[arg] = graph.node_copy(arg)
        env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(env[result])
    return fx.GraphModule(gm, graph, class_name="Atom")
