"""Embedding tables (issue 13, part): a Gather of a 2-D float constant by computed indices is
hashed and stored like a weight (``scan_layers(tables=True)``); tied tables are refused with
the reason; onnxruntime reads the same table from every storage form; a BERT-style encoder
(tests/zoo/bertlike_ts.onnx, seeded weights) compresses with its sentence embeddings kept."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import redpp_onnx
from redpp_onnx.analysis.layers import scan_layers
from redpp_onnx.cli import main

ZOO = Path(__file__).resolve().parent / "zoo"
BERT = ZOO / "bertlike_ts.onnx"


def _ids(n=32, seed=0):
    return np.random.default_rng(seed).integers(0, 1000, (n, 16)).astype(np.int64)


def _run(path, ids, fast=False):
    if fast:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the decoding fast path, no fallback
            s = redpp_onnx.session(str(path))
    else:
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: ids})[0].astype(np.float64)


def _cosines(a, b):
    return np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_tables_are_found_only_when_asked():
    m = onnx.load(str(BERT))
    plain, with_tables = scan_layers(m), scan_layers(m, tables=True)
    tables = [l for l in with_tables.layers if l.op_type == "Gather"]
    assert len(tables) == 1 and tables[0].weight_shape == (1000, 64) and tables[0].macs == 0
    assert len(with_tables.layers) == len(plain.layers) + 1
    assert not any(l.op_type == "Gather" for l in plain.layers)


def _tied_model():
    """Token ids -> Gather(E) -> mean -> Gemm(E, transB): the table is also the output layer."""
    rng = np.random.default_rng(0)
    e = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "E")
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["p"], axes=[1], keepdims=0),
             helper.make_node("Gemm", ["p", "E"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 50])], [e])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_tied_tables_are_refused_with_the_reason():
    scan = scan_layers(_tied_model(), tables=True)
    assert not scan.layers
    reasons = {r.op_type: r.reason for r in scan.refused}
    assert "tied embeddings" in reasons["Gather"] and "shared" in reasons["Gemm"]


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    out = {}
    for form, extra in (("plain", ["--plain"]), ("standard", []), ("compact", ["--storage", "compact"])):
        path, rep = d / f"{form}.onnx", d / f"{form}.json"
        assert main(["compress", str(BERT), "-o", str(path), "--report", str(rep), "-q", *extra]) == 0
        out[form] = (path, json.loads(rep.read_text()))
    return out


def test_the_table_is_hashed_and_every_form_reads_the_same_values(forms):
    path, report = forms["plain"]
    row = [r for r in report["layers"] if r["op_type"] == "Gather"][0]
    table = [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer if t.name == row["weight"]][0]
    assert row["method"] == "rd" and row["distinct_after"] == np.unique(table).size < row["distinct_before"] // 100
    assert row["sensitivity_proxy"] == "synthetic"
    ids = _ids()
    want = _run(path, ids)
    assert np.array_equal(_run(forms["standard"][0], ids), want)  # plain onnxruntime folds the decoders
    for form in ("standard", "compact"):
        assert np.array_equal(_run(forms[form][0], ids, fast=True), want), form
        stored = [r for r in forms[form][1]["layers"] if r["op_type"] == "Gather"][0]
        assert stored.get("code_bits") is not None, form  # stored as codes, not plainly


def test_default_output_is_smaller_and_keeps_the_embeddings(forms):
    ids = _ids(64, seed=1)
    ref = _run(BERT, ids)
    for form in ("standard", "compact"):
        path, report = forms[form]
        assert BERT.stat().st_size / path.stat().st_size >= 3.5, form
        cos = _cosines(ref, _run(path, ids, fast=True))
        assert cos.min() > 0.98, form  # the default budget (0.1 relative L2)


def test_a_tighter_budget_keeps_cosine_0999(tmp_path):
    """--budget 0.03 (relative L2 of the output; cosine is about 1 - L2^2/2): cosine >= 0.999 on
    held-out token ids, the compact file still at least 3.5x smaller than the float32 input."""
    out = tmp_path / "c.onnx"
    assert main(["compress", str(BERT), "-o", str(out), "--budget", "0.03", "--storage", "compact", "-q"]) == 0
    ids = _ids(256, seed=2)
    cos = _cosines(_run(BERT, ids), _run(out, ids, fast=True))
    assert cos.min() >= 0.999
    assert BERT.stat().st_size / out.stat().st_size >= 3.5


def test_a_static_batch_export_is_measured_in_its_batch():
    """The dynamo export fixes the batch at 2: the synthetic measurement runs in batches of 2
    instead of falling back to the BatchNorm estimate (which lost the embeddings there)."""
    from redpp_onnx.compress import compress
    from redpp_onnx.config import CompressConfig

    m = onnx.load(str(ZOO / "bertlike_dynamo.onnx"))
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2
    _, r = compress(m, CompressConfig(steps=("hash",), verify=False))
    assert r.model["rd"]["proxy"] == "synthetic"
    assert not any(n.startswith("sensitivity") for n in r.model["rd"].get("notes", []))  # no fallback
