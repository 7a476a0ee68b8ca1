"""The package version and distribution (their own module so that any layer may read them without the package API)."""

from __future__ import annotations

__version__ = "0.1.0"

# The name on PyPI. `roformer` is taken there by JunnYu's RoFormer port, which installs an import package called
# `roformer` too: we keep the import name and publish under this one.
DISTRIBUTION = "roformer-pytorch"


def version_report() -> str:
    """What `roformer --version` prints: this package, its distribution, torch and transformers, and any clash.

    Read from the installed distributions' metadata, so that it imports neither torch nor transformers.
    """
    from importlib import metadata

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    lines = [
        f"roformer {__version__} (distribution {DISTRIBUTION}); torch {installed('torch')}, "
        f"transformers {installed('transformers')}, python {_python()}"
    ]
    others = sorted(set(metadata.packages_distributions().get("roformer", [])) - {DISTRIBUTION})
    if others:
        lines.append(
            f"warning: {', '.join(others)} also installs the import package `roformer` (JunnYu's RoFormer port is "
            "`roformer` on PyPI): the two overwrite each other's files; uninstall it (pip uninstall roformer) and "
            f"reinstall {DISTRIBUTION}"
        )
    return "\n".join(lines)


def _python() -> str:
    import platform

    return platform.python_version()
