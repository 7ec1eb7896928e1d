"""Adapters by name, imported lazily (libcloud's ``compute/providers.py::DRIVERS`` idea).

Why lazy: importing libcloud or the kubernetes client costs ~1 s and memory; a broker that only
runs simulated clusters, or the CLI's ``--help``, should not pay it.

``make_provider("aws", {"access_key_id": ..., ...})`` builds the typed options class from a plain
mapping (an accounts file, settings) and rejects unknown keys by name.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from providers.base import CloudProvider
from providers.errors import ConfigError

# name -> (module, provider class, options class)
PROVIDERS: dict[str, tuple[str, str, str]] = {
    "aws": ("providers.aws", "AwsProvider", "AwsOptions"),
    "gcp": ("providers.gcp", "GcpProvider", "GcpOptions"),
    "azure": ("providers.azure", "AzureProvider", "AzureOptions"),
    "simulated": ("providers.simulated_cloud", "SimulatedCloudProvider",
                  "SimulatedCloudOptions"),
}

# name -> (module, driver class); their constructors take their own typed arguments
CLUSTER_DRIVERS: dict[str, tuple[str, str]] = {
    "kubernetes": ("providers.kubernetes", "KubernetesDriver"),
    "simulated": ("providers.simulated", "SimulatedClusterDriver"),
}


def _load(module: str, attr: str) -> Any:
    return getattr(importlib.import_module(module), attr)


def provider_names() -> list[str]:
    return sorted(PROVIDERS)


def options_class(name: str) -> type[Any]:
    if name not in PROVIDERS:
        raise ConfigError(f"unknown provider {name!r} (known: {', '.join(provider_names())})")
    cls: type[Any] = _load(PROVIDERS[name][0], PROVIDERS[name][2])
    return cls


def build_options(name: str, values: Mapping[str, Any]) -> Any:
    """The typed options object for `name` from a plain mapping; unknown keys are named."""
    cls = options_class(name)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown option(s) for provider {name!r}: {', '.join(unknown)}",
                          provider=name)
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        return cls(**kw)
    except TypeError as exc:  # a required option is missing
        missing = [f.name for f in known.values()
                   if f.name not in kw and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"provider {name!r} needs option(s): {', '.join(missing)}",
                          provider=name) from exc


def make_provider(name: str, options: Mapping[str, Any] | Any) -> CloudProvider:
    """A CloudProvider by registry name, from an options object or a plain mapping."""
    opts = build_options(name, options) if isinstance(options, Mapping) else options
    cls = _load(PROVIDERS[name][0], PROVIDERS[name][1])
    provider: CloudProvider = cls(opts)
    return provider


def cluster_driver_class(name: str) -> type[Any]:
    if name not in CLUSTER_DRIVERS:
        raise ConfigError(
            f"unknown cluster driver {name!r} (known: {', '.join(sorted(CLUSTER_DRIVERS))})"
        )
    cls: type[Any] = _load(*CLUSTER_DRIVERS[name])
    return cls
