"""The command line: a working run, its JSON report, and user mistakes (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import redpp_onnx
from redpp_onnx.cli import main

from .graphs import conv_bn_relu_gemm

ROOT_MODELS = Path(__file__).resolve().parents[1] / "models"

REPORT_KEYS = {"params_before", "params_after", "pruning_ratio", "distinct_values_before",
               "distinct_values_after", "macs_before", "macs_after", "file_bytes_before", "file_bytes_after"}
LAYER_KEYS = {"name", "op_type", "shape", "distinct_before", "distinct_after", "bandwidth", "modes", "u_l", "reasons"}


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "in.onnx"
    onnx.save(conv_bn_relu_gemm(), str(path))
    return path


def test_compress_writes_model_and_json_report(model_path, tmp_path, capsys):
    out, rep = tmp_path / "out.onnx", tmp_path / "r.json"
    before = model_path.read_bytes()
    assert main(["compress", str(model_path), "-o", str(out), "--report", str(rep)]) == 0
    assert model_path.read_bytes() == before  # the input is never modified
    report = json.loads(rep.read_text())
    assert REPORT_KEYS <= report["model"].keys()
    eligible = [l for l in report["layers"] if l["eligible"]]
    assert len(eligible) == 2 and all(LAYER_KEYS <= l.keys() for l in eligible)
    assert report["model"]["distinct_values_after"] < report["model"]["distinct_values_before"]
    assert report["model"]["file_bytes_after"] == out.stat().st_size
    assert report["verify"]["max_rel_l2"] < 0.1 and "total" in report["timings"]
    table = capsys.readouterr().out
    assert "distinct weight values" in table and "verify: max |diff|" in table
    m = onnx.load(str(out))
    assert m.ir_version <= 13
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert redpp_onnx.session(str(out)).run(None, {"x": x})[0].shape == (2, 10)


def test_written_files_get_the_usual_permissions(model_path, tmp_path):
    """Atomic writes go through a temporary file (mode 0600): the result must not keep that."""
    out, rep, plain = tmp_path / "out.onnx", tmp_path / "r.json", tmp_path / "plain"
    assert main(["compress", str(model_path), "-o", str(out), "--report", str(rep), "-q", "--no-verify"]) == 0
    plain.write_text("")
    assert out.stat().st_mode & 0o777 == rep.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_json_flag_prints_the_report(model_path, tmp_path, capsys):
    assert main(["compress", str(model_path), "-o", str(tmp_path / "o.onnx"), "--json", "--no-verify"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verify"] == {"skipped": "disabled (--no-verify)"}


def _fails(args, capsys, fragment):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("redpp-onnx: error:") and "\n" not in err and "Traceback" not in err
    assert fragment in err, err


def test_missing_input(tmp_path, capsys):
    _fails(["compress", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "o.onnx")], capsys, "no such file")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("content", [b"not an onnx file at all \x00\xff" * 10, b""])
def test_not_onnx(tmp_path, capsys, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    _fails(["compress", str(bad), "-o", str(tmp_path / "o.onnx")], capsys, "bad.onnx")
    assert not (tmp_path / "o.onnx").exists()


def test_truncated_model(model_path, tmp_path, capsys):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(model_path.read_bytes()[: model_path.stat().st_size // 2])
    _fails(["compress", str(cut), "-o", str(tmp_path / "o.onnx")], capsys, "cut.onnx")
    assert not (tmp_path / "o.onnx").exists()


def test_output_folder_missing(model_path, tmp_path, capsys):
    _fails(["compress", str(model_path), "-o", str(tmp_path / "no" / "o.onnx")], capsys, "does not exist")


def test_output_is_input(model_path, capsys):
    before = model_path.read_bytes()
    _fails(["compress", str(model_path), "-o", str(model_path), "--force"], capsys, "same file as the input model")
    assert model_path.read_bytes() == before


def test_existing_output_needs_force(model_path, tmp_path, capsys):
    out = tmp_path / "o.onnx"
    out.write_bytes(b"keep me")
    _fails(["compress", str(model_path), "-o", str(out)], capsys, "--force")
    assert out.read_bytes() == b"keep me"
    assert main(["compress", str(model_path), "-o", str(out), "--force", "-q"]) == 0
    assert out.read_bytes() != b"keep me"


@pytest.mark.parametrize("args,fragment", [
    (["--weight-error", "-1"], "--weight-error"),
    (["--bandwidth-factor", "0"], "--bandwidth-factor"),
    (["--steps", "hash,prune"], "unknown step"),
])
def test_bad_options(model_path, tmp_path, capsys, args, fragment):
    _fails(["compress", str(model_path), "-o", str(tmp_path / "o.onnx")] + args, capsys, fragment)
    assert not (tmp_path / "o.onnx").exists()


def test_opset_onnxruntime_cannot_load_is_a_clear_error(tmp_path, capsys):
    model = conv_bn_relu_gemm()
    model.opset_import[0].version = 40
    path = tmp_path / "future.onnx"
    onnx.save(model, str(path))
    _fails(["compress", str(path), "-o", str(tmp_path / "o.onnx")], capsys, "onnxruntime cannot load the input model")
    err = capsys.readouterr().err
    assert "onnxruntime_src" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_control_flow_is_left_untouched_and_said(tmp_path, capsys):
    from onnx import TensorProto, helper

    from .graphs import GraphBuilder

    g = GraphBuilder(1)
    h = g.conv("x", 3, 16)
    branch = {k: helper.make_graph([helper.make_node(op, [h], [k])], k, [],
                                   [helper.make_tensor_value_info(k, TensorProto.FLOAT, None)])
              for k, op in (("then", "Relu"), ("else", "Sigmoid"))}
    y = g.node("If", [g.const(np.array(True), "c")], then_branch=branch["then"], else_branch=branch["else"])
    path = tmp_path / "cf.onnx"
    onnx.save(g.model(["N", 3, 8, 8], y, check=False), str(path))
    assert main(["compress", str(path), "-o", str(tmp_path / "o.onnx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any("control-flow node(s) (If)" in n for n in report["notes"])
    out = onnx.load(str(tmp_path / "o.onnx"))
    if_node = [n for n in out.graph.node if n.op_type == "If"][0]
    assert [n.op_type for n in if_node.attribute[0].g.node] in (["Relu"], ["Sigmoid"])


def test_ir14_input_is_written_with_an_ir_onnxruntime_loads(tmp_path):
    model = conv_bn_relu_gemm()
    model.ir_version = 14  # what onnx 1.23 writes by default; onnxruntime 1.31 loads at most 13
    path = tmp_path / "ir14.onnx"
    onnx.save(model, str(path))
    assert main(["compress", str(path), "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    out = onnx.load(str(tmp_path / "o.onnx"))
    assert out.ir_version <= 13
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert redpp_onnx.session(str(tmp_path / "o.onnx")).run(None, {"x": x})[0].shape == (1, 10)


def test_external_data_input_is_read(tmp_path):
    path = tmp_path / "ext.onnx"
    onnx.save(conv_bn_relu_gemm(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    data_before = (tmp_path / "ext.data").read_bytes()
    assert main(["compress", str(path), "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "r.json"),
                 "-q"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["model"]["changed_layers"] == 2  # the weights really were read
    assert (tmp_path / "ext.data").read_bytes() == data_before  # the input is not modified
    # written the same way: tensors in o.onnx.data beside o.onnx, and it runs
    out = onnx.load(str(tmp_path / "o.onnx"), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in out.graph.initializer)
    assert (tmp_path / "o.onnx.data").stat().st_size > 0
    assert report["model"]["file_bytes_after"] == (tmp_path / "o.onnx").stat().st_size + (
        tmp_path / "o.onnx.data").stat().st_size
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert redpp_onnx.session(str(tmp_path / "o.onnx")).run(None, {"x": x})[0].shape == (1, 10)


def test_float16_weights_are_hashed_in_their_own_type(tmp_path, capsys):
    from onnx import TensorProto
    from onnx import numpy_helper as nh

    from .graphs import GraphBuilder

    g = GraphBuilder(2)
    g.inits.append(nh.from_array(g.weights(8, 3, 3, 3).astype(np.float16), "W16"))
    y16 = g.node("Conv", [g.node("Cast", ["x"], to=TensorProto.FLOAT16), "W16"], pads=[1, 1, 1, 1])
    path = tmp_path / "fp16.onnx"
    onnx.save(g.model(["N", 3, 8, 8], g.node("Cast", [y16], to=TensorProto.FLOAT), check=False), str(path))
    assert main(["compress", str(path), "-o", str(tmp_path / "o.onnx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [l["eligible"] for l in report["layers"]] == [True]
    out = onnx.load(str(tmp_path / "o.onnx"))
    w = [t for t in out.graph.initializer if t.name == "W16"][0]
    assert w.data_type == TensorProto.FLOAT16
    assert report["layers"][0]["distinct_after"] == np.unique(nh.to_array(w).astype(np.float32)).size
    assert report["layers"][0]["distinct_after"] < report["layers"][0]["distinct_before"]


def test_float64_weights_are_refused_with_a_reason():
    from onnx import TensorProto
    from onnx import numpy_helper as nh

    from redpp_onnx.analysis.layers import scan_layers

    from .graphs import GraphBuilder

    g = GraphBuilder(2)
    g.inits.append(nh.from_array(g.weights(8, 3, 3, 3).astype(np.float64), "W64"))
    y = g.node("Conv", [g.node("Cast", ["x"], to=TensorProto.DOUBLE), "W64"], pads=[1, 1, 1, 1])
    scan = scan_layers(g.model(["N", 3, 8, 8], g.node("Cast", [y], to=TensorProto.FLOAT), check=False))
    assert not scan.layers and len(scan.refused) == 1 and "DOUBLE" in scan.refused[0].reason


def test_bench_reports_a_ratio_with_its_spread(model_path, tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["compress", str(model_path), "-o", str(out), "-q", "--no-verify"]) == 0
    assert main(["bench", str(model_path), str(out), "--repeat", "8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["runs"] >= 8 and result["a"]["p10_ms"] <= result["a"]["p50_ms"] <= result["a"]["p90_ms"]
    lo, hi = result["ratio_iqr"]
    assert 0 < lo <= hi and 0.2 < result["ratio"] < 5
    assert main(["bench", str(model_path), "--repeat", "5"]) == 0
    assert "median" in capsys.readouterr().out
    _fails(["bench", str(tmp_path / "missing.onnx")], capsys, "no such file")


def test_plot_writes_the_two_figures(tmp_path):
    pytest.importorskip("matplotlib")  # in the test extra: runs in CI
    model = ROOT_MODELS / "digits_cnn.onnx"
    folder = tmp_path / "figs"
    assert main(["compress", str(model), "-o", str(tmp_path / "o.onnx"), "--plot", str(folder), "-q",
                 "--no-verify"]) == 0
    for name in ("pruning_by_layer.png", "expected_pruning.png"):
        data = (folder / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes "import matplotlib" fail
    _fails(["compress", str(ROOT_MODELS / "digits_cnn.onnx"), "-o", str(tmp_path / "o.onnx"), "--plot",
            str(tmp_path / "f")], capsys, "pip install 'redpp-onnx[plot]'")
    assert not (tmp_path / "o.onnx").exists()


def test_eval_with_raw_uint8_images_and_explicit_preprocessing(tmp_path, capsys):
    """The held-out digits stored as uint8 NHWC images: x/16 == (x/255 - 0) / (16/255)."""
    data = np.load(ROOT_MODELS / "digits_test.npz")
    images = np.clip(np.round(data["x"][:, 0] * 16), 0, 255).astype(np.uint8)[..., None]
    np.savez(tmp_path / "u8.npz", images=images, labels=data["y"])
    args = ["eval", str(ROOT_MODELS / "digits_cnn.onnx"), "--data", str(tmp_path / "u8.npz"), "--preprocess", "raw",
            "--mean", "0", "--std", str(16 / 255), "--layout", "NHWC", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["top1_correct"] == 358  # as on the float data (models/README.md)
    _fails(args[:6] + ["--json"], capsys, "")  # raw uint8 without mean/std: a one-line error
