"""Pipeline parallelism: the ONNX graph cut into stages (partition), one stage per rank (stage),
micro-batches in GPipe or 1F1B order (schedule), run as a level-3 scheme (scheme)."""
