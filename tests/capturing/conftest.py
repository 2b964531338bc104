"""The capturing room's fixtures: every model kind of the zoo, as a parameter."""

import model_zoo
import pytest


@pytest.fixture(params=list(model_zoo.ALL))
def zoo_kind(request) -> str:
    """Each kind of model the capture must handle (tests/model_zoo.py's `ALL`), one test per kind."""
    return request.param
