"""Expert-parallel load balancing (EPLB): replicate hot experts and place replicas so
every device carries about the same routed-token load.

Two strategies, after DeepSeek's EPLB description:

- global: replicate over the whole pool, then pack replicas onto devices;
- hierarchical (``num_nodes > 1``): pack expert groups onto nodes first (so most
  traffic stays inside a node), then replicate and pack inside each node.

Replication is greedy on the current per-replica load (the expert whose replicas carry
the most load gets the next replica); packing is greedy longest-processing-time with an
equal number of slots per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenops import hookimpl

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"eplb": ("devices", "redundant", "nodes", "plan_interval_s")}


class PlacementError(ValueError):
    """The requested devices/redundancy cannot hold the experts evenly."""


@dataclass(slots=True)
class LayerPlacement:
    #: device index -> expert ids of the replicas it hosts (one per slot)
    devices: list[list[int]]
    #: expert id -> number of replicas
    replicas: list[int]
    #: device index -> routed-token load it carries under this placement
    device_load: list[float]

    @property
    def balancedness(self) -> float:
        return _max_over_mean(self.device_load)


@dataclass(slots=True)
class PlacementPlan:
    strategy: str
    num_devices: int
    num_redundant: int
    num_nodes: int
    layers: list[LayerPlacement] = field(default_factory=list)
    #: per layer, max/mean device load with the experts split evenly and no replicas
    balancedness_before: list[float] = field(default_factory=list)

    @property
    def balancedness_after(self) -> list[float]:
        return [layer.balancedness for layer in self.layers]

    def summary(self) -> dict:
        """A compact view for dashboards: worst layer before/after and hot experts."""
        hot = []
        for i, layer in enumerate(self.layers):
            reps = ", ".join(f"e{e}x{c}" for e, c in enumerate(layer.replicas) if c > 1)
            if reps:
                hot.append(f"L{i}: {reps}")
        return {
            "strategy": self.strategy,
            "devices": self.num_devices,
            "redundant": self.num_redundant,
            "max_imbalance_before": max(self.balancedness_before),
            "max_imbalance_after": max(self.balancedness_after),
            "replicated": "; ".join(hot) or "none",
        }

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "num_devices": self.num_devices,
            "num_redundant": self.num_redundant,
            "num_nodes": self.num_nodes,
            "balancedness_before": self.balancedness_before,
            "balancedness_after": self.balancedness_after,
            "layers": [
                {"devices": lay.devices, "replicas": lay.replicas, "device_load": lay.device_load}
                for lay in self.layers
            ],
        }


def _max_over_mean(values: list[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def replicate(load: list[float], num_replicas: int) -> list[int]:
    """Replica count per expert: ``len(load)`` originals plus greedy extras."""
    assert num_replicas >= len(load)
    counts = [1] * len(load)
    for _ in range(num_replicas - len(load)):
        hottest = max(range(len(load)), key=lambda e: load[e] / counts[e])
        counts[hottest] += 1
    return counts


def pack(weights: list[float], num_bins: int, items_per_bin: int) -> list[list[int]]:
    """Indices of ``weights`` packed into bins of equal item count, balancing sums."""
    assert len(weights) == num_bins * items_per_bin
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    sums = [0.0] * num_bins
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        open_bins = [b for b in range(num_bins) if len(bins[b]) < items_per_bin]
        b = min(open_bins, key=lambda b: sums[b])
        bins[b].append(i)
        sums[b] += weights[i]
    return bins


def _place_flat(
    load: list[float], experts: list[int], num_devices: int, num_redundant: int
) -> tuple[list[list[int]], list[int]]:
    sub = [load[e] for e in experts]
    counts = replicate(sub, len(sub) + num_redundant)
    replica_experts = [e for e, c in zip(experts, counts) for _ in range(c)]
    replica_load = [load[e] / c for e, c in zip(experts, counts) for _ in range(c)]
    slots = len(replica_experts) // num_devices
    bins = pack(replica_load, num_devices, slots)
    return [[replica_experts[i] for i in b] for b in bins], counts


def _num_groups(num_experts: int, num_nodes: int) -> int:
    """The most groups (down to 2 experts each) that still split evenly over the nodes."""
    for size in range(2, num_experts + 1):
        if num_experts % size == 0 and (num_experts // size) % num_nodes == 0:
            return num_experts // size
    return num_nodes


def place_layer(load: list[float], num_devices: int, num_redundant: int, num_nodes: int = 1) -> LayerPlacement:
    num_experts = len(load)
    if (num_experts + num_redundant) % num_devices:
        raise PlacementError(
            f"{num_experts} experts + {num_redundant} redundant = {num_experts + num_redundant} slots "
            f"do not divide evenly over {num_devices} devices"
        )
    if num_devices % num_nodes or num_experts % num_nodes or num_redundant % num_nodes:
        raise PlacementError(
            f"devices ({num_devices}), experts ({num_experts}) and redundant ({num_redundant}) must divide by nodes ({num_nodes})"
        )
    replicas = [0] * num_experts
    devices: list[list[int]] = []
    if num_nodes == 1:
        devices, counts = _place_flat(load, list(range(num_experts)), num_devices, num_redundant)
        replicas = counts
    else:
        # Contiguous expert groups (so routing stays node-local) packed onto nodes by
        # load; finer groups let the node-level packing balance better.
        num_groups = _num_groups(num_experts, num_nodes)
        size = num_experts // num_groups
        groups = [list(range(g * size, (g + 1) * size)) for g in range(num_groups)]
        nodes = pack([sum(load[e] for e in g) for g in groups], num_nodes, num_groups // num_nodes)
        for node_groups in nodes:
            experts = sorted(e for g in node_groups for e in groups[g])
            node_devices, counts = _place_flat(load, experts, num_devices // num_nodes, num_redundant // num_nodes)
            devices.extend(node_devices)
            for e, c in zip(experts, counts):
                replicas[e] = c
    device_load = [sum(load[e] / replicas[e] for e in d) for d in devices]
    return LayerPlacement(devices=devices, replicas=replicas, device_load=device_load)


def plan(load: list[list[float]], num_devices: int, num_redundant: int, num_nodes: int = 1) -> PlacementPlan:
    if num_devices < 1 or num_redundant < 0 or num_nodes < 1:
        raise PlacementError("devices and nodes must be >= 1 and redundant >= 0")
    if not load:
        raise PlacementError("no expert load recorded")
    result = PlacementPlan("hierarchical" if num_nodes > 1 else "global", num_devices, num_redundant, num_nodes)
    for layer_load in load:
        num_experts = len(layer_load)
        if num_experts % num_devices:
            naive = None
        else:
            per = num_experts // num_devices
            naive = [sum(layer_load[d * per : (d + 1) * per]) for d in range(num_devices)]
        result.balancedness_before.append(_max_over_mean(naive) if naive else float("nan"))
        result.layers.append(place_layer([float(x) for x in layer_load], num_devices, num_redundant, num_nodes))
    return result


@hookimpl(trylast=True)
def tokenops_expert_placement(load, num_devices, num_redundant, num_nodes):
    return plan(load, num_devices, num_redundant, num_nodes)
