"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an
interpolated momentum, with decoupled weight decay. An entry's own optimizer file: d500 imports
it only in the process that trains (see the README's "Writing an optimizer")."""

from d500.training.optimizers import Hyper, Optimizer


class Lion(Optimizer):
    """p -= lr * (sign(beta1*m + (1-beta1)*g) + weight_decay*p);  m = beta2*m + (1-beta2)*g."""

    name = "lion"
    hyperparameters = {
        **Optimizer.hyperparameters,
        "lr": Hyper(3e-4, "positive", "base learning rate (3-10x below AdamW's)"),
        "beta1": Hyper(0.9, "fraction", "interpolation of the update's direction"),
        "beta2": Hyper(0.99, "fraction", "decay of the momentum"),
        "weight_decay": Hyper(0.0, "nonnegative", "decoupled weight decay"),
    }

    def init_state(self, ops, params, names):
        return {"m": ops.zeros_like(params)}

    def update(self, ops, params, grads, state, lr, t):
        m = state["m"]
        direction = ops.sign(ops.add(ops.mul(m, self.beta1), grads, 1 - self.beta1))
        if self.weight_decay:  # a hyperparameter: a Python branch is allowed
            ops.mul_(params, 1 - lr * self.weight_decay)
        ops.add_(params, direction, -lr)
        ops.lerp_(m, grads, 1 - self.beta2)
