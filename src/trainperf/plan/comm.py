"""Collective and point-to-point time by the alpha-beta model, on the link a group crosses.

Rank order is Megatron's: tp innermost, then cp, then dp, then pp. A group whose members
are ``stride`` ranks apart and which has ``size`` members stays inside one scale-up domain
(NVLink/xGMI/ICI) when ``stride * size <= domain``; otherwise its ring crosses the network.
Across the network NCCL runs one ring per NIC, so a group with ``k`` members per domain
gets ``min(scale-up, k * NIC)`` bus bandwidth (hierarchical rings).

Ring collectives over ``n`` members moving ``B`` bytes per member (NCCL's bus-bandwidth
convention):

* all-reduce: ``2 (n-1)/n * B / busbw``
* reduce-scatter, all-gather: ``(n-1)/n * B / busbw``

plus a latency term ``alpha * steps``; NCCL switches to trees when latency-bound, so steps
is ``2 * ceil(log2 n)`` for all-reduce and ``ceil(log2 n)`` for the others.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from trainperf.plan.efficiency import Efficiency
from trainperf.specs import Cluster


def _link_rates(cluster: Cluster, eff: Efficiency) -> tuple[float, float]:
    """Return (scale-up bus bandwidth, one NIC's bus bandwidth) in bytes/s; a calibrated bus rate wins."""
    up = eff.measured_bus_gbps * 1e9 if eff.measured_bus_gbps > 0 else cluster.scaleup_gbps * 1e9 * eff.scaleup_bus_eff
    return up, cluster.scaleout_gbps * 1e9 * eff.scaleout_bus_eff


def group_link(cluster: Cluster, eff: Efficiency, stride, size):
    """Return (bus bandwidth in bytes/s, alpha in s) of a group of ``size`` ranks ``stride`` apart.

    Inside the scale-up domain: NVLink-class bandwidth. Spanning it: ``k`` members per
    domain share ``k`` NICs, capped by the scale-up fabric.
    """
    stride = np.asarray(stride, dtype=float)
    size = np.asarray(size, dtype=float)
    domain = float(cluster.scaleup_domain)
    up, nic = _link_rates(cluster, eff)
    inside = stride * size <= domain
    per_domain = np.clip(np.floor(domain / stride), 1.0, None)
    across = np.minimum(up, per_domain * nic)
    bw = np.where(inside, up, across)
    alpha = np.where(inside, eff.alpha_scaleup_s, eff.alpha_scaleout_s)
    return bw, alpha


def p2p_link(cluster: Cluster, eff: Efficiency, stride):
    """Return (bandwidth bytes/s, alpha s) between two ranks ``stride`` apart (one NIC if apart)."""
    stride = np.asarray(stride, dtype=float)
    up, nic = _link_rates(cluster, eff)
    # neighbours are in one domain when the domain holds two consecutive blocks of `stride`
    same = 2 * stride <= cluster.scaleup_domain
    return np.where(same, up, nic), np.where(same, eff.alpha_scaleup_s, eff.alpha_scaleout_s)


def ring_p2p_link(cluster: Cluster, eff: Efficiency, stride, size):
    """Return (bandwidth bytes/s, alpha s) of a ring of point-to-point sends (ring attention).

    Every rank sends to its neighbour at once; a ring that leaves the scale-up domain has one
    hop per domain on a single NIC, and that hop paces every step.
    """
    stride = np.asarray(stride, dtype=float)
    size = np.asarray(size, dtype=float)
    up, nic = _link_rates(cluster, eff)
    inside = stride * size <= cluster.scaleup_domain
    return np.where(inside, up, nic), np.where(inside, eff.alpha_scaleup_s, eff.alpha_scaleout_s)


def _log2_steps(n):
    return np.ceil(np.log2(np.maximum(n, 1.0)))


def all_reduce_s(nbytes, n, busbw, alpha):
    """Return seconds of a ring all-reduce of ``nbytes`` per rank over ``n`` ranks (0 when n = 1)."""
    n = np.asarray(n, dtype=float)
    t = 2.0 * (n - 1.0) / n * nbytes / busbw + alpha * 2.0 * _log2_steps(n)
    return np.where(n > 1, t, 0.0)


def reduce_scatter_s(nbytes, n, busbw, alpha):
    """Return seconds of a ring reduce-scatter of ``nbytes`` (full, unsharded size) over ``n`` ranks."""
    n = np.asarray(n, dtype=float)
    t = (n - 1.0) / n * nbytes / busbw + alpha * _log2_steps(n)
    return np.where(n > 1, t, 0.0)


def all_gather_s(nbytes, n, busbw, alpha):
    """Return seconds of a ring all-gather producing ``nbytes`` (full size) on each of ``n`` ranks."""
    return reduce_scatter_s(nbytes, n, busbw, alpha)


def p2p_s(nbytes, bw, alpha):
    """Return seconds to send ``nbytes`` point to point."""
    return alpha + nbytes / bw


def all_to_all_s(cluster: Cluster, eff: Efficiency, nbytes, stride, size):
    """Return seconds of an all-to-all where each of ``size`` ranks (``stride`` apart) sends ``nbytes`` in all.

    A rank keeps 1/size of its bytes; of the rest, the peers in its own node are reached over
    NVLink-class links, the peers in other nodes of a scale-up domain that spans nodes (GB200
    NVL72 trays) at the accelerator's ``scaleup_a2a_gbps`` (NCCL's measured all-to-all rate
    there, far below the link: its point-to-point sends do not reach NVLink rates across the
    trays), and the others through this GPU's NIC; all run at once, so the slowest side paces
    the exchange. Latency: one ``alpha`` per doubling of the peers the NIC or the fabric must
    serve (NCCL's all-to-all is point-to-point sends to every peer).
    """
    stride = np.asarray(stride, dtype=float)
    size = np.asarray(size, dtype=float)
    up, nic = _link_rates(cluster, eff)
    local = np.minimum(np.clip(np.floor(cluster.scaleup_domain / stride), 1.0, None), size)
    across = nbytes * (size - local) / size / nic
    a2a_gbps = cluster.accelerator.scaleup_a2a_gbps
    if a2a_gbps > 0 and cluster.scaleup_domain > cluster.gpus_per_node:  # a domain of several nodes
        node = np.minimum(np.clip(np.floor(cluster.gpus_per_node / stride), 1.0, None), local)
        inside = np.maximum(nbytes * (node - 1.0) / size / up, nbytes * (local - node) / size / (a2a_gbps * 1e9))
    else:  # the search's hot path: one NVLink tier
        inside = nbytes * (local - 1.0) / size / up
    alpha = np.where(size > local, eff.alpha_scaleout_s, eff.alpha_scaleup_s)
    t = np.maximum(inside, across) + alpha * np.log2(np.maximum(size, 2.0))
    return np.where(size > 1, t, 0.0)


class RingAttention(NamedTuple):
    """Ring attention's KV exchange per layer (seconds): the part not hidden behind attention, and all of it."""

    fwd_exposed: np.ndarray | float
    bwd_exposed: np.ndarray | float
    fwd_sent: np.ndarray | float
    bwd_sent: np.ndarray | float


def ring_attention_s(kv_bytes, cp, bw, alpha, attn_fwd_s, attn_bwd_s) -> RingAttention:
    """Return ring attention's KV exchange per layer, forward and backward: exposed and in all (RingAttention, s).

    Context parallelism as TransformerEngine's p2p ring (Megatron-Core's default): each of the
    ``cp`` ranks holds two load-balanced chunks of the sequence, so every ring step computes the
    same share, ``1/cp`` of the rank's causal attention (``attn_fwd_s``, ``attn_bwd_s``: the whole
    layer's on this rank). ``kv_bytes``: one rank's K and V block; ``bw`` (bytes/s) and ``alpha``
    (s): the ring's link, as ring_p2p_link gives them. Forward: ``cp`` steps,
    ``cp - 1`` sends of the KV block, each behind one step's compute; a step cannot start before its
    block has arrived, so each step costs the larger of the two. Backward: ``cp`` steps with one send
    each, behind its step: the KV block alone (first), KV and the dKV accumulator packed
    (``cp - 2`` middle steps, 2x the bytes), dKV alone (last). ``*_sent``: the same sends with no
    compute to hide behind (what the links carry; their SM cost is priced as contention).
    """
    cp = np.asarray(cp, dtype=float)
    t1, t2 = p2p_s(kv_bytes, bw, alpha), p2p_s(2.0 * kv_bytes, bw, alpha)  # KV; KV and dKV packed
    step_f = attn_fwd_s / cp
    step_b = attn_bwd_s / cp
    fwd = (cp - 1.0) * np.maximum(0.0, t1 - step_f)
    bwd = 2.0 * np.maximum(0.0, t1 - step_b) + (cp - 2.0) * np.maximum(0.0, t2 - step_b)
    on = cp > 1
    return RingAttention(fwd_exposed=np.where(on, fwd, 0.0), bwd_exposed=np.where(on, bwd, 0.0),
                         fwd_sent=np.where(on, (cp - 1.0) * t1, 0.0),
                         bwd_sent=np.where(on, 2.0 * t1 + (cp - 2.0) * t2, 0.0))
