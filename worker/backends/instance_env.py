"""What of the worker's environment an instance may see: an allow-list (pure).

The worker's environment holds the platform's secrets (``DILU_CLUSTER_KEY``, ``DILU_ADMIN_KEY``,
a ``DILU_DATABASE_URL`` with its password) and whatever else its host set. An instance gets only
what a runtime needs from it (search path, locale, time zone, the device's and math libraries'
settings, the simulated device's knobs) plus names the operator passes on purpose
(``DILU_INSTANCE_ENV_PASS``); the function's spec and the worker's own instance settings are
added on top by the backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ALLOWED_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH", "SSL_CERT_FILE",
                           "SSL_CERT_DIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GLIBC_TUNABLES"})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "OPENBLAS_", "MALLOC_",
                    # the simulated GPU's and the shim's own knobs: settings, never secrets
                    "DILU_FAKE_", "DILU_SHIM_")


def allowed_env(environ: Mapping[str, str], passed: Iterable[str] = ()) -> dict[str, str]:
    """The variables of ``environ`` an instance may inherit: the allow-list and ``passed``."""
    extra = frozenset(passed)
    return {name: value for name, value in environ.items()
            if name in ALLOWED_NAMES or name in extra or name.startswith(ALLOWED_PREFIXES)}
