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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainperf.trace.categories import XLA_OPCODE_CATEGORY
from trainperf.trace.events import ELEMENTWISE, REDUCTION

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


def _packed(v, wt) -> list[int]:
    from trainperf.trace.xplane import _varint

    if wt == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = _varint(v, i)
        out.append(x)
    return out


def _shape(b: bytes) -> _Shape:
    from trainperf.trace.xplane import _fields

    et, dims, tup = 0, [], []
    for f, wt, v in _fields(b):
        if f == 2:
            et = v
        elif f == 3:
            dims += _packed(v, wt)
        elif f == 4:
            tup.append(_shape(v))
    return _Shape(et, tuple(dims), tuple(tup))


def _instruction(b: bytes) -> _Inst:
    from trainperf.trace.xplane import _fields

    d = _Inst()
    ops, calls = [], []
    for f, wt, v in _fields(b):
        if f == 1:
            d.name = v.decode("utf-8", "replace")
        elif f == 2:
            d.opcode = v.decode("utf-8", "replace")
        elif f == 3:
            d.shape = _shape(v)
        elif f == 35:
            d.id = v
        elif f == 36:
            ops += _packed(v, wt)
        elif f == 38:
            calls += _packed(v, wt)
        elif f == 30:
            d.lhs_contracting = tuple(x for g, w, u in _fields(v) if g == 1 for x in _packed(u, w))
    d.operands, d.calls = tuple(ops), tuple(calls)
    return d


def module_costs(hlo_proto: bytes) -> tuple[str, dict[str, HloCost]]:
    """(module name, {instruction name: HloCost}) of the instructions of a serialized HloProto's
    non-fusion computations (the ones that run as kernels or thunks)."""
    from trainperf.trace.xplane import _fields

    module = next((v for f, _, v in _fields(hlo_proto) if f == 1), b"")
    name, comps = "", []
    for f, _, v in _fields(module):
        if f == 1:
            name = v.decode("utf-8", "replace")
        elif f == 3:
            comps.append(v)
    by_comp: dict[int, list[_Inst]] = {}
    for c in comps:
        cid, insts = 0, []
        for f, _, v in _fields(c):
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
                                  precision=prec, shapes=shapes)
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
    from trainperf.trace.xplane import _fields, _map_entry

    out: dict[tuple[str, str], HloCost] = {}
    clash: set = set()
    for f, _, plane in _fields(data):
        if f != 1:
            continue
        pname, metas, stat_names = "", [], {}
        for ff, _, v in _fields(plane):
            if ff == 2:
                pname = v.decode("utf-8", "replace")
            elif ff == 4:
                metas.append(v)
            elif ff == 5:
                k, raw = _map_entry(v)
                stat_names[k] = next((s.decode("utf-8", "replace") for g, _, s in _fields(raw) if g == 2), "")
        if pname != "/host:metadata":
            continue
        for m in metas:
            _, meta = _map_entry(m)
            for g, _, x in _fields(meta):
                if g != 5:
                    continue
                sid, raw = None, None
                for a, _, b in _fields(x):
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
