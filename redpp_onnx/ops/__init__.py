"""The ai.redpp custom operators: contract (schema), ONNX registration, numpy reference."""
