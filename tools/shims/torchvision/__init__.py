"""Stand-in for torchvision (its PyPI build is CUDA-linked and fails at import).

SGLang and transformers import torchvision names at module load for
multimodal models only. Every ``torchvision.*`` submodule resolves to a stub
module; every name in it is a class whose attributes are plain strings (so
``InterpolationMode.BICUBIC`` works at import time) and which raises when
instantiated or called.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+shim"


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"


def _stub_class(name):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"torchvision.{name} is not available in the CPU shim")

    return _StubMeta(name, (), {"__init__": refuse, "__call__": refuse})


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _stub_class(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr
        return module

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _StubFinder())
__getattr__ = _module_getattr
