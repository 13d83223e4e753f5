#!/usr/bin/env python3
"""Train and export the demo model: a small CNN on scikit-learn's digits data set.

Regenerate (development time only; torch and scikit-learn are NOT dependencies of
``redpp_onnx``)::

    pip install torch==2.13.0 scikit-learn
    python models/make_digits_cnn.py

Writes, next to this script:

* ``digits_cnn.onnx`` -- the trained model (opset 17, IR version 8, input ``input``
  float32 ``N x 1 x 8 x 8``, output ``logits`` float32 ``N x 10``), with every
  BatchNormalization kept as its own node after its Conv, so the compressor sees
  ``Conv -> BatchNormalization -> Relu``.
* ``digits_test.npz`` -- the held-out split in the "raw" layout that
  :func:`redpp_onnx.evaluate.load_dataset` reads: ``x`` float32 ``N x 1 x 8 x 8``
  (already preprocessed) and ``y`` int64 labels.

Data: ``sklearn.datasets.load_digits`` -- 1,797 8x8 grayscale images of handwritten
digits, 10 classes, pixel values 0..16 (a copy of the test part of the UCI "Optical
Recognition of Handwritten Digits" data set, shipped with scikit-learn).

Split: ``train_test_split(test_size=0.2, random_state=0, stratify=y)`` -> 1,437 train,
360 held-out test. The held-out set is never used for training or model selection: the
model after the last epoch is exported, whatever its test accuracy.

Preprocessing: ``x = pixels / 16.0`` as float32, reshaped to ``N x 1 x 8 x 8``
(no mean/std normalisation, no augmentation).

Architecture::

    Conv(1->16, 3x3, pad 1) -> BN -> ReLU
    Conv(16->32, 3x3, pad 1) -> BN -> ReLU -> MaxPool 2x2        (8x8 -> 4x4)
    Conv(32->32, 3x3, pad 1) -> BN -> ReLU
    GlobalAveragePool -> Flatten -> Linear(32->10)

Training: Adam (lr 1e-2, then 1e-3 for the last epochs), batch 64, cross-entropy, seeded
(torch, numpy, python ``random``), one thread, ``torch.use_deterministic_algorithms``.

The script prints the held-out accuracy measured with onnxruntime through
``redpp_onnx.evaluate`` and the max |logit difference| between PyTorch and onnxruntime.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import onnx
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

HERE = Path(__file__).resolve().parent
ONNX_PATH = HERE / "digits_cnn.onnx"
TEST_PATH = HERE / "digits_test.npz"

SEED = 0
EPOCHS = 30
LR_DROP_EPOCH = 24  # lr 1e-2 before, 1e-3 from this epoch on
BATCH = 64
IR_VERSION = 8  # onnxruntime 1.31 loads IR <= 13; onnx 1.23 writes 14 by default


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def load_split():
    """Digits -> (x_train, y_train, x_test, y_test); x float32 N x 1 x 8 x 8 in [0, 1]."""
    digits = load_digits()
    x = (digits.images.astype(np.float64) / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return (np.ascontiguousarray(x_tr), y_tr, np.ascontiguousarray(x_te), y_te)


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.flatten(self.features(x)))


def train(model: nn.Module, x: np.ndarray, y: np.ndarray) -> None:
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        if epoch == LR_DROP_EPOCH:
            for group in opt.param_groups:
                group["lr"] = 1e-3
        model.train()
        perm = torch.randperm(xt.shape[0], generator=gen)
        total = 0.0
        for i in range(0, xt.shape[0], BATCH):
            idx = perm[i:i + BATCH]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += float(loss) * idx.numel()
        print(f"epoch {epoch + 1:2d}/{EPOCHS}  train loss {total / xt.shape[0]:.4f}")


def export(model: nn.Module) -> None:
    model.eval()
    dummy = torch.zeros(1, 1, 8, 8)
    torch.onnx.export(
        model, (dummy,), str(ONNX_PATH), dynamo=False, opset_version=17,
        do_constant_folding=True, training=torch.onnx.TrainingMode.PRESERVE,
        input_names=["input"], output_names=["logits"],
        dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    m = onnx.load(str(ONNX_PATH))
    m.ir_version = IR_VERSION
    m.producer_name = "redpp-onnx models/make_digits_cnn.py"
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(ONNX_PATH))
    ops = sorted({n.op_type for n in m.graph.node})
    print(f"wrote {ONNX_PATH.name}: {ONNX_PATH.stat().st_size} bytes, IR {m.ir_version}, "
          f"opset {m.opset_import[0].version}, ops {ops}")
    if "BatchNormalization" not in ops:
        raise SystemExit("BatchNormalization was folded away by the export")


def main() -> None:
    seed_everything(SEED)
    x_tr, y_tr, x_te, y_te = load_split()
    print(f"digits: {len(y_tr)} train, {len(y_te)} held-out test")
    model = DigitsCNN()
    train(model, x_tr, y_tr)
    model.eval()
    export(model)
    np.savez(TEST_PATH, x=x_te.astype(np.float32), y=y_te.astype(np.int64))
    print(f"wrote {TEST_PATH.name}: x {x_te.shape} float32, y {y_te.shape} int64")

    from redpp_onnx.evaluate import evaluate, load_dataset
    from redpp_onnx.runtime import session

    result = evaluate(str(ONNX_PATH), load_dataset(TEST_PATH))
    print(f"held-out accuracy (onnxruntime): {result.top1_correct}/{result.n} = "
          f"{100 * result.top1:.2f} %")
    with torch.no_grad():
        torch_logits = model(torch.from_numpy(x_te)).numpy()
    ort_logits = session(str(ONNX_PATH)).run(None, {"input": x_te})[0]
    print(f"PyTorch vs onnxruntime max |logit diff| on the held-out set: "
          f"{float(np.abs(torch_logits - ort_logits).max()):.3e}")
    torch_correct = int((torch_logits.argmax(1) == y_te).sum())
    print(f"held-out accuracy (PyTorch): {torch_correct}/{len(y_te)}")


if __name__ == "__main__":
    main()
