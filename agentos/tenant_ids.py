"""How a tenant's ids are named inside the server: tenant `acme`'s `s1` is `acme~s1`, the default
tenant's ids are kept as they are (gateway/tenancy.py maps them at the edge; an actor maps an id a
flow names, such as a child's, with the run's own tenant)."""
from __future__ import annotations

DEFAULT_TENANT = "default"
SEPARATOR = "~"


def internal(tenant: str, external_id: str) -> str:
    return external_id if tenant == DEFAULT_TENANT else f"{tenant}{SEPARATOR}{external_id}"


def external(tenant: str, internal_id: str) -> str:
    prefix = f"{tenant}{SEPARATOR}"
    return internal_id[len(prefix):] if tenant != DEFAULT_TENANT and internal_id.startswith(prefix) else internal_id
