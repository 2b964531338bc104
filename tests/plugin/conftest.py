"""The plugin room's shared fixtures: the small logdir served in process, as TensorBoard serves the plugin; the
weights of the dominated run and the runs with per-example records, one test each."""

import dominated_fixtures
import examples_fixtures
import plugin_fixtures
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


@pytest.fixture(params=[examples_fixtures.RUN, examples_fixtures.RENAMED])
def examples_run(request) -> str:
    """Each run with per-example records of tests/examples_fixtures.py: its fields in the written order, and renamed
    and reordered (one missing, one unknown), one test per run."""
    return request.param


@pytest.fixture(params=plugin_fixtures.HTTP_STATS)
def http_stat(request) -> str:
    """Each statistic the routes serve (docs/HTTP_API.md, `stat`), one test each."""
    return request.param
