"""Level 1: ONNX networks across backends: output agreement (`net check`), timing (`net bench`)."""
