"""FLOPs and minimum bytes of XLA's HLO instructions, from the HLO modules a JAX profile carries.

jax.profiler writes each compiled module's `HloProto` into the XSpace's "/host:metadata" plane (an
event metadata per program, its "Hlo Proto" stat the serialized proto). With it a kernel named
after its HLO instruction (`hlo_module` / `hlo_op` stats) gets the cost the roofline needs, which
a JAX trace otherwise lacks (it records no input shapes). Decoded with the XSpace reader's wire
functions; field numbers from xla/service/hlo.proto (HloProto.hlo_module 1; HloModuleProto.name 1,
computations 3; HloComputationProto.name 1, instructions 2, id 5; HloInstructionProto.name 1,
opcode 2, shape 3, fusion_kind 11, dot_dimension_numbers 30, id 35, operand_ids 36,
called_computation_ids 38) and xla/xla_data.proto (ShapeProto.element_type 2, dimensions 3,
tuple_shapes 4; DotDimensionNumbers.lhs_contracting_dimensions 1; PrimitiveType).

Counting conventions, as the roofline's for PyTorch operators: a dot 2 x (output elements) x
(contracted size); a convolution 2 x (output elements) x (kernel elements per output feature);
an elementwise op 1 FLOP per output element, a reduce 1 per input element; data movement
(broadcast, reshape, copy, transpose, slice, ...) none. A fusion sums its fused instructions. Bytes:
the instruction's operands read once and its result written once (what reaches memory: a fusion's
intermediates stay in registers).

Collectives (all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute, their async
"-start" forms, collective-broadcast) also get their message size, which JAX traces otherwise lack,
in NCCL's convention (diagnose/collectives.py): the operands' bytes (sent) and the result's (received;
for an async "-start" other than all-reduce-start, whose result tuple also holds the operands, its
largest element), and the group size: the length of a replica group (HloInstructionProto
replica_groups 49, or collective_device_list 87 = CollectiveDeviceListProto: replica_groups 1,
iota_replica_group_list 2 with num_devices_per_group 2), or for a collective-permute the devices its
source_target_pairs (52) name. Empty replica groups mean one group of every device: size unknown (0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainperf.trace.categories import XLA_OPCODE_CATEGORY
from trainperf.trace.events import ELEMENTWISE, REDUCTION
from trainperf.trace.protowire import fields, map_entry, packed_varints

# xla_data.proto PrimitiveType -> bytes per element (sub-byte types rounded up to 1)
ELEMENT_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4, 12: 8, 15: 8, 16: 2, 18: 16,
                 19: 1, 20: 1, 21: 1, 22: 1, 23: 1, 24: 1, 25: 1}
PRECISION = {10: "fp16", 11: "fp32", 16: "bf16", 19: "fp8", 20: "fp8", 24: "fp8", 25: "fp8"}
_NO_FLOPS = {"parameter", "constant", "broadcast", "reshape", "bitcast", "copy", "transpose", "slice", "concatenate",
             "pad", "reverse", "iota", "tuple", "get-tuple-element", "dynamic-slice", "dynamic-update-slice",
             "gather", "scatter", "convert", "bitcast-convert", "copy-start", "copy-done"}


@dataclass(frozen=True, kw_only=True, slots=True)
class HloCost:
    """FLOPs and minimum bytes of one execution of an HLO instruction, its precision and shapes."""

    flops: float
    bytes: float
    precision: str    # of its first floating-point operand or result; "" when none
    shapes: str       # "f32[32,64] x f32[64,64] -> f32[32,64]"
    collective: "CollectiveSize | None" = None  # message size, for a collective instruction


# HLO collective opcodes -> the collective vocabulary of diagnose/collectives.py (NCCL's)
COLLECTIVE_KIND = {"all-reduce": "all_reduce", "all-reduce-start": "all_reduce", "all-gather": "all_gather",
                   "all-gather-start": "all_gather", "reduce-scatter": "reduce_scatter", "all-to-all": "all_to_all",
                   "ragged-all-to-all": "all_to_all", "collective-permute": "send_recv",
                   "collective-permute-start": "send_recv", "collective-broadcast": "broadcast"}
# xla_data.proto PrimitiveType -> PyTorch's dtype name, as PyTorch writes it in a collective's "dtype" arg
TORCH_DTYPE = {1: "Bool", 2: "Char", 3: "Short", 4: "Int", 5: "Long", 6: "Byte", 10: "Half", 11: "Float",
               12: "Double", 16: "BFloat16", 19: "Float8_e5m2", 20: "Float8_e4m3fn"}


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveSize:
    """Message size of one execution of an HLO collective on one device (module docstring)."""

    kind: str          # "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"
    in_bytes: int      # the operands (what this device sends)
    out_bytes: int     # the result (what it receives)
    group_size: int    # devices per group; 0 when the instruction does not say
    dtype: str         # PyTorch's name of the element type; "Byte" when the buffers mix types

    @property
    def nbytes(self) -> int:
        """NCCL's message size S: the larger of the send and receive buffers (bytes)."""
        return max(self.in_bytes, self.out_bytes)

    def kineto_args(self) -> dict:
        """The size as the args PyTorch writes on a collective (read by collectives.comm_args)."""
        size = ELEMENT_BYTES_BY_TORCH.get(self.dtype, 1)
        return {"In msg nelems": self.in_bytes // size, "Out msg nelems": self.out_bytes // size, "dtype": self.dtype,
                "Group size": self.group_size}


