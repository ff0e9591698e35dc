"""Level 2: training under fixed rules: datasets, samplers, optimizers, trainer, tuning."""
