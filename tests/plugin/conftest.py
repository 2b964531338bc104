"""The plugin room's shared fixture: the small logdir served in process, as TensorBoard serves the plugin."""

import pytest
from plugin_fixtures import InProcess


@pytest.fixture(scope="module")
def tb(small_logdir):
    """The layergrad plugin alone in a TensorBoard WSGI app over `small_logdir` (`plugin_fixtures.InProcess`)."""
    return InProcess(small_logdir.logdir)
