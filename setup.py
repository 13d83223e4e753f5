"""Build of the C++ part: the onnxruntime custom-op library and the pybind11 module.

* ``redpp_onnx/libredpp_ops.so``: the custom-op library (SplitConv). Plain C++: links to
  neither onnxruntime nor Python, so any onnxruntime >= 1.29 host (Python, C, C++, C#...)
  can load it.
* ``redpp_onnx/_core.*.so``: the pybind11 module (build information, the compute core on
  numpy arrays).

The onnxruntime headers come from ``ORT_INCLUDE_DIR`` or are fetched once into a cache with
npm (see ``redpp_onnx/_build/ort_headers.py``). The SplitConv contract header is generated from
``redpp_onnx/ops/schema.py``. Optimised (-O3), no -march=native: the hot loops carry their own
runtime dispatch (see csrc/split_conv.cc).
"""

import importlib.util
import sys
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()
OPS_LIBRARY = "redpp_onnx.libredpp_ops"


def _load(name: str, relpath: str):
    """Import a standard-library-only module of the package by path (deps not installed yet)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


ort_headers = _load("_redpp_build_ort_headers", "redpp_onnx/_build/ort_headers.py")
schema = _load("_redpp_build_schema", "redpp_onnx/ops/schema.py")

CXX_FLAGS = ["-O3", "-std=c++17", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"]


class BuildExt(build_ext):
    def build_extensions(self):
        try:
            include = ort_headers.find_ort_include_dir(log=lambda msg: print(msg, file=sys.stderr))
        except ort_headers.OrtHeadersError as err:
            sys.exit(f"error: {err}")
        generated = Path(self.build_temp).resolve() / "generated"
        generated.mkdir(parents=True, exist_ok=True)
        header = generated / "split_conv_contract.h"
        text = schema.render_cpp_header()
        if not header.is_file() or header.read_text() != text:
            header.write_text(text)
        for ext in self.extensions:
            ext.include_dirs = [str(include), str(generated), str(ROOT / "csrc")] + list(ext.include_dirs)
            ext.depends = list(ext.depends) + [str(header)]
        super().build_extensions()

    def get_ext_filename(self, fullname):
        # setuptools asks with the full dotted name and with its last part alone.
        if fullname in (OPS_LIBRARY, OPS_LIBRARY.rsplit(".", 1)[-1]):
            suffix = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
            return str(Path(*fullname.split("."))) + suffix  # a plain shared library
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        if ext.name == OPS_LIBRARY:
            return ["RegisterCustomOps"]
        return super().get_export_symbols(ext)


setup(
    ext_modules=[
        Extension(
            OPS_LIBRARY,
            sources=["csrc/redpp_ops.cc", "csrc/split_conv.cc"],
            depends=["csrc/split_conv.h", "csrc/split_conv_kernels.inc"],
            language="c++",
            extra_compile_args=CXX_FLAGS,
            extra_link_args=["-Wl,--no-undefined"] if sys.platform.startswith("linux") else [],
        ),
        Pybind11Extension(
            "redpp_onnx._core",
            sources=["csrc/module.cc", "csrc/split_conv.cc"],
            depends=["csrc/split_conv.h", "csrc/split_conv_kernels.inc", "csrc/rans.h"],
            extra_compile_args=CXX_FLAGS,
            cxx_std=17,
        ),
    ],
    cmdclass={"build_ext": BuildExt},
)
