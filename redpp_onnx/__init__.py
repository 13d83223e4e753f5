"""redpp-onnx: data-free compression of ONNX models (RED++).

Public API so far: :func:`session` and :func:`get_library_path` to run models that contain
the ``ai.redpp::SplitConv`` operator in onnxruntime. Importing the package registers the
SplitConv schema with onnx (checker and shape inference).
"""

from .ops import onnx_schema as _onnx_schema
from .runtime import get_library_path, session, session_options

__version__ = "0.1.0.dev0"
__all__ = ["get_library_path", "session", "session_options", "__version__"]

_onnx_schema.register()
