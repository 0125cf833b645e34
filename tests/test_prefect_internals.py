"""Prefect's internals that hashdist uses (flows/apiserver.py's PREFECT_INTERNALS) exist in the installed Prefect:
an upgrade that drops one fails here, naming the Prefect version and the missing piece."""

import importlib
from importlib.metadata import version

import pytest

from flows.apiserver import FLOW_RUN_ROUTERS, PREFECT_INTERNALS


@pytest.mark.parametrize(("module", "name", "used_for"), PREFECT_INTERNALS)
def test_each_prefect_internal_hashdist_uses_exists(module, name, used_for):
    found = getattr(importlib.import_module(module), name, None)
    assert found is not None, (f"Prefect {version('prefect')}: {module}.{name} is missing (hashdist uses it for "
                               f"{used_for})")


def test_the_routers_a_flow_run_calls_exist():
    import prefect.server.api as api

    missing = [name for name in FLOW_RUN_ROUTERS if not hasattr(getattr(api, name, None), "router")]
    assert missing == [], f"Prefect {version('prefect')}: prefect.server.api lacks the routers {missing}"
