"""Stand-ins for a host's modules, shared by the parity hosts and the
soundness harness's spec-built hosts.

A generated mixin checks, once per model, that what its spec calls under a
host module is a ``torch.nn.Module`` or bound to one (``_check_host_callees``);
the tests' fake towers, blocks and layers are therefore modules too, with
plain attributes otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class FakeModule(torch.nn.Module):
    """A stand-in for one of vLLM's modules (a tower, a block, a layer):
    a ``torch.nn.Module``, as the generated mixins check that what a spec
    calls under a host module is one, with plain attributes otherwise.

    Nothing is registered (no ``Module.__init__`` is needed, so fakes and
    classes taken from the wheel keep their own ``__init__``), and calling
    one runs its ``forward`` without torch's hooks machinery.
    """

    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__
    __dir__ = object.__dir__
    __repr__ = object.__repr__
    training = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


class ModuleOf(FakeModule):
    """A fake module made of ``attrs`` (submodules, tensors, sizes) whose
    call is ``forward`` where one is given: what a test writes as a lambda
    or an attribute bag where the host has a module (``nn.GELU``, a
    ``post_layernorm``, an ``embeddings`` holding a position table)."""

    def __init__(self, forward: Callable[..., Any] | None = None, **attrs: Any):
        self.__dict__.update(attrs)
        if forward is not None:
            self.forward = forward