ELEMENT_BYTES_BY_TORCH = {name: ELEMENT_BYTES[t] for t, name in TORCH_DTYPE.items()}


@dataclass(frozen=True, slots=True)
class _Shape:
    element_type: int
    dims: tuple
    tuple_shapes: tuple

    @property
    def nbytes(self) -> int:
        if self.tuple_shapes:
            return sum(s.nbytes for s in self.tuple_shapes)
        return math.prod(self.dims) * ELEMENT_BYTES.get(self.element_type, 0)

    def arrays(self) -> list["_Shape"]:
        """The array shapes of this shape (itself, or the leaves of a tuple)."""
        return [a for s in self.tuple_shapes for a in s.arrays()] if self.tuple_shapes else [self]

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.tuple_shapes) if self.tuple_shapes else math.prod(self.dims)

    def text(self) -> str:
        if self.tuple_shapes:
            return "(" + ", ".join(s.text() for s in self.tuple_shapes) + ")"
        prec = {11: "f32", 16: "bf16", 10: "f16", 12: "f64", 4: "s32", 5: "s64", 1: "pred"}.get(self.element_type,
                                                                                                f"t{self.element_type}")
        return f"{prec}[{','.join(map(str, self.dims))}]"


@dataclass(slots=True)
class _Inst:
    name: str = ""
    opcode: str = ""
    shape: _Shape | None = None
    id: int = 0
    operands: tuple = ()
    calls: tuple = ()
    lhs_contracting: tuple = ()
    group_size: int = 0      # devices per replica group (collectives), 0 when not given


def _shape(b: bytes) -> _Shape:
    et, dims, tup = 0, [], []
    for f, wt, v in fields(b):
        if f == 2:
            et = v
        elif f == 3:
            dims += packed_varints(v, wt)
        elif f == 4:
            tup.append(_shape(v))
    return _Shape(et, tuple(dims), tuple(tup))


def _instruction(b: bytes) -> _Inst:
    d = _Inst()
    ops, calls, pairs = [], [], []
    for f, wt, v in fields(b):
        if f == 1:
            d.name = v.decode("utf-8", "replace")
        elif f == 2:
            d.opcode = v.decode("utf-8", "replace")
        elif f == 3:
            d.shape = _shape(v)
        elif f == 35:
            d.id = v
        elif f == 36:
            ops += packed_varints(v, wt)
        elif f == 38:
            calls += packed_varints(v, wt)
        elif f == 30:
            d.lhs_contracting = tuple(x for g, w, u in fields(v) if g == 1 for x in packed_varints(u, w))
        elif f == 49 and not d.group_size:  # a ReplicaGroup: replica_ids 1
            d.group_size = len([x for g, w, u in fields(v) if g == 1 for x in packed_varints(u, w)])
        elif f == 87:  # CollectiveDeviceListProto
            d.group_size = _device_list_group_size(v) or d.group_size
        elif f == 52:  # a SourceTarget pair: source 1, target 2 (0 is omitted on the wire)
            pairs.append({g: u for g, _, u in fields(v)})
    d.operands, d.calls = tuple(ops), tuple(calls)
    if pairs:
        d.group_size = len({p.get(1, 0) for p in pairs} | {p.get(2, 0) for p in pairs})
    return d


def _device_list_group_size(b: bytes) -> int:
    """Devices per group of a CollectiveDeviceListProto (explicit replica_groups 1, or the iota form 2)."""
    for f, _, v in fields(b):
        if f == 1:
            return len([x for g, w, u in fields(v) if g == 1 for x in packed_varints(u, w)])
        if f == 2:
            return next((u for g, _, u in fields(v) if g == 2), 0)
    return 0


def collective_size(opcode: str, operands: list, result, group_size: int) -> CollectiveSize | None:
    """Message size of a collective from its operand shapes and result shape (_Shape), or None for an
    instruction that is not a collective (module docstring)."""
    kind = COLLECTIVE_KIND.get(opcode)
    if kind is None or result is None:
        return None
    out = result
    if opcode.endswith("-start") and opcode != "all-reduce-start" and result.tuple_shapes:
        out = max(result.tuple_shapes, key=lambda s: s.nbytes)  # (operands, output[, contexts])
    arrays = [a for s in operands for a in s.arrays()] + out.arrays()
    types = {a.element_type for a in arrays}
    dtype = TORCH_DTYPE.get(types.pop(), "Byte") if len(types) == 1 else "Byte"
    return CollectiveSize(kind=kind, in_bytes=sum(s.nbytes for s in operands), out_bytes=out.nbytes,
                          group_size=group_size, dtype=dtype)


