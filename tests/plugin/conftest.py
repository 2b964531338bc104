"""The plugin room's shared fixtures: the small logdir served in process, as TensorBoard serves the plugin; the
weights of the dominated run, one test each."""

import dominated_fixtures
import pytest
from plugin_fixtures import InProcess


@pytest.fixture(scope="module")
def tb(small_logdir):
    """The layergrad plugin alone in a TensorBoard WSGI app over `small_logdir` (`plugin_fixtures.InProcess`)."""
    return InProcess(small_logdir.logdir)


@pytest.fixture(params=[dominated_fixtures.KERNEL, dominated_fixtures.BIAS, dominated_fixtures.HIDDEN_KERNEL])
def dominated_weight(request) -> str:
    """Each weight variable of the dominated run's output layer and of its hidden layer (tests/dominated_fixtures.py),
    one test per weight."""
    return request.param
