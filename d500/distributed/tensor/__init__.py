"""Tensor (model) parallelism: Megatron-style column/row splits of the ONNX graph's linear chains
(split), each rank's model run in segments between its allreduces (rank), as a level-3 scheme
(scheme)."""
