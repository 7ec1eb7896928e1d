"""The one error tree for everything in `providers/`.

    ProviderError                      (provider, region, retryable)
    ├── AuthError                      bad or expired credentials; never retried
    ├── ThrottledError                 429 / RequestLimitExceeded; retried with backoff
    ├── TransientError                 5xx, timeouts, connection resets; retried
    ├── QuotaExceededError             a provider limit would be exceeded
    ├── NotFoundError                  unknown region, instance type, object
    ├── ConflictError                  409: exists already / changed underneath
    └── ConfigError                    malformed kubeconfig, missing setting

SDK errors (libcloud, kubernetes.ApiException, httpx) are mapped into this
tree once, at the adapter boundary, with ``raise ... from exc``. Messages
never contain credentials.
"""

from __future__ import annotations


class ProviderError(Exception):
    retryable_default = False

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        region: str = "",
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.region = region
        self.retryable = self.retryable_default if retryable is None else retryable

    def __str__(self) -> str:
        where = ":".join(p for p in (self.provider, self.region) if p)
        msg = super().__str__()
        return f"{where}: {msg}" if where else msg


class AuthError(ProviderError):
    pass


class ThrottledError(ProviderError):
    retryable_default = True


class TransientError(ProviderError):
    retryable_default = True


class QuotaExceededError(ProviderError):
    pass


class NotFoundError(ProviderError):
    pass


class ConflictError(ProviderError):
    pass


class ConfigError(ProviderError):
    pass
