"""Step 1: hash the weights of every eligible layer (METHOD.md step 1).

Each eligible layer's weight tensor is replaced by its hashed version (every weight becomes the
mode of its KDE cell), or by the uniform int8 baseline. Biases are never hashed. With
``codebook=True`` the hashed tensor is stored as a codebook plus escape-coded codes and
rebuilt by standard ops that onnxruntime folds into a constant when the session starts
(``codebook.py``): the file shrinks, the computation is the plain hashed model's.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import numpy as np
import onnx

from ..analysis.layers import ConstantTensors, Refusal, np_dtype, representable, scan_layers, tensor_like
from ..config import HashConfig
from ..hashing import hash_tensor, uniform_int8
from ..hashing.kde import grid_step
from .codebook import MIN_OPSET, opset_version, refusal, set_metadata, tensor_codes, write_codebooks


@dataclasses.dataclass
class LayerHash:
    """What hashing did to one layer (a row of the report)."""

    name: str
    op_type: str
    weight: str
    shape: tuple
    params: int
    macs: Optional[int]
    method: str                      # "kde" | "uniform-int8" | "unchanged"
    distinct_before: int
    distinct_after: int
    rel_error: float
    bandwidth: Optional[float] = None
    factor: Optional[float] = None
    modes: Optional[int] = None
    u_l: Optional[float] = None      # per-weight bound min(A, B)
    granularity: Optional[str] = None  # rd: "tensor" | "groups of g" | "channel" | "unchanged"
    codebooks: Optional[int] = None    # rd: codebooks of the layer
    bits_per_weight: Optional[float] = None  # rd: entropy-coded bits per weight, tables included (counted)
    sensitivity: Optional[float] = None  # rd: relative logit energy per unit of distortion (small errors)
    sensitivity_proxy: Optional[str] = None  # rd: "synthetic" | "bn" | "params"
    weighted_rel_error: Optional[float] = None  # rd: the distortion the allocation sees, relative
    predicted_error: Optional[float] = None  # rd: predicted relative L2 error of the logits from this layer
    correction: Optional[str] = None   # rd: data-free gain/bias correction of what follows
    code_bits: Optional[float] = None  # --codebook: stored code bits per weight (mean)
    codebook_type: Optional[str] = None  # --codebook: "int16" (grid indices x step) or "float32"
    seconds: float = 0.0
    reasons: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class HashPassResult:
    model: onnx.ModelProto
    layers: list                     # LayerHash per eligible layer
    refused: list                    # Refusal per candidate that is not eligible
    codebook_layers: int = 0
    lattice_units: dict = dataclasses.field(default_factory=dict)  # weight -> h/2 of its modes' grid (None: no grid)
    rd: Optional[dict] = None        # rd hashing: budget, predicted error, bits, proxy, seconds (RDResult)
    # or one h/2 per slice along lattice_axes[weight] (one grid per channel or channel group)
    lattice_axes: dict = dataclasses.field(default_factory=dict)  # weight -> output-channel axis (absent: 0)
    lattice_groups: dict = dataclasses.field(default_factory=dict)  # weight -> group id per channel (optional)


class HashPass:
    """``HashPass(config, codebook=False).run(model)`` -> :class:`HashPassResult`."""

    def __init__(self, config: HashConfig, *, codebook: bool = False,
                 progress: Optional[Callable[[int, int, str], None]] = None):
        self.config = config
        self.codebook = codebook
        self.progress = progress

    def _hash(self, w: np.ndarray):
        if self.config.uniform_int8:
            return "uniform-int8", uniform_int8(w)
        c = self.config
        return "kde", hash_tensor(w, weight_error=c.weight_error, bandwidth_factor=c.bandwidth_factor,
                                  nms_radius=c.nms_radius, snap_zero=c.snap_zero)

    def run(self, model: onnx.ModelProto) -> HashPassResult:
        if self.config.method == "rd" and not self.config.uniform_int8:
            result = self._run_rd(model)
            if self.codebook:
                store_codebooks(result)
            return result
        scan = scan_layers(model, include_grouped=self.config.include_depthwise, tables=True)
        out = onnx.ModelProto()
        out.CopyFrom(model)
        consts = ConstantTensors(out)
        stats, codebooks = [], []
        for k, layer in enumerate(scan.layers):
            if self.progress:
                self.progress(k, len(scan.layers), layer.node)
            t0 = time.perf_counter()
            proto = consts.proto(layer.weight)
            w = consts.floats(layer.weight)  # float16 / bfloat16: hashed in float32
            method, res = self._hash(w)
            row = LayerHash(layer.node, layer.op_type, layer.weight, layer.weight_shape, layer.params, layer.macs,
                            method if res.reason is None else "unchanged", res.distinct_before,
                            res.distinct_after, float(res.rel_error))
            if method == "kde":
                row.bandwidth, row.factor, row.modes, row.u_l = res.bandwidth, res.factor, res.n_modes, res.bound
            if res.reason:
                row.reasons.append(res.reason)
            else:
                if proto.data_type != onnx.TensorProto.FLOAT:  # the values its own type keeps
                    row.distinct_after = int(np.unique(representable(res.hashed, proto.data_type)).size)
                proto.CopyFrom(tensor_like(proto, res.hashed))
                codebooks.append((layer, res))
            row.seconds = time.perf_counter() - t0
            stats.append(row)
        if self.progress:
            self.progress(len(scan.layers), len(scan.layers), "")
        result = HashPassResult(out, stats, list(scan.refused),
                                lattice_units={l.weight: _lattice_unit(r) for l, r in codebooks})
        if self.codebook:
            store_codebooks(result)
        return result


    def _rd_at_guessed_sizes(self, model, budget, settings, notes) -> tuple:
        """``rd_hash`` with the synthetic sensitivity, the dynamic dims (other than the batch, not given
        with --input-shape) set to the verification's guesses in turn (``verify.GUESS_DIM``, then
        ``GUESS_FALLBACKS``): the first size at which the model runs (noted); ``(None, None)`` when none."""
        from ..analysis.layers import _INPUT_SHAPES, input_shapes
        from ..errors import RedppError
        from ..hashing import rd
        from ..runtime import ORT_ERRORS
        from ..verify import GUESS_DIM, GUESS_FALLBACKS, plan_inputs

        c = self.config
        given = _INPUT_SHAPES.get()
        for g in (GUESS_DIM,) + tuple(GUESS_FALLBACKS):
            guessed = []  # the verification's own guess (its inputs named here); batch 1
            try:
                shapes = {**given, **{p.name: p.shape for p in plan_inputs(model, 1, given, guessed, g)}}
            except RedppError:  # an input the verification cannot draw either
                return None, None
            if not guessed:  # no dynamic dim to guess: the synthetic inputs fail for another reason
                return None, None
            try:
                with input_shapes(shapes):
                    out, res = rd.rd_hash(model, budget, target_bits=c.target_bits, proxy="synthetic",
                                          progress=self.progress, workers=c.workers, **settings)
            except (rd.SyntheticInputsUnavailable, *ORT_ERRORS):
                continue
            notes.append(f"sensitivity measured with the dynamic dims of {', '.join(guessed)} set to {g} (the first "
                         f"of {GUESS_DIM}, {', '.join(map(str, GUESS_FALLBACKS))} at which the model runs); "
                         "--input-shape NAME=D0,D1,... measures it at the real sizes")
            return out, res
        return None, None

    def _run_rd(self, model: onnx.ModelProto) -> HashPassResult:
        """Rate-distortion hashing (``hashing/rd.py``) of every eligible layer. The sensitivity
        proxy is ``"synthetic"``; a model it cannot feed (an input without a static shape, or not
        float) or run falls back to ``"bn"`` (then ``"params"``), said in ``result.rd["notes"]``."""
        from ..hashing import rd
        from ..runtime import ORT_ERRORS

        from ..config import default_budget

        c = self.config
        settings = dict(rd.EFFORTS[c.effort])
        notes = []
        budget = c.budget
        if budget is None and c.target_bits is None:
            budget, why = default_budget(model)
            notes.append(why)
        out = res = None
        for proxy in rd.PROXIES:
            try:
                out, res = rd.rd_hash(model, budget, target_bits=c.target_bits, proxy=proxy,
                                      progress=self.progress, workers=c.workers, **settings)
                break
            except rd.SyntheticInputsUnavailable as err:
                if proxy == "synthetic":  # dynamic dims: measured at the verification's guesses instead
                    out, res = self._rd_at_guessed_sizes(model, budget, settings, notes)
                    if res is not None:
                        break
                notes.append(f"sensitivity: the synthetic-input measurement cannot feed this model ({err}); "
                             "BatchNorm/moment estimate used instead")
            except ORT_ERRORS as err:
                notes.append(f"sensitivity: onnxruntime could not run the perturbed model "
                             f"({str(err).splitlines()[0][:200]}); next proxy used")
        if res is None:
            raise RuntimeError("rate-distortion hashing found no sensitivity it could compute")
        if self.progress:
            self.progress(len(res.layers), len(res.layers), "")
        result = rd_pass_result(model, out, res)
        result.rd["effort"] = c.effort
        result.rd["notes"] = notes
        return result


def rd_pass_result(model: onnx.ModelProto, out: onnx.ModelProto, res) -> HashPassResult:
    """The :class:`HashPassResult` of ``(out, res) = rd.rd_hash(model, ...)``: a report row per
    layer, and for the storage the lattice unit of every output channel's codebook (one float
    when the layer has one grid), its output-channel axis and the channel -> codebook map."""
    scan = scan_layers(model, tables=True)
    macs = {l.node: l.macs for l in scan.layers}
    rows, units, axes, groups = [], {}, {}, {}
    for info in res.layers:
        changed = info.granularity != "unchanged"
        d = info.to_dict()
        row = LayerHash(info.name, info.op_type, info.weight, tuple(info.shape), info.params,
                        macs.get(info.name), "rd" if changed else "unchanged", info.distinct_before,
                        info.values_kept, float(info.rel_error), granularity=info.granularity,
                        codebooks=info.codebooks, bits_per_weight=round(d["bits_per_weight"]["entropy"], 4),
                        sensitivity=info.sensitivity, sensitivity_proxy=info.sensitivity_proxy,
                        weighted_rel_error=info.weighted_rel_error, predicted_error=info.predicted_error,
                        correction=info.bias or None)
        factors = [f for f in info.factors if f > 0]
        if factors:
            row.factor = float(np.median(factors))
        if not changed:
            row.reasons.append("left as it is: every codebook cost more than the error it would save")
        else:
            cu = info.channel_units()
            if cu is not None and np.all(np.isfinite(cu)) and np.all(cu == cu[0]):
                units[info.weight] = float(cu[0])
            else:
                units[info.weight] = cu
            axes[info.weight] = info.axis
            cg = info.channel_groups()
            if cg is not None:
                groups[info.weight] = cg
        rows.append(row)
    summary = {k: v for k, v in res.to_dict().items() if k != "layers"}
    return HashPassResult(out, rows, list(scan.refused), lattice_units=units, lattice_axes=axes,
                          lattice_groups=groups, rd=summary)


def _lattice_unit(res) -> Optional[float]:
    """``h/2`` of the grid the KDE modes sit on (``codebook.py`` stores them as integers)."""
    bandwidth = getattr(res, "bandwidth", None)
    return grid_step(bandwidth) / 2 if bandwidth else None


STORAGE_FORMS = ("standard", "compact")
"""How ``store_codebooks`` writes the codes: decoders of standard ONNX ops any onnxruntime folds
(plus a map for redpp-onnx's fast load), or entropy codes only redpp-onnx decodes."""


def store_codebooks(result: HashPassResult, form: str = "standard") -> None:
    """Store each hashed weight that is still a plain constant of ``result.model`` as a codebook
    and escape-coded codes (in place, ``codebook.py``). Run it last: later passes need plain
    constant weights. The codebook is built from the tensor's current values (merging may have
    folded weights); a tensor the storage would not shrink stays plain, with the reason.

    ``result.lattice_units[w]``: one float, None, or one unit per slice along
    ``result.lattice_axes.get(w, 0)``; ``result.lattice_groups.get(w)``: the channel groups the
    weight was hashed with (one id per slice along that axis), tried as one more grouped form
    (ignored when its length is not the tensor's channel count).

    ``form``: ``"standard"`` (decoders of standard ops plus the map, ``codebook.py``) or
    ``"compact"`` (rANS codes decoded by redpp-onnx, ``redpp_onnx/compact.py``)."""
    if form not in STORAGE_FORMS:
        raise ValueError(f"storage form {form!r}: one of {', '.join(STORAGE_FORMS)}")
    model = result.model
    rows = {row.weight: row for row in result.layers}
    consts = ConstantTensors(model)
    todo = [w for w in result.lattice_units if w in consts]
    if todo and form == "standard" and opset_version(model) < MIN_OPSET:
        for w in todo:
            rows[w].reasons.append(f"codebook storage needs opset >= {MIN_OPSET}; weights stored plainly")
        return
    tensors = []
    half = {}  # float16 / bfloat16 weights: stored name (decoded in float32) -> (weight, its type)
    taken = {t.name for t in model.graph.initializer} | {o for n in model.graph.node for o in n.output}
    for w in todo:
        dtype = consts.proto(w).data_type
        values = consts.floats(w)
        name = w
        if dtype != onnx.TensorProto.FLOAT:  # decoded in float32, then one Cast to its type (exact:
            name = f"{w}__float32"            # the hashed values are that type's numbers)
            while name in taken:
                name += "_"
            taken.add(name)
            half[name] = (w, dtype)
        axis = result.lattice_axes.get(w, 0)
        groups = result.lattice_groups.get(w)
        if groups is not None and (values.ndim < 2 or np.size(groups) != values.shape[axis % values.ndim]):
            groups = None  # not this tensor's channels (a later pass reshaped it)
        t = tensor_codes(name, values, result.lattice_units[w], unit_axis=axis, channel_groups=groups,
                         coder="rans" if form == "compact" else "prefix")
        why = refusal(t, plain_bytes=np_dtype(dtype).itemsize)
        if why is None:
            tensors.append(t)
        else:
            rows[w].reasons.append(f"codebook storage: {why}; stored plainly")
    if not tensors:
        return
    backup = onnx.GraphProto()
    backup.CopyFrom(model.graph)
    size_before = model.ByteSize()
    opsets = [onnx.OperatorSetIdProto(domain=o.domain, version=o.version) for o in model.opset_import]
    for t in tensors:
        if t.name in half:
            w, dtype = half[t.name]
            _remove_constant(model, w)
            model.graph.node.insert(0, onnx.helper.make_node("Cast", [t.name], [w], to=dtype,
                                                             name=f"{w}__cast"))
        else:
            _remove_constant(model, t.name)
    if form == "compact":
        from .. import compact

        stored = {name: (bits, None) for name, bits in compact.write(model, tensors).items()}
    else:
        stored = write_codebooks(model, tensors, opset_version(model))  # + the map of metadata_props (storage.py)
    grown = model.ByteSize() - size_before
    if grown >= 0:  # tiny tensors: the decoder costs more than the codes save
        model.graph.CopyFrom(backup)
        set_metadata(model, None)
        if form == "compact":
            from .. import compact

            compact.set_metadata(model, None)
            del model.opset_import[:]
            model.opset_import.extend(opsets)
        for t in tensors:
            rows[half.get(t.name, (t.name,))[0]].reasons.append(
                f"codebook storage would make the file {grown} bytes larger (the decoder costs more than the "
                "codes save); stored plainly")
        return
    for t in tensors:
        row = rows[half.get(t.name, (t.name,))[0]]
        row.code_bits = round(stored[t.name][0], 3)
        row.codebook_type = "int16" if t.lattice is not None else "float32"
        if t.name in half:
            row.reasons.append(f"decoded in float32 as {t.name}, then cast to "
                               f"{onnx.TensorProto.DataType.Name(half[t.name][1])}")
    result.codebook_layers = len(tensors)


def _remove_constant(model: onnx.ModelProto, name: str) -> None:
    """Remove the constant ``name`` (an initializer or a Constant node's output)."""
    graph = model.graph
    for i, t in enumerate(graph.initializer):
        if t.name == name:
            del graph.initializer[i]
            break
    else:  # a Constant node's output
        for i, node in enumerate(graph.node):
            if node.op_type == "Constant" and list(node.output) == [name]:
                del graph.node[i]
                break
    for i, vi in enumerate(graph.input):  # old models list initializers as inputs
        if vi.name == name:
            del graph.input[i]
            break


def refusal_dict(r: Refusal) -> dict:
    return {"name": r.node, "op_type": r.op_type, "reasons": [r.reason]}
