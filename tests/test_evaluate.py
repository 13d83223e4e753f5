"""redpp_onnx.evaluate: npz layouts + preprocessing, accuracy/drift metrics, real-model numbers.

The fast tests use tiny synthetic npz files and tiny Flatten/Gemm classifiers. The slow
tests reproduce the accuracies of ../shared/bench/PROVENANCE.md exactly.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from redpp_onnx.evaluate import CIFAR_MEAN, CIFAR_STD, Dataset, EvalResult, evaluate, load_dataset

IR_VERSION = 8  # onnxruntime 1.31 loads IR <= 13 (onnx 1.23 would write 14)
OPSET = 17
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "bench"


# --------------------------------------------------------------------------- helpers

def _cifar_formula(images_nhwc: np.ndarray) -> np.ndarray:
    """PROVENANCE.md: x = (uint8_NHWC_RGB / 255 - mean) / std, then NHWC -> NCHW."""
    x = (images_nhwc.astype(np.float64) / 255.0 - np.array(CIFAR_MEAN)) / np.array(CIFAR_STD)
    return x.transpose(0, 3, 1, 2).astype(np.float32)


def _jpeg_npz(path: Path, n: int = 3, size: int = 224, seed: int = 0, labels=None):
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(seed)
    blobs = []
    for i in range(n):
        # smooth gradients + noise: realistic enough for JPEG, different per image
        yy, xx = np.mgrid[0:size, 0:size]
        base = np.stack([(xx * (i + 1)) % 256, (yy * 2) % 256, (xx + yy) % 256], axis=-1)
        img = np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=95)
        blobs.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    offsets = np.concatenate([[0], np.cumsum([b.size for b in blobs])]).astype(np.int64)
    labels = np.arange(n, dtype=np.int16) * 7 if labels is None else labels
    np.savez(path, jpeg_bytes=np.concatenate(blobs), offsets=offsets, labels=labels,
             wnids=np.array([f"n{i:08d}" for i in range(n)]))
    return blobs, labels


def _decode_formula(blobs) -> np.ndarray:
    """PROVENANCE.md: Pillow -> RGB uint8 -> x = (x - 127) / 128 -> NCHW."""
    from PIL import Image
    imgs = np.stack([np.asarray(Image.open(io.BytesIO(b.tobytes())).convert("RGB")) for b in blobs])
    return ((imgs.astype(np.float64) - 127.0) / 128.0).transpose(0, 3, 1, 2).astype(np.float32)


def _gemm_model(weight: np.ndarray, bias: np.ndarray, in_shape, *, batch="N",
                reshape_to_one=False) -> onnx.ModelProto:
    """X [batch, *in_shape] -> Flatten -> Gemm(W, b) -> logits [batch, C].

    ``reshape_to_one``: Reshape X to [1, -1] instead of Flatten (declares a dynamic batch
    axis but only works with batch 1).
    """
    c = weight.shape[1]
    inits = [nh.from_array(weight.astype(np.float32), "W"), nh.from_array(bias.astype(np.float32), "b")]
    if reshape_to_one:
        inits.append(nh.from_array(np.array([1, -1], dtype=np.int64), "shape"))
        first = helper.make_node("Reshape", ["X", "shape"], ["F"])
    else:
        first = helper.make_node("Flatten", ["X"], ["F"], axis=1)
    nodes = [first, helper.make_node("Gemm", ["F", "W", "b"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tiny_classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, *in_shape])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, c])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _ranked_set(tmp_path: Path, ranks, num_classes=10, seed=1):
    """A raw float npz whose identity classifier puts each label at the given rank.

    Samples are (N, 3, 2, 2) = 12 features; the identity Gemm (first 10 features -> 10
    logits) makes the logits the first 10 features. Returns (path, x, labels, model).
    """
    rng = np.random.default_rng(seed)
    n = len(ranks)
    x = np.zeros((n, 12), dtype=np.float32)
    labels = np.empty(n, dtype=np.int64)
    for i, r in enumerate(ranks):
        perm = rng.permutation(num_classes)        # perm[k] = class with the k-th largest logit
        x[i, perm] = np.arange(num_classes, 0, -1, dtype=np.float32) + rng.random() * 0.5
        labels[i] = perm[r]
        x[i, 10:] = rng.standard_normal(2)         # ignored by the identity Gemm
    x = x.reshape(n, 3, 2, 2)
    path = tmp_path / "ranked.npz"
    np.savez(path, x=x, y=labels)
    weight = np.zeros((12, num_classes), dtype=np.float32)
    weight[np.arange(num_classes), np.arange(num_classes)] = 1.0
    model = _gemm_model(weight, np.zeros(num_classes), (3, 2, 2))
    return path, x, labels, model


RANKS = [0] * 9 + [1, 2, 3, 4] + [5, 7, 9] + [0] * 4  # 13/20 top-1, 17/20 top-5


# --------------------------------------------------------------------------- load_dataset

def test_cifar_layout_preprocessing_and_labels(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 32, 32, 3), dtype=np.uint8)
    labels = np.array([3, 8, 8, 0, 6, 6, 1], dtype=np.uint8)
    np.savez(tmp_path / "cifar.npz", images=images, labels=labels,
             class_names=np.array(["a"] * 10))
    ds = load_dataset(tmp_path / "cifar.npz")
    assert isinstance(ds, Dataset) and ds.name == "cifar" and len(ds) == 7
    assert ds.sample_shape == (3, 32, 32)
    assert ds.preprocessing.startswith("cifar:")
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == labels.tolist()
    x = ds.materialize()
    assert x.dtype == np.float32 and x.shape == (7, 3, 32, 32) and x.flags.c_contiguous
    np.testing.assert_allclose(x, _cifar_formula(images), rtol=0, atol=1e-6)
    # one channel value by hand: pixel 0 of image 0, red channel
    assert x[0, 0, 0, 0] == pytest.approx((images[0, 0, 0, 0] / 255 - 0.485) / 0.229, abs=1e-6)
    # batches: same values, labels aligned, last batch short
    got = list(ds.batches(3))
    assert [b[0].shape[0] for b in got] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in got]), x)
    assert np.concatenate([b[1] for b in got]).tolist() == labels.tolist()
    # the explicit preset gives the same, frozen dataclass
    assert np.array_equal(load_dataset(tmp_path / "cifar.npz", preprocess="cifar").materialize(), x)
    with pytest.raises(Exception):
        ds.name = "other"


def test_cifar_limit(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
    np.savez(tmp_path / "c.npz", images=images, labels=np.arange(10, dtype=np.uint8))
    ds = load_dataset(tmp_path / "c.npz", limit=4)
    assert len(ds) == 4 and ds.labels.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(ds.materialize(), _cifar_formula(images[:4]), atol=1e-6)
    assert len(load_dataset(tmp_path / "c.npz", limit=1000)) == 10  # limit above n: all


def test_imagenet_jpeg_layout(tmp_path):
    blobs, labels = _jpeg_npz(tmp_path / "imnet.npz", n=3)
    ds = load_dataset(tmp_path / "imnet.npz")
    assert ds.preprocessing.startswith("imagenet:") and ds.sample_shape == (3, 224, 224)
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == labels.tolist() == [0, 7, 14]
    x = ds.materialize()
    assert x.dtype == np.float32 and x.shape == (3, 3, 224, 224)
    np.testing.assert_array_equal(x, _decode_formula(blobs))  # (x - 127) / 128 is exact
    assert x.min() >= -127 / 128 and x.max() <= 128 / 128
    # a middle slice decodes the same images
    np.testing.assert_array_equal(ds.inputs(1, 2), x[1:2])


def test_imagenet_limit_and_lazy_decoding(tmp_path, monkeypatch):
    from PIL import Image
    blobs, _ = _jpeg_npz(tmp_path / "imnet.npz", n=4)
    calls = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: calls.append(1) or real_open(*a, **k))
    ds = load_dataset(tmp_path / "imnet.npz", limit=2)
    assert len(calls) == 1  # only image 0, to learn the image size
    assert len(ds) == 2 and ds.labels.tolist() == [0, 7]
    batch = ds.inputs(0, 1)
    assert len(calls) == 2 and batch.shape == (1, 3, 224, 224)  # decodes only what is asked
    np.testing.assert_array_equal(ds.materialize(), _decode_formula(blobs[:2]))


def test_imagenet_different_image_sizes_is_an_error(tmp_path):
    _jpeg_npz(tmp_path / "a.npz", n=1, size=224)
    _jpeg_npz(tmp_path / "b.npz", n=1, size=200)
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    data = np.concatenate([a["jpeg_bytes"], b["jpeg_bytes"]])
    offsets = np.array([0, a["jpeg_bytes"].size, data.size], dtype=np.int64)
    np.savez(tmp_path / "mixed.npz", jpeg_bytes=data, offsets=offsets, labels=np.array([0, 1]))
    ds = load_dataset(tmp_path / "mixed.npz")
    with pytest.raises(ValueError, match=r"mixed\.npz: image 1 decodes to 200x200, but image 0 is 224x224"):
        ds.materialize()


def test_pillow_missing_is_a_clear_error(tmp_path, monkeypatch):
    _jpeg_npz(tmp_path / "imnet.npz", n=1)
    images = np.zeros((2, 32, 32, 3), dtype=np.uint8)
    np.savez(tmp_path / "cifar.npz", images=images, labels=np.array([0, 1]))
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes "from PIL import Image" fail
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ValueError) as info:
        load_dataset(tmp_path / "imnet.npz")
    msg = str(info.value)
    assert "imnet.npz" in msg and "Pillow" in msg and "pip install pillow" in msg
    assert "redpp-onnx[eval]" in msg and "\n" not in msg
    assert len(load_dataset(tmp_path / "cifar.npz")) == 2  # no Pillow needed for arrays


def test_raw_float_nchw_used_as_is(tmp_path):
    x = np.random.default_rng(2).standard_normal((5, 3, 4, 6)).astype(np.float32)
    y = np.array([1, 0, 4, 2, 3])
    np.savez(tmp_path / "raw.npz", x=x, y=y)
    ds = load_dataset(tmp_path / "raw.npz")
    assert ds.preprocessing.startswith("raw:") and ds.sample_shape == (3, 4, 6)
    np.testing.assert_array_equal(ds.materialize(), x)
    assert ds.labels.tolist() == y.tolist()
    # alternative key names, float64 is cast, NHWC transposed on request
    np.savez(tmp_path / "raw2.npz", inputs=x.transpose(0, 2, 3, 1).astype(np.float64), labels=y)
    ds2 = load_dataset(tmp_path / "raw2.npz", preprocess="raw", layout="NHWC", limit=3)
    np.testing.assert_array_equal(ds2.materialize(), x[:3])
    assert ds2.labels.tolist() == [1, 0, 4]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_raw_uint8_with_mean_std(tmp_path, layout):
    images = np.random.default_rng(3).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    stored = images if layout == "NHWC" else images.transpose(0, 3, 1, 2)
    np.savez(tmp_path / "u8.npz", images=stored, labels=np.arange(4))
    mean, std = [0.5, 0.25, 0.125], [0.2, 0.4, 0.8]
    ds = load_dataset(tmp_path / "u8.npz", mean=mean, std=std, layout=layout)  # auto -> raw
    expected = ((images / 255.0 - np.array(mean)) / np.array(std)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(ds.materialize(), expected.astype(np.float32), atol=1e-6)
    assert ds.preprocessing.startswith("raw:") and ds.sample_shape == (3, 8, 8)
    # scalar statistics broadcast to every channel
    ds1 = load_dataset(tmp_path / "u8.npz", preprocess="raw", mean=0, std=1, layout=layout)
    np.testing.assert_allclose(ds1.materialize(), (images / 255.0).transpose(0, 3, 1, 2), atol=1e-7)


def _error(path, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        load_dataset(path, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_file_errors(tmp_path):
    assert "no such file" in _error(tmp_path / "absent.npz")
    (tmp_path / "text.npz").write_text("hello")
    assert "not an npz archive" in _error(tmp_path / "text.npz")
    np.save(tmp_path / "arr.npy", np.zeros(3))
    assert "not an npz archive" in _error(tmp_path / "arr.npy")


def test_missing_keys_lists_found_and_expected(tmp_path):
    np.savez(tmp_path / "k.npz", pictures=np.zeros((2, 32, 32, 3), np.uint8), labels=np.zeros(2))
    msg = _error(tmp_path / "k.npz")
    assert "missing key(s) x (or images / inputs)" in msg
    assert "found ['labels', 'pictures']" in msg and "jpeg_bytes+offsets+labels" in msg
    np.savez(tmp_path / "k2.npz", images=np.zeros((2, 32, 32, 3), np.uint8))
    assert "missing key(s) y (or labels)" in _error(tmp_path / "k2.npz")
    np.savez(tmp_path / "k3.npz", jpeg_bytes=np.zeros(10, np.uint8), labels=np.zeros(1, np.int64))
    assert "missing key(s) offsets" in _error(tmp_path / "k3.npz")


def test_count_mismatch(tmp_path):
    np.savez(tmp_path / "m.npz", images=np.zeros((3, 32, 32, 3), np.uint8), labels=np.zeros(4, np.int64))
    assert "'images' holds 3 images but 'labels' has 4 labels" in _error(tmp_path / "m.npz")
    blobs, _ = _jpeg_npz(tmp_path / "j.npz", n=2, labels=np.array([0, 1, 2], dtype=np.int16))
    assert "'offsets' describes 2 images but 'labels' has 3 labels" in _error(tmp_path / "j.npz")


def test_option_errors(tmp_path):
    np.savez(tmp_path / "u.npz", images=np.zeros((2, 64, 64, 3), np.uint8), labels=np.zeros(2, np.int64))
    assert "cannot guess the preprocessing" in _error(tmp_path / "u.npz")
    assert "need mean= and std=" in _error(tmp_path / "u.npz", preprocess="raw")
    assert "has fixed statistics" in _error(tmp_path / "u.npz", preprocess="cifar", mean=[0] * 3, std=[1] * 3)
    assert "give both mean= and std=" in _error(tmp_path / "u.npz", mean=[0.5] * 3)
    assert "list of 3 per-channel" in _error(tmp_path / "u.npz", mean=[0.5] * 2, std=[1] * 3)
    assert "layout must be" in _error(tmp_path / "u.npz", layout="HWC")
    assert "preprocess must be one of" in _error(tmp_path / "u.npz", preprocess="vgg")
    assert "limit must be a positive integer" in _error(tmp_path / "u.npz", limit=0)
    np.savez(tmp_path / "f.npz", x=np.zeros((2, 3, 4, 4), np.float32), y=np.zeros(2, np.int64))
    assert "needs uint8 images" in _error(tmp_path / "f.npz", preprocess="cifar")
    np.savez(tmp_path / "neg.npz", x=np.zeros((2, 3, 4, 4), np.float32), y=np.array([0, -1]))
    assert "negative class indices" in _error(tmp_path / "neg.npz")


# --------------------------------------------------------------------------- evaluate

def test_evaluate_exact_top1_top5_and_self_agreement(tmp_path):
    path, x, labels, model = _ranked_set(tmp_path, RANKS)
    ds = load_dataset(path)
    seen = []
    r = evaluate(model, ds, batch_size=6, reference=model, progress=lambda d, t: seen.append((d, t)))
    assert isinstance(r, EvalResult)
    assert (r.n, r.num_classes, r.top1_correct, r.top5_correct) == (20, 10, 13, 17)
    assert r.top1 == 13 / 20 and r.top5 == 17 / 20
    assert (r.reference_top1, r.reference_top5) == (r.top1, r.top5)
    assert r.agreement == 1.0 and r.max_abs_logit_diff == 0.0
    assert r.mean_rel_l2_logit_diff == 0.0 and r.mean_logit_diff_norm == 0.0
    logits = x.reshape(20, 12)[:, :10].astype(np.float64)
    expected_norm = np.linalg.norm(logits, axis=1).mean()
    assert r.mean_logit_norm == pytest.approx(expected_norm, rel=1e-6)
    assert r.reference_mean_logit_norm == pytest.approx(expected_norm, rel=1e-6)
    assert r.batch_size_used == 6 and r.notes == ()
    assert seen == [(6, 20), (12, 20), (18, 20), (20, 20)]
    d = json.loads(json.dumps(r.to_dict()))
    assert d["top1"] == 0.65 and d["agreement"] == 1.0 and d["notes"] == []
    # without a reference the drift fields are None; a path works like a ModelProto
    onnx.save(model, tmp_path / "m.onnx")
    r2 = evaluate(tmp_path / "m.onnx", ds)
    assert r2.top1_correct == 13 and r2.agreement is None and r2.reference_top1 is None
    assert r2.batch_size_used == 256 and r2.to_dict()["max_abs_logit_diff"] is None


def test_evaluate_against_a_perturbed_copy(tmp_path):
    path, x, labels, model = _ranked_set(tmp_path, RANKS)
    weight = np.zeros((12, 10), dtype=np.float32)
    weight[np.arange(10), np.arange(10)] = 1.0
    bias = np.zeros(10, dtype=np.float32)
    bias[3] = 4.0  # class 3 wins wherever it was within 4 of the top
    perturbed = _gemm_model(weight, bias, (3, 2, 2))
    r = evaluate(perturbed, load_dataset(path), batch_size=7, reference=model)
    f = x.reshape(20, 12)[:, :10].astype(np.float64)
    g = f + bias
    assert r.agreement == np.mean(g.argmax(1) == f.argmax(1)) and r.agreement < 1.0
    assert r.top1_correct == int((g.argmax(1) == labels).sum())
    assert r.reference_top1_correct == 13 and r.reference_top5_correct == 17
    assert r.max_abs_logit_diff == pytest.approx(4.0)
    assert r.mean_logit_diff_norm == pytest.approx(4.0)
    rel = (np.linalg.norm(g - f, axis=1) / np.linalg.norm(f, axis=1)).mean()
    assert r.mean_rel_l2_logit_diff == pytest.approx(rel, rel=1e-6)
    assert r.mean_logit_norm == pytest.approx(np.linalg.norm(g, axis=1).mean(), rel=1e-6)
    assert r.reference_mean_logit_norm == pytest.approx(np.linalg.norm(f, axis=1).mean(), rel=1e-6)


@pytest.mark.parametrize("fixed", [1, 4])
def test_fixed_batch_axis(tmp_path, fixed):
    path, x, labels, model = _ranked_set(tmp_path, RANKS)
    weight = nh.to_array(model.graph.initializer[0])
    fixed_model = _gemm_model(weight, np.zeros(10), (3, 2, 2), batch=fixed)
    r = evaluate(fixed_model, load_dataset(path), batch_size=8, reference=model)
    assert r.batch_size_used == fixed and r.reference_batch_size_used == 8
    assert (r.top1_correct, r.top5_correct, r.agreement, r.max_abs_logit_diff) == (13, 17, 1.0, 0.0)
    assert len(r.notes) == 1 and f"fixed to {fixed}" in r.notes[0]


def test_dynamic_axis_that_only_runs_batch_1_falls_back(tmp_path):
    path, x, labels, model = _ranked_set(tmp_path, RANKS)
    weight = nh.to_array(model.graph.initializer[0])
    reshape_model = _gemm_model(weight, np.zeros(10), (3, 2, 2), reshape_to_one=True)
    r = evaluate(reshape_model, load_dataset(path), batch_size=8, reference=model)
    assert r.batch_size_used == 1 and r.reference_batch_size_used == 8
    assert (r.top1_correct, r.top5_correct, r.agreement, r.max_abs_logit_diff) == (13, 17, 1.0, 0.0)
    assert any("one sample at a time" in note for note in r.notes)


def test_evaluate_errors(tmp_path):
    path, x, labels, model = _ranked_set(tmp_path, RANKS)
    ds = load_dataset(path)
    other_shape = _gemm_model(np.zeros((27, 10)), np.zeros(10), (3, 3, 3))
    with pytest.raises(ValueError, match=r"expects shape \['N', 3, 3, 3\].*samples of shape \[3, 2, 2\]"):
        evaluate(other_shape, ds)
    few_classes = _gemm_model(np.zeros((12, 5)), np.zeros(5), (3, 2, 2))
    with pytest.raises(ValueError, match="outputs 5 classes, but the labels of 'ranked' go up to 9"):
        evaluate(few_classes, ds)
    with pytest.raises(ValueError, match="no such model file"):
        evaluate(tmp_path / "absent.onnx", ds)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        evaluate(model, ds, batch_size=0)


# --------------------------------------------------------------------------- real models (slow)

def _shared(name: str) -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared benchmark folder {SHARED} is absent (expected beside the checkout)")
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return path


# (model, data, n, top-1 %, top-5 %) from shared/bench/PROVENANCE.md
PROVENANCE_ROWS = [
    ("cifar10_resnet20.onnx", "cifar10_test_exact1017.npz", 1017, 91.64, 99.80),
    ("cifar10_resnet56.onnx", "cifar10_test_exact1017.npz", 1017, 92.72, 99.80),
    ("cifar10_resnet20.onnx", "cifar10_test_jpeg10k.npz", 10000, 81.03, 98.72),
    ("imagenet_efficientnet_lite0.onnx", "imagenet_sample1000_224_q95.npz", 1000, 87.80, 97.50),
]


def _correct_count(percent: float, n: int) -> int:
    """The unique integer count that rounds to ``percent`` (2 decimals) out of ``n``."""
    counts = [k for k in range(n + 1) if round(100 * k / n, 2) == percent]
    assert len(counts) == 1, (percent, n, counts)
    return counts[0]


@pytest.mark.slow
@pytest.mark.parametrize("model_name,data_name,n,top1,top5", PROVENANCE_ROWS,
                         ids=["resnet20-exact1017", "resnet56-exact1017", "resnet20-jpeg10k",
                              "efficientnet-lite0-imagenet1000"])
def test_provenance_accuracy(model_name, data_name, n, top1, top5):
    model, data = _shared(model_name), _shared(data_name)
    ds = load_dataset(data)
    batch = 32 if ds.sample_shape[1] >= 224 else 256  # big images: smaller, faster batches
    r = evaluate(model, ds, batch_size=batch)
    assert r.n == n
    assert r.top1_correct == _correct_count(top1, n)
    assert r.top5_correct == _correct_count(top5, n)
    assert round(100 * r.top1, 2) == top1 and round(100 * r.top5, 2) == top5


@pytest.mark.slow
def test_resnet20_paired_with_resnet56_on_exact1017():
    ds = load_dataset(_shared("cifar10_test_exact1017.npz"))
    r20, r56 = _shared("cifar10_resnet20.onnx"), _shared("cifar10_resnet56.onnx")
    same = evaluate(r20, ds, reference=r20)
    assert same.agreement == 1.0 and same.max_abs_logit_diff == 0.0 and same.top1_correct == 932
    pair = evaluate(r20, ds, reference=r56)
    assert (pair.top1_correct, pair.reference_top1_correct) == (932, 943)
    assert 0.85 < pair.agreement < 1.0 and pair.mean_logit_diff_norm > 0


# --------------------------------------------------------------------------- named inputs, non-finite data

def _bert_pair():
    from .test_verify import bert_like

    return bert_like(), bert_like(perturb=0.05)


def _sentence_npz(tmp_path, name="sentences.npz", **extra):
    from .test_verify import _sentences

    arrays = dict(_sentences(), **extra)
    np.savez(tmp_path / name, **arrays)
    return tmp_path / name, arrays


def _cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_eval_on_named_inputs_without_labels_compares_every_output(tmp_path):
    from redpp_onnx.evaluate import NamedInputs, load_inputs
    import onnxruntime as ort

    model, changed = _bert_pair()
    path, arrays = _sentence_npz(tmp_path)
    data = load_inputs(path, model)
    assert isinstance(data, NamedInputs) and len(data) == 12 and data.labels is None
    r = evaluate(changed, data, batch_size=5, reference=model)
    assert r.n == 12 and r.top1 is None and r.agreement is None and r.num_classes is None
    a = ort.InferenceSession(changed.SerializeToString()).run(None, arrays)[0].astype(np.float64)
    b = ort.InferenceSession(model.SerializeToString()).run(None, arrays)[0].astype(np.float64)
    (out,) = r.outputs
    cos = _cosines(a, b)
    assert out["name"] == "sentence_embedding"
    assert out["cosine_mean"] == pytest.approx(cos.mean(), rel=1e-6)
    assert out["cosine_min"] == pytest.approx(cos.min(), rel=1e-6)
    assert out["rel_l2"] == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b), rel=1e-6)
    assert out["max_abs_diff"] == pytest.approx(np.abs(a - b).max(), rel=1e-6)
    json.dumps(r.to_dict())


def test_eval_on_named_inputs_with_labels_cli(tmp_path, capsys):
    from redpp_onnx.cli import main
    import onnxruntime as ort

    model, changed = _bert_pair()
    from .test_verify import _sentences
    logits = ort.InferenceSession(model.SerializeToString()).run(None, _sentences())[0]
    path, _ = _sentence_npz(tmp_path, labels=logits.argmax(1).astype(np.int64))
    onnx.save(model, str(tmp_path / "ref.onnx"))
    onnx.save(changed, str(tmp_path / "new.onnx"))
    assert main(["eval", str(tmp_path / "new.onnx"), "--data", str(path), "--ref", str(tmp_path / "ref.onnx"),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n"] == 12 and d["reference_top1"] == 1.0 and 0 < d["top1"] <= 1 and d["agreement"] == d["top1"]
    assert d["outputs"][0]["name"] == "sentence_embedding" and 0.5 < d["outputs"][0]["cosine_mean"] < 1
    # the table: top-1 and one line per output
    assert main(["eval", str(tmp_path / "new.onnx"), "--data", str(path), "--ref", str(tmp_path / "ref.onnx")]) == 0
    text = capsys.readouterr().out
    assert "top-1" in text and "sentence_embedding: cosine similarity mean" in text
    # without labels: only the comparison; without --ref and labels there is nothing to measure
    plain, _ = _sentence_npz(tmp_path, "plain.npz")
    assert main(["eval", str(tmp_path / "new.onnx"), "--data", str(plain), "--ref", str(tmp_path / "ref.onnx")]) == 0
    text = capsys.readouterr().out
    assert "top-1" not in text and "relative L2" in text
    assert main(["eval", str(tmp_path / "new.onnx"), "--data", str(plain)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no labels" in err and "--ref" in err and "\n" not in err


def test_eval_image_data_with_ref_compares_outputs_too(tmp_path):
    path, x, labels, model = _ranked_set(tmp_path, RANKS)
    r = evaluate(model, load_dataset(path), reference=model)
    assert r.outputs == ({"name": "logits", "cosine_mean": 1.0, "cosine_min": 1.0, "rel_l2": 0.0,
                          "max_abs_diff": 0.0},)


def _nan_npz(tmp_path, named=False):
    path, x, labels, model = _ranked_set(tmp_path, RANKS)
    x = x.copy()
    x[3, 0, 1, 1] = np.nan
    x[5, 1, 0, 0] = np.inf
    bad = tmp_path / "nan.npz"
    np.savez(bad, **({"X": x} if named else {"x": x, "y": labels}))
    onnx.save(model, str(tmp_path / "m.onnx"))
    return bad, tmp_path / "m.onnx"


def test_non_finite_data_is_rejected(tmp_path):
    bad, model = _nan_npz(tmp_path)
    msg = _error(bad)
    assert "2 NaN/Inf value(s)" in msg and "sample 3" in msg
    from redpp_onnx.evaluate import load_inputs

    bad2, _ = _nan_npz(tmp_path, named=True)
    with pytest.raises(ValueError, match=r"'X' holds 2 NaN/Inf value\(s\)") as info:
        load_inputs(bad2, onnx.load(str(model)))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("named", [False, True])
def test_non_finite_data_cli_eval_and_calibrate(tmp_path, capsys, named):
    from redpp_onnx.cli import main

    bad, model = _nan_npz(tmp_path, named=named)
    commands = [["eval", str(model), "--data", str(bad), "--ref", str(model)]]
    if not named:
        commands.append(["compress", str(model), "-o", str(tmp_path / "o.onnx"), "-q", "--calibrate", str(bad)])
    for args in commands:
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.startswith("redpp-onnx: error:") and "\n" not in err and "Traceback" not in err
        assert "NaN/Inf" in err and str(bad) in err, err
    assert not (tmp_path / "o.onnx").exists()
