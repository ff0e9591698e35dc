"""What d500 knows about one framework, readable without importing it: the hooks each framework's
folder fills in (its module and packages, its threads, its optimizers, its backward call, its
operator runner), so that nothing elsewhere keeps a table keyed by a framework's name.

    FRAMEWORK = Framework("torch", module="torch", distribution="torch",
                          optimizer_ops="d500.backends.torch.optimizer_ops", ...)

A framework's package (`d500/backends/<name>/__init__.py`, or its one module) defines
`FRAMEWORK` and imports the framework itself only when its backend class is asked for; a
third-party backend without one gets `Framework.of_backend(cls)`, from its class's attributes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class Framework:
    """One framework's facts and hooks; a framework overrides the thread hooks in a subclass."""

    name: str                         # the backend name of its default mode ("torch")
    module: str                       # the module it imports ("numpy" for the reference)
    distribution: str                 # whose version is provenance ("tensorflow-cpu")
    packages: tuple[str, ...] = ()    # further distributions recorded in provenance
    aliases: tuple[str, ...] = ()     # other names users give it ("keras", "optax")
    optimizer_ops: str | None = None  # module of the framework-neutral optimizers' ops: a
    # framework that trains has them (its backend class is `trainable`; a test checks both)
    native_optimizers: str | None = None  # "module:TABLE" of its framework-native twins
    native_checkpoints: bool = False  # level-2 checkpoints read its native optimizers' state
    backward: str | None = None       # "module:function" timing one operator's backward
    operator_runner: str | None = None  # "module:Class" running level-0 operators written in it
    autograd: bool = False            # it differentiates an operator's forward (no backward given)
    threads_when_loaded: bool = True  # configure() sets its threads whenever it is loaded
    tie_rank: int | None = None       # net check: who stands for a tied majority (lowest first)
    hidden: tuple[str, ...] = ()      # modules hidden while it imports (import_quietly): what
    # its import would load or start that d500 never asks of it
    about: str = ""                   # one line on its default mode (`d500 backends`)
    # its other modes, each with its one line: what its backend class's `modes` are, readable
    # without importing the framework
    modes: dict[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def of_backend(cls, backend: Any) -> Framework:
        """The facts a third-party backend class gives: its `framework` distribution (the
        module too), else ("?") the module the class lives in."""
        given = backend.framework
        return cls(backend.name.partition(":")[0], distribution=given,
                   module=backend.__module__ if given == "?" else given,
                   about=getattr(backend, "about", ""),
                   modes=dict(getattr(backend, "modes", {})))

    def distributions(self) -> tuple[str, ...]:
        """Every distribution whose version provenance records for it."""
        return (self.distribution, *self.packages)

    def hook(self, ref: str | None) -> Any:
        """The object a "module:attr" hook names (imported now); None for no hook."""
        if ref is None:
            return None
        module, _, attr = ref.partition(":")
        found = import_module(module)
        return getattr(found, attr) if attr else found

    # -- threads: set through the framework's API, read back for provenance --------------------
    def set_threads(self, n: int) -> None:
        """Give the framework `n` intra-op threads now (importing it); nothing by default (a
        framework that reads threads.recorded() per session or compiled model)."""

    def reports_threads(self) -> bool:
        """Whether threads.actual() lists it now (by default: once it is loaded)."""
        return self.module in sys.modules

    def default_threads(self, cpu: dict[str, Any]) -> tuple[int, str] | None:
        """The thread count the framework picks by itself on a machine `cpu` describes
        (provenance.cpu()) and what it is; None: its usable cores (reproduce infers the count of
        a run that recorded none so)."""
        return None

    def threads(self) -> Any:
        """The thread count the loaded framework reports; by default the configured one."""
        from d500 import threads
        setting = threads.recorded()
        return None if setting is None else setting["count"]
