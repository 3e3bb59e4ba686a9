"""``edgespec info``: what this machine and install can run, in one report.

Every probe is allowed to fail: a missing or broken backend is reported as
such (with the reason), never as a traceback, since this is the command a
user runs when something does not work.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _llama_cpp() -> list[tuple[str, str]]:
    try:
        return _llama_cpp_rows()
    except Exception as exc:  # an install that cannot load its library, too
        return [("llama.cpp", f"cannot load: {exc}")]


def _llama_cpp_rows() -> list[tuple[str, str]]:
    import llama_cpp

    from ..backends.llama_lib import gpu_offload_supported, physical_core_count
    from ..backends.repack import describe as describe_repacking
    rows = [("llama.cpp", f"loads (llama-cpp-python {getattr(llama_cpp, '__version__', '?')})"),
            ("  GPU offload (-ngl)", "supported" if gpu_offload_supported()
             else "not in this build (CPU only; docs/gpu.md: rebuilding with CUDA or Metal)")]
    from ..backends.rpc import install_line
    rows.append(("  RPC (--rpc)", "supported: the target's layers can go to rpc-servers (docs/rpc.md)"
                 if llama_cpp.llama_supports_rpc()
                 else f"not in this build (for --rpc: {install_line()})"))
    devices = _ggml_devices()
    if devices:
        rows.append(("  devices", "; ".join(devices)))
    rows.append(("  default threads", f"{physical_core_count()} (physical cores)"))
    rows.append(("  weight repacking", describe_repacking()))
    from ..backends.kernels import describe as describe_kernels
    rows.append(("  kernels (--kernels)", describe_kernels()))
    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    rows.append(("  system info", info))
    return rows


def _ggml_devices() -> list[str]:
    """The ggml backend devices (CPU, CUDA0, Metal, ...), where the library exports them."""
    try:
        from ..backends.rpc import ggml_functions
        ggml = ggml_functions()
        devices = []
        for i in range(ggml.ggml_backend_dev_count()):
            dev = ggml.ggml_backend_dev_get(i)
            name = ggml.ggml_backend_dev_name(dev).decode(errors="replace")
            description = ggml.ggml_backend_dev_description(dev).decode(errors="replace")
            devices.append(f"{name} ({description})" if description and description != name else name)
        return devices
    except Exception:  # an older library without the device API: the system info says enough
        return []


def _mlx() -> list[tuple[str, str]]:
    try:
        return _mlx_rows()
    except Exception as exc:
        return [("MLX", f"cannot load: {exc}")]


def _mlx_rows() -> list[tuple[str, str]]:
    import mlx.core as mx
    rows = [("MLX", f"loads (mlx {_version('mlx')}, mlx-lm {_version('mlx-lm')})"),
            ("  default device", str(mx.default_device()))]
    try:
        metal = mx.metal.is_available()
    except Exception:
        metal = False
    rows.append(("  Metal", "available" if metal else "not available (MLX runs on the CPU)"))
    return rows


def report() -> list[tuple[str, str]]:
    """(label, value) rows: versions, platform, and what each backend can do here."""
    from ..paths import edgespec_home
    rows = [("edgespec", _version("edgespec")),
            ("python", f"{platform.python_version()} ({sys.executable})"),
            ("platform", f"{platform.system()} {platform.machine()}, {os.cpu_count()} logical CPUs"),
            ("numpy", _version("numpy")),
            ("edgespec home", f"{edgespec_home()} (models, calibrations; EDGESPEC_HOME moves it)")]
    return rows + _llama_cpp() + _mlx()


def print_report() -> None:
    rows = report()
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")


class VersionAction(argparse.Action):
    """``--version``: the versions, looked up only when asked for."""

    def __init__(self, option_strings, dest, **options):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **options)

    def __call__(self, parser, namespace, values, option_string=None):
        print(versions())  # (on stdout, as argparse's own --version)
        parser.exit(0)


def versions() -> str:
    """``edgespec 0.1.0 (llama-cpp-python 0.3.36, mlx 0.29.3)``: the packages that run
    the models, as installed (``not installed`` where one is not)."""
    from .. import __version__
    found = ", ".join(f"{package} {_version(package)}" for package in ("llama-cpp-python", "mlx"))
    return f"edgespec {__version__} ({found})"