def module_costs(hlo_proto: bytes) -> tuple[str, dict[str, HloCost]]:
    """(module name, {instruction name: HloCost}) of the instructions of a serialized HloProto's
    non-fusion computations (the ones that run as kernels or thunks)."""
    module = next((v for f, _, v in fields(hlo_proto) if f == 1), b"")
    name, comps = "", []
    for f, _, v in fields(module):
        if f == 1:
            name = v.decode("utf-8", "replace")
        elif f == 3:
            comps.append(v)
    by_comp: dict[int, list[_Inst]] = {}
    for c in comps:
        cid, insts = 0, []
        for f, _, v in fields(c):
            if f == 2:
                insts.append(_instruction(v))
            elif f == 5:
                cid = v
        by_comp[cid] = insts
    by_id = {i.id: i for insts in by_comp.values() for i in insts}
    called = {c for insts in by_comp.values() for i in insts if i.opcode == "fusion" for c in i.calls}
    out = {}
    for cid, insts in by_comp.items():
        if cid in called:
            continue  # a fusion's body: costed through its fusion instruction
        for i in insts:
            if i.opcode in ("parameter", "constant", "tuple", "get-tuple-element") or i.shape is None:
                continue
            flops = _flops(i, by_id, by_comp)
            operands = [by_id[o].shape for o in i.operands if o in by_id and by_id[o].shape is not None]
            prec = next((PRECISION[s.element_type] for s in operands + [i.shape] if s.element_type in PRECISION), "")
            shapes = " x ".join(s.text() for s in operands) + " -> " + i.shape.text()
            out[i.name] = HloCost(flops=float(flops), bytes=float(sum(s.nbytes for s in operands) + i.shape.nbytes),
                                  precision=prec, shapes=shapes,
                                  collective=collective_size(i.opcode, operands, i.shape, i.group_size))
    return name, out


def _flops(i: _Inst, by_id: dict, by_comp: dict) -> int:
    """FLOPs of one instruction (module docstring); a fusion sums the instructions of its body."""
    if i.opcode == "fusion":
        return sum(_flops(j, by_id, by_comp) for c in i.calls for j in by_comp.get(c, ()))
    out = i.shape.numel if i.shape is not None else 0
    if i.opcode == "dot":
        lhs = by_id.get(i.operands[0]) if i.operands else None
        if lhs is None or lhs.shape is None:
            return 0
        return 2 * out * math.prod(lhs.shape.dims[d] for d in i.lhs_contracting if d < len(lhs.shape.dims))
    if i.opcode == "convolution":
        rhs = by_id.get(i.operands[1]) if len(i.operands) > 1 else None
        if rhs is None or rhs.shape is None or not rhs.shape.dims:
            return 0
        # kernel elements per output feature: all of the kernel but its output-feature dimension (the last
        # in XLA's default layout of dim_labels ..._01io->...); an estimate when the layout differs
        return 2 * out * (math.prod(rhs.shape.dims) // max(rhs.shape.dims[-1], 1))
    if i.opcode in _NO_FLOPS:
        return 0
    if XLA_OPCODE_CATEGORY.get(i.opcode) == REDUCTION and i.operands:
        src = by_id.get(i.operands[0])
        return src.shape.numel if src is not None and src.shape is not None else 0
    if XLA_OPCODE_CATEGORY.get(i.opcode) == ELEMENTWISE:
        return out
    return 0


def xspace_costs(data: bytes) -> dict[tuple[str, str], HloCost]:
    """{(module name, instruction name): HloCost} of every HLO module in an XSpace's "/host:metadata"
    plane; a pair two programs of the same name cost differently is left out (ambiguous)."""
    out: dict[tuple[str, str], HloCost] = {}
    clash: set = set()
    for f, _, plane in fields(data):
        if f != 1:
            continue
        pname, metas, stat_names = "", [], {}
        for ff, _, v in fields(plane):
            if ff == 2:
                pname = v.decode("utf-8", "replace")
            elif ff == 4:
                metas.append(v)
            elif ff == 5:
                k, raw = map_entry(v)
                stat_names[k] = next((s.decode("utf-8", "replace") for g, _, s in fields(raw) if g == 2), "")
        if pname != "/host:metadata":
            continue
        for m in metas:
            _, meta = map_entry(m)
            for g, _, x in fields(meta):
                if g != 5:
                    continue
                sid, raw = None, None
                for a, _, b in fields(x):
                    if a == 1:
                        sid = b
                    elif a == 6:
                        raw = b
                if raw is None or stat_names.get(sid) != "Hlo Proto":
                    continue
                name, costs = module_costs(raw)
                for op, c in costs.items():
                    key = (name, op)
                    if key in out and out[key] != c:
                        clash.add(key)
                    out[key] = c
    for key in clash:
        del out[key]
    return out
