"""Float16 / bfloat16 weights cast to float32 for the compute (``analysis/fold.py``): folded into the
float32 weights the passes read, written back in their own type when they stay plain, and the
whole ``compress`` on such a model (codebooks smaller than the half-precision file)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from redpp_onnx import io
from redpp_onnx.analysis.fold import fold_constant_casts, restore_constant_casts
from redpp_onnx.cli import main

from .graphs import IR_VERSION, OPSET


def _half(arr: np.ndarray, name: str, dtype: int) -> onnx.TensorProto:
    if dtype == TensorProto.FLOAT16:
        return numpy_helper.from_array(arr.astype(np.float16), name)
    bits = (arr.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncation: any bf16 value
    return helper.make_tensor(name, TensorProto.BFLOAT16, arr.shape, bits.tobytes(), raw=True)


def _mlp(dtype=TensorProto.FLOAT16, width=64, extra_reader=False):
    """x [N, 32] -> MatMul(Cast(W1 half)) -> Relu -> MatMul(Cast(W2 half)) -> y [N, 10]."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, width)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((width, 10)).astype(np.float32) * 0.2
    inits = [_half(w1, "W1h", dtype), _half(w2, "W2h", dtype)]
    nodes = [helper.make_node("Cast", ["W1h"], ["W1"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["W2h"], ["W2"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])]
    if extra_reader:  # the half tensor is also read as it is: it must stay
        nodes.append(helper.make_node("Identity", ["W2h"], ["w2_copy"]))
        outputs.append(helper.make_tensor_value_info("w2_copy", dtype, [width, 10]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["y"], {"x": x})[0]


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_fold_then_restore_is_the_same_function_bit_for_bit(dtype):
    model = _mlp(dtype)
    folded_model, folded = fold_constant_casts(model)
    assert set(folded) == {"W1", "W2"} and all(v == dtype for v in folded.values())
    assert not any(n.op_type == "Cast" for n in folded_model.graph.node)
    assert {t.name for t in folded_model.graph.initializer} == {"W1", "W2"}
    assert all(t.data_type == TensorProto.FLOAT for t in folded_model.graph.initializer)
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(_run(model, x), _run(folded_model, x))  # widening is exact
    back, n = restore_constant_casts(folded_model, folded)
    assert n == 2 and sum(n.op_type == "Cast" for n in back.graph.node) == 2
    assert all(t.data_type == dtype for t in back.graph.initializer)
    np.testing.assert_array_equal(_run(model, x), _run(back, x))
    assert len(back.SerializeToString()) <= len(model.SerializeToString()) + 64


def test_a_half_tensor_read_elsewhere_stays_and_graph_outputs_are_kept():
    model = _mlp(extra_reader=True)
    out, folded = fold_constant_casts(model)
    assert set(folded) == {"W1", "W2"}
    names = {t.name for t in out.graph.initializer}
    assert "W2h" in names and "W1h" not in names  # W2h is still read by the Identity
    plain = _mlp()
    del plain.graph.node[:2]
    plain.graph.node[0].input[1] = "W1h"
    assert fold_constant_casts(plain)[1] == {}  # no Cast: nothing to fold, the model itself back


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_compress_reads_cast_half_weights_and_stores_them_smaller(dtype, tmp_path):
    src = tmp_path / "m.onnx"
    io.save_model(_mlp(dtype, width=256), src)
    out, plain = tmp_path / "o.onnx", tmp_path / "p.onnx"
    assert main(["compress", str(src), "-o", str(out), "-q"]) == 0
    assert main(["compress", str(src), "-o", str(plain), "-q", "--plain"]) == 0
    x = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
    ref = _run(onnx.load(str(src)), x)
    for path in (out, plain):
        m = onnx.load(str(path))
        y = _run(m, x)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.2
    codebook = onnx.load(str(out))
    assert not any(n.op_type == "Cast" and n.output[0] in ("W1", "W2") for n in codebook.graph.node)
    assert out.stat().st_size < 0.75 * src.stat().st_size  # codes, not 16-bit values
    kept = {t.name: t.data_type for t in onnx.load(str(plain)).graph.initializer}
    assert kept == {"W1__half": dtype, "W2__half": dtype}  # --plain: back in their own type
    assert plain.stat().st_size <= src.stat().st_size + 256
