"""Level 3: distributed training over MPI: communicator, compression, schemes, trainer,
scaling model."""
