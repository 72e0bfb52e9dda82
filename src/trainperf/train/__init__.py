"""Reference trainer: model (model.py), data (data.py), layout (parallel.py), checkpoints
(checkpoint.py), the loop (trainer.py: ``TrainConfig``, ``train``) and torchrun launch (launch.py).

Kept import-light: `trainperf --help` imports this package, so torch loads only in the modules.
"""
