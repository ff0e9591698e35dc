"""Level-2 optimizers: framework-neutral optimizers written once, run on NumPy, torch and
TensorFlow; learning-rate schedules; framework-native twins; a submission's own optimizer.

    opt = make("adamw", lr=1e-3, weight_decay=0.01)   # ConfigError names a bad hyperparameter
    state = opt.init(params, "torch")                 # params: name -> tensor / tf.Variable
    s = schedule("cosine", warmup=0.05)
    for step in range(total):
        ...grads...
        opt.step(params, grads, state, opt.lr * s(step, total))    # params updated in place

    native("torch", "adamw", params, lr=1e-3)         # torch.optim.AdamW / a Keras optimizer
    cls = load_optimizer("submission/my_opt.py", "MyOpt"); opt = cls(lr=0.1)

The mechanism: each optimizer's update is written once against a small d500-owned *ops
namespace* (ops/numpy.py, ops/torch.py, ops/tensorflow.py: the same two dozen functions, each a
line or two), over *lists* of tensors, one per parameter (the shape of Deep500's three-step
optimizer: init_state ~ new_input, update ~ prepare_param + update_rule, but for all parameters
at once). Why this and not the alternatives:
- multi-tensor: on torch each op is one `torch._foreach_*` call, as torch.optim's own fast path,
  so the per-step Python overhead is that of torch.optim, not a loop over parameters; on
  TensorFlow the loop runs once, while tracing, and the update compiles into the trainer's
  tf.function with the forward and backward passes;
- in place: the array API (array-api-compat) has no in-place update and no variables, and
  TensorFlow's `tf.experimental.numpy` needs `experimental_enable_numpy_behavior()`, which
  changes dtype promotion for every TensorFlow op in the process (the TF backend included);
  an optimizer needs exactly "update this tensor/variable", which the ops namespace says once
  per framework (`_foreach_*_` on torch, `Variable.assign` on TensorFlow, `out=` on NumPy);
- Keras 3 ops serve one backend per process (KERAS_BACKEND), and d500 runs torch and
  TensorFlow side by side;
- small and checkable: the framework-specific part is ~150 lines per framework, each function
  obvious, and tests hold every optimizer on every framework against torch.optim / Keras and a
  written-out NumPy reference.
State lives in framework objects made at init (torch tensors; tf.Variables, so a step traced in
a tf.function updates them); the step counter and bias corrections stay Python numbers on torch
and NumPy (no tensor ops for them) and are computed in float64 on TensorFlow.
"""

from __future__ import annotations

from d500.training.optimizers.base import Hyper, Optimizer, State
from d500.training.optimizers.native import native, set_lr
from d500.training.optimizers.registry import OPTIMIZERS, load_optimizer, make
from d500.training.optimizers.schedules import SCHEDULES, Schedule, schedule

__all__ = ["OPTIMIZERS", "SCHEDULES", "Hyper", "Optimizer", "Schedule", "State", "load_optimizer",
           "make", "native", "schedule", "set_lr"]
