"""Export the zoo: small torch models of common architectures, with both torch exporters.

Developer tool (needs torch and onnxscript, which are not dependencies of the project):

    pip install torch==2.13.0 onnxscript
    python tests/zoo/make_zoo.py [NAME ...]

It writes ``<name>_ts.onnx`` (TorchScript exporter, opset 17, dynamic batch; it folds
BatchNorm into Conv and deduplicates equal initializers through Identity nodes) and
``<name>_dynamo.onnx`` (+ ``.data``: the dynamo exporter, opset 20+, external data). Weights
are seeded random initialisations. ``tests/test_zoo.py`` runs every ``compress`` variant on them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
IR_VERSION = 10


class MobileNetV2ish(nn.Module):
    """Inverted residuals: 1x1 expand, depthwise 3x3, 1x1 project, ReLU6, BatchNorm."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())

        def block(cin, cout, stride):
            h = cin * 4
            return nn.Sequential(nn.Conv2d(cin, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                                 nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                                 nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.b1, self.b2, self.b3 = block(16, 16, 1), block(16, 32, 2), block(32, 32, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.b1(x)
        x = self.b2(x)
        x = x + self.b3(x)
        return self.head(x.mean((2, 3)))


class Encoder(nn.Module):
    """Embedding + two Transformer encoder layers (cloned: equal initial weights) + Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(32, 5)

    def forward(self, ids):
        return self.out(self.enc(self.emb(ids)).mean(1))


class BertLike(nn.Module):
    """A BERT-style sentence encoder: word + position embeddings, LayerNorm, two post-norm
    Transformer layers with their own weights (GELU MLP), mean-pooled sentence embedding (the
    output: no head). Seeded random weights; token ids ``[N, 16]`` below 1,000."""

    def __init__(self, vocab=1000, dim=64, layers=2, seq=16, heads=4, ffn=None):
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(dim, heads, ffn or 2 * dim, batch_first=True,
                                                               dropout=0.0, activation="gelu")
                                    for _ in range(layers))

    def forward(self, ids):
        x = self.norm(self.words(ids) + self.positions.weight[: ids.shape[1]])
        for layer in self.layers:
            x = layer(x)
        return x.mean(1)


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 32, batch_first=True)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


class Conv1D(nn.Module):
    """1-D convs, dilation, a grouped (not depthwise) conv, max over time."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(8, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 3, padding=2, dilation=2),
                                 nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(32, 32, 3, groups=2), nn.ReLU())
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(self.net(x).amax(2))


class UNetish(nn.Module):
    """Strided conv, ConvTranspose, skip Concat, GroupNorm, squeeze-excitation, Resize."""

    def __init__(self):
        super().__init__()
        self.d1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU())
        self.d2 = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, 2)
        self.fuse = nn.Conv2d(32, 16, 3, padding=1)
        self.gn = nn.GroupNorm(4, 16)
        self.se1, self.se2 = nn.Linear(16, 4), nn.Linear(4, 16)
        self.out = nn.Conv2d(16, 2, 1)

    def forward(self, x):
        a = self.d1(x)
        u = self.up(self.d2(a))
        f = F.relu(self.gn(self.fuse(torch.cat([a, u], 1))))
        f = f * torch.sigmoid(self.se2(F.relu(self.se1(f.mean((2, 3))))))[:, :, None, None]
        return self.out(F.interpolate(f, scale_factor=2.0, mode="nearest"))


class Tied(nn.Module):
    """One Linear applied twice (a weight shared by two layers)."""

    def __init__(self):
        super().__init__()
        self.shared, self.out = nn.Linear(32, 32), nn.Linear(32, 10)

    def forward(self, x):
        return self.out(torch.tanh(self.shared(torch.tanh(self.shared(x)))))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(196, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                                 nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


MODELS = {"mobilenetv2ish": (MobileNetV2ish, lambda: torch.randn(2, 3, 32, 32)),
          "encoder": (Encoder, lambda: torch.randint(0, 100, (2, 12))),
          "lstm": (LSTMNet, lambda: torch.randn(2, 7, 8)),
          "conv1d": (Conv1D, lambda: torch.randn(2, 8, 40)),
          "unetish": (UNetish, lambda: torch.randn(2, 3, 16, 16)),
          "tied": (Tied, lambda: torch.randn(2, 32)),
          "mlp": (MLP, lambda: torch.randn(2, 1, 14, 14)),
          "bertlike": (BertLike, lambda: torch.randint(0, 1000, (2, 16)))}


HALF = ("bertlike",)
"""Also exported in float16 throughout (``model.half()``, TorchScript exporter; as ``NAME_half_ts.onnx``):
onnxruntime crashes creating a session of ``bertlike_half_ts.onnx`` with its default optimizations
(redpp_onnx.runtime.HALF_COMPUTE_DISABLED)."""


def main() -> None:
    import sys

    warnings.filterwarnings("ignore")
    only = sys.argv[1:]  # names to export (default: all; NAME_half: only that model's float16 export)
    for name, (cls, example) in MODELS.items():
        full = not only or name in only
        half = name in HALF and (not only or f"{name}_half" in only)
        if not (full or half):
            continue
        torch.manual_seed(0)
        model = cls().eval()
        x = example()
        ts, dyn = HERE / f"{name}_ts.onnx", HERE / f"{name}_dynamo.onnx"
        paths = []
        if full:
            torch.onnx.export(model, (x,), str(ts), dynamo=False, opset_version=17, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
            torch.onnx.export(model, (x,), str(dyn), dynamo=True, verbose=False)
            paths += [ts, dyn]
        if half:
            paths.append(HERE / f"{name}_half_ts.onnx")
            torch.onnx.export(model.half(), (x,), str(paths[-1]), dynamo=False, opset_version=17, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
        for path in paths:
            m = onnx.load(str(path), load_external_data=False)
            m.ir_version = min(m.ir_version, IR_VERSION)
            onnx.save(m, str(path))
            print(f"{path.name}: opset {m.opset_import[0].version}, {len(m.graph.node)} nodes, "
                  f"{path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
