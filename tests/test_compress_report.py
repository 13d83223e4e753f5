"""The report's model-level accounting: params and MACs after merge and split, from the output model."""

from __future__ import annotations

from redpp_onnx.analysis.layers import scan_layers
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig
from redpp_onnx.passes.split import SplitConfig

from .passes.test_merge import SPATIAL, conv_bn_act_conv


def test_merge_reduces_params_and_macs_as_the_output_model_says():
    model, info = conv_bn_act_conv()
    out, report = compress(model, CompressConfig(steps=("merge",), verify=False))
    m = report.model
    assert m["merge_channels_removed"] == info["merged"] == 3
    final = scan_layers(out)
    assert m["params_after"] == sum(l.params for l in final.layers) < m["params_before"]
    assert m["macs_after"] == sum(l.macs for l in final.layers) < m["macs_before"]
    # conv1 loses 3 of 8 output channels, conv2 3 of 8 input channels: 3/8 of both convs' MACs
    convs = [l for l in scan_layers(model).layers if l.op_type == "Conv"]
    assert m["macs_before"] - m["macs_after"] == sum(l.macs * 3 // 8 for l in convs)


def test_split_counts_products_and_additions():
    model, _ = conv_bn_act_conv()
    out, report = compress(model, CompressConfig(steps=("merge", "split"), split=SplitConfig(mode="all"),
                                                 verify=False))
    m = report.model
    split_rows = [l["split"] for l in report.layers if l.get("split", {}).get("decision") == "split"]
    assert len(split_rows) == 2
    gemm = sum(l.macs for l in scan_layers(out).layers)  # what is left as Gemm
    assert m["macs_after"] == gemm + sum(r["products"] for r in split_rows)
    assert m["split_additions"] == sum(r["additions"] for r in split_rows) > 0
    assert SPATIAL > 0


def test_nodes_by_type_before_and_after():
    model, _ = conv_bn_act_conv()
    out, report = compress(model, CompressConfig(steps=("split",), split=SplitConfig(mode="all"), verify=False))
    before, after = report.model["nodes_before"], report.model["nodes_after"]
    assert sum(before.values()) == len(model.graph.node) and sum(after.values()) == len(out.graph.node)
    assert before["Conv"] == 2 and "Conv" not in after and after["ai.redpp::SplitConv"] == 2
    assert after.get("BatchNormalization", 0) == before["BatchNormalization"] - 1  # fused into the first
