"""redpp_onnx.verify: realistic synthetic inputs (token ids, masks), what was fed said in the report,
a drift figure that does not depend on the seed, and verification on the user's inputs (--verify-data)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from redpp_onnx import verify
from redpp_onnx.cli import main
from redpp_onnx.compress import _verify_warning, compress
from redpp_onnx.config import CompressConfig

from .graphs import IR_VERSION, OPSET, conv_bn_relu_gemm

VOCAB, DIM, SEQ = 50, 16, 6


def bert_like(seed: int = 0, *, where: bool = False, perturb: float = 0.0, seq=SEQ) -> onnx.ModelProto:
    """A tiny sentence-embedding transformer: input_ids -> Cast -> Gather(word embedding) + Gather(type
    embedding, token_type_ids) -> MatMul -> Tanh, masked by attention_mask (Mul, or Where), ReduceMean
    over the tokens. An all-zero mask gives the zero vector whatever the ids."""
    rng = np.random.default_rng(seed)
    word = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
    types = rng.standard_normal((2, DIM)).astype(np.float32)
    w = (rng.standard_normal((DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)
    w = w + perturb * np.random.default_rng(seed + 1).standard_normal(w.shape).astype(np.float32)
    inits = [nh.from_array(word, "word_embeddings"), nh.from_array(types, "token_type_embeddings"),
             nh.from_array(w, "W"), nh.from_array(np.array([2], np.int64), "axis2"),
             nh.from_array(np.zeros((), np.float32), "zero")]
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Gather", ["word_embeddings", "ids32"], ["e_word"]),
             helper.make_node("Gather", ["token_type_embeddings", "token_type_ids"], ["e_type"]),
             helper.make_node("Add", ["e_word", "e_type"], ["e"]),
             helper.make_node("MatMul", ["e", "W"], ["h0"]),
             helper.make_node("Tanh", ["h0"], ["h"])]
    if where:
        nodes += [helper.make_node("Cast", ["attention_mask"], ["mb"], to=TensorProto.BOOL),
                  helper.make_node("Unsqueeze", ["mb", "axis2"], ["m3"]),
                  helper.make_node("Where", ["m3", "h", "zero"], ["hm"])]
    else:
        nodes += [helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
                  helper.make_node("Unsqueeze", ["mf", "axis2"], ["m3"]),
                  helper.make_node("Mul", ["h", "m3"], ["hm"])]
    nodes.append(helper.make_node("ReduceMean", ["hm"], ["sentence_embedding"], axes=[1], keepdims=0))
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", seq])
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    graph = helper.make_graph(nodes, "bert_like", inputs,
                              [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["N", DIM])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _sentences(n=12, seed=3, seq=SEQ):
    rng = np.random.default_rng(seed)
    mask = np.ones((n, seq), np.int64)
    for i in range(n):
        mask[i, rng.integers(2, seq + 1):] = 0  # padding at the end
    ids = np.where(mask == 1, rng.integers(1, VOCAB, (n, seq)), 0).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((n, seq), np.int64)}


# --------------------------------------------------------------------------- synthetic inputs

@pytest.mark.parametrize("where", [False, True])
def test_token_ids_cover_the_vocabulary_and_masks_are_ones(where):
    feeds = verify.random_inputs(bert_like(where=where), batch=4, seed=0)
    ids, mask, types = feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"]
    assert ids.dtype == mask.dtype == types.dtype == np.int64 and ids.shape == (4, SEQ)
    assert 0 <= ids.min() and ids.max() < VOCAB and len(np.unique(ids)) > 8  # uniform in [0, vocabulary)
    assert (mask == 1).all() and (types == 0).all()


@pytest.mark.parametrize("where", [False, True])
def test_verification_sees_the_drift_and_reports_what_it_fed(where):
    model, changed = bert_like(where=where), bert_like(where=where, perturb=0.05)
    result = verify.compare(model, changed, seed=0)
    d = json.loads(json.dumps(result.to_dict()))
    assert d["max_abs_diff"] > 0 and 0.01 < d["max_rel_l2"] < 1  # zeros for the mask gave exactly 0
    assert d["data"] == "synthetic"
    ids = d["inputs"]["input_ids"]
    assert ids["dtype"] == "int64" and ids["distribution"] == "uniform integers" and ids["range"] == [0, VOCAB - 1]
    assert "word_embeddings" in ids["why"]  # the vocabulary comes from the embedding table
    assert d["inputs"]["attention_mask"]["distribution"] == "constant" and d["inputs"]["attention_mask"]["value"] == 1
    assert d["inputs"]["token_type_ids"]["value"] == 0
    assert d["samples"] >= 32 and d["samples"] == d["runs"] * d["batch"] and d["stopped"]
    out = d["outputs"][0]
    assert out["name"] == "sentence_embedding" and 0.5 < out["cosine_min"] <= out["cosine_mean"] < 1


def _through(op_chain) -> onnx.ModelProto:
    """ids [N, 4] (int32) -> op_chain -> Gather(table 37 x 3) -> ReduceSum; plus a bool, a uint8 and an
    unexplained int64 input used harmlessly."""
    table = np.arange(37 * 3, dtype=np.float32).reshape(37, 3)
    inits = [nh.from_array(table, "table"), nh.from_array(np.array([1], np.int64), "one_axis"),
             nh.from_array(np.array([-1, 4], np.int64), "shape")]
    nodes, cur = [], "ids"
    for k, op in enumerate(op_chain):
        extra = {"Unsqueeze": ["one_axis"], "Squeeze": ["one_axis"], "Reshape": ["shape"]}.get(op, [])
        attrs = {"to": TensorProto.INT64} if op == "Cast" else {}
        nodes.append(helper.make_node(op, [cur] + extra, [f"t{k}"], **attrs))
        cur = f"t{k}"
    nodes += [helper.make_node("Gather", ["table", cur], ["g"]),
              helper.make_node("ReduceSum", ["g", "one_axis"], ["s"], keepdims=0),
              helper.make_node("Cast", ["flag"], ["flag_f"], to=TensorProto.FLOAT),
              helper.make_node("Cast", ["pixels"], ["pix_f"], to=TensorProto.FLOAT),
              helper.make_node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
              helper.make_node("Mul", ["s", "flag_f"], ["y0"]),
              helper.make_node("Add", ["y0", "pix_f"], ["y1"]),
              helper.make_node("Add", ["y1", "count_f"], ["y"])]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT32, ["N", 4]),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, ["N", 1]),
              helper.make_tensor_value_info("pixels", TensorProto.UINT8, ["N", 1]),
              helper.make_tensor_value_info("count", TensorProto.INT64, ["N", 1])]
    graph = helper.make_graph(nodes, "through", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("chain", [[], ["Cast"], ["Unsqueeze", "Squeeze"], ["Cast", "Reshape"]])
def test_vocabulary_found_through_simple_ops_and_other_types(chain):
    model = _through(chain)
    feeds = verify.random_inputs(model, batch=64, seed=1)
    assert feeds["ids"].dtype == np.int32 and feeds["ids"].max() < 37 and feeds["ids"].max() > 20
    assert feeds["flag"].dtype == np.bool_ and feeds["flag"].all()
    assert feeds["pixels"].dtype == np.uint8 and feeds["pixels"].max() > 128  # the full uint8 range
    assert feeds["count"].min() >= 0 and feeds["count"].max() <= 1  # unexplained integers: {0, 1}
    d = verify.compare(model, model).to_dict()
    assert d["inputs"]["ids"]["range"] == [0, 36] and d["inputs"]["flag"]["value"] is True
    assert d["inputs"]["pixels"]["range"] == [0, 255] and d["inputs"]["count"]["range"] == [0, 1]
    assert d["max_rel_l2"] == 0


# --------------------------------------------------------------------------- a stable figure

def test_relative_l2_does_not_depend_on_the_seed():
    model = conv_bn_relu_gemm()
    hashed, _ = compress(model, CompressConfig(steps=("hash",), verify=False))
    rels = [verify.compare(model, hashed, seed=s).max_rel_l2 for s in range(6)]
    assert max(rels) / min(rels) < 1.1, rels


def test_sample_count_rule_fixed_count_and_time_budget():
    model = conv_bn_relu_gemm()
    hashed, _ = compress(model, CompressConfig(steps=("hash",), verify=False))
    fixed = verify.compare(model, hashed, samples=10).to_dict()
    assert fixed["samples"] == 10 and fixed["runs"] == 5 and "--verify-samples" in fixed["stopped"]
    quick = verify.compare(model, hashed, seconds=0).to_dict()
    assert quick["runs"] == 1 and "time budget" in quick["stopped"]
    exact = verify.compare(model, model).to_dict()  # float rounding only (fusions): the minimum count
    assert exact["max_rel_l2"] < 1e-5 and exact["samples"] == verify.MIN_SAMPLES


# --------------------------------------------------------------------------- --verify-data

@pytest.fixture
def bert_files(tmp_path):
    src = tmp_path / "bert.onnx"
    onnx.save(bert_like(), str(src))
    data = tmp_path / "sentences.npz"
    np.savez(data, **_sentences())
    return src, data


def test_verify_data_round_trip(bert_files, tmp_path):
    src, data = bert_files
    out, rep = tmp_path / "out.onnx", tmp_path / "r.json"
    assert main(["compress", str(src), "-o", str(out), "--report", str(rep), "-q", "--steps", "hash",
                 "--weight-error", "0.05", "--verify-data", str(data)]) == 0
    v = json.loads(rep.read_text())["verify"]
    assert v["data"] == "user" and v["source"] == str(data) and v["samples"] == 12
    assert v["inputs"]["input_ids"]["distribution"] == "user data"
    assert v["inputs"]["attention_mask"]["range"] == [0, 1]
    # the figure is the pooled relative L2 over the user's samples, computed here by hand
    import onnxruntime as ort
    feeds = _sentences()
    a = ort.InferenceSession(str(src)).run(None, feeds)[0].astype(np.float64)
    b = ort.InferenceSession(str(out)).run(None, feeds)[0].astype(np.float64)
    assert v["max_rel_l2"] > 0
    assert v["max_rel_l2"] == pytest.approx(np.linalg.norm(b - a) / np.linalg.norm(a), rel=1e-5)


def test_verify_data_first_n_samples_and_a_fixed_batch_axis(bert_files, tmp_path):
    src, data = bert_files
    model, changed = onnx.load(str(src)), bert_like(perturb=0.05)
    first = verify.compare(model, changed, data=data, samples=5).to_dict()
    assert first["samples"] == 5 and "the first 5 of the 12 samples" in first["stopped"]
    assert first["inputs"]["input_ids"]["shape"] == [5, SEQ]
    fixed, fixed_changed = bert_like(), bert_like(perturb=0.05)
    for m in (fixed, fixed_changed):
        for inp in m.graph.input:
            inp.type.tensor_type.shape.dim[0].dim_value = 5
    d = verify.compare(fixed, fixed_changed, data=data).to_dict()
    assert d["samples"] == 10 and d["runs"] == 2 and d["batch"] == 5 and "2 left out" in d["stopped"]


def _bad(tmp_path, name, **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("case,fragment", [
    ("missing", "missing input(s) token_type_ids"),
    ("unknown", "unknown key(s) extra"),
    ("shape", "input_ids: shape [12, 5] does not fit the model's ['N', 6]"),
    ("dtype", "input_ids: float64 data for an int64 input"),
    ("count", "12 samples"),
    ("nan", "NaN"),
])
def test_verify_data_mismatch_is_one_line(case, fragment, bert_files, tmp_path, capsys):
    src, _ = bert_files
    s = _sentences()
    if case == "missing":
        del s["token_type_ids"]
    elif case == "unknown":
        s["extra"] = np.zeros(3)
    elif case == "shape":
        s["input_ids"] = s["input_ids"][:, :5]
    elif case == "dtype":
        s["input_ids"] = s["input_ids"].astype(np.float64)
    elif case == "count":
        s["attention_mask"] = s["attention_mask"][:7]
    if case == "nan":  # a float input: the CNN
        src = tmp_path / "cnn.onnx"
        onnx.save(conv_bn_relu_gemm(), str(src))
        x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
        x[1, 0, 2, 2] = np.nan
        s = {"x": x}
    data = _bad(tmp_path, f"{case}.npz", **s)
    out = tmp_path / "o.onnx"
    assert main(["compress", str(src), "-o", str(out), "-q", "--verify-data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("redpp-onnx: error:") and "\n" not in err and "Traceback" not in err
    assert fragment in err and str(data) in err, err
    assert not out.exists()


def test_verify_data_needs_verification(bert_files, tmp_path, capsys):
    src, data = bert_files
    assert main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "-q", "--no-verify",
                 "--verify-data", str(data)]) == 2
    assert "--verify-data" in capsys.readouterr().err


# --------------------------------------------------------------------------- the warning

def test_warning_names_commands_that_read_the_users_data():
    token_inputs = {"data": "synthetic", "max_rel_l2": 0.27, "samples": 64,
                    "inputs": {"input_ids": {"dtype": "int64", "distribution": "uniform integers"},
                               "attention_mask": {"dtype": "int64", "distribution": "constant", "value": 1}},
                    "outputs": [{"name": "emb", "rel_l2": 0.27, "cosine_mean": 0.96, "cosine_min": 0.9}]}
    (note,) = _verify_warning(token_inputs)
    assert not note.startswith("WARNING")  # synthetic token ids are not sentences: a note, not an alarm
    assert "synthetic" in note and "--verify-data" in note and "redpp-onnx eval" in note
    assert "input names" in note  # says what the eval data must look like
    images = {"data": "synthetic", "max_rel_l2": 0.4, "samples": 64,
              "inputs": {"x": {"dtype": "float32", "distribution": "standard normal"}},
              "outputs": [{"name": "logits", "rel_l2": 0.4, "cosine_mean": 0.9, "cosine_min": 0.8}]}
    (warning,) = _verify_warning(images)
    assert warning.startswith("WARNING") and "synthetic" in warning and "--verify-data" in warning
    user = dict(images, data="user", source="mine.npz")
    (warning,) = _verify_warning(user)
    assert warning.startswith("WARNING") and "mine.npz" in warning and "eval" in warning
    assert _verify_warning(dict(images, max_rel_l2=0.1)) == []
