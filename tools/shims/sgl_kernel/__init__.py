"""Stand-in for SGLang's CPU kernel package: every attribute is a stub that raises when called."""


def _stub(name):
    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not available in the CPU shim")

    missing.__name__ = name
    return missing


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _stub(name)
