"""What the sandbox tests share: hosts that lack a namespace, and the script lines a harness uses to look.

``NoNamespaces`` and ``NoMountNamespace`` stand for hosts that cannot make a
network (or a mount) namespace; they are passed through the runner's
``namespaces`` seam, so the host's own probe is never replaced. ``READ_PATHS``
is Python source that sets ``seen`` to what the process sees at each of
``paths``: a folder's sorted names, a file's text, or the name of the error.
"""

from __future__ import annotations

from gyre.real.harness.sandbox import Namespaces


class NoNamespaces(Namespaces):
    """A host that can make no namespace at all."""

    def network(self) -> tuple[tuple[str, ...], str | None]:
        return (), "no namespaces in this test"


class NoMountNamespace(Namespaces):
    """A host that can make a network namespace (as probed) but no mount namespace."""

    def mount(self) -> tuple[tuple[str, ...], str | None]:
        return (), "no mount namespaces in this test"


READ_PATHS = r"""
seen = {}
for path in paths:
    try:
        seen[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
    except OSError as exc:
        seen[path] = type(exc).__name__
"""
