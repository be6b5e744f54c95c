"""Fixtures shared by several test modules."""
import numba
import pytest


@pytest.fixture(scope="module")
def one_numba_thread():
    """Run a module's kernels on one thread.  Bits never depend on the thread
    count; on a shared 2-core machine, thread start-up would dominate the many
    tiny kernels these modules launch.  Opt in with
    ``pytestmark = pytest.mark.usefixtures("one_numba_thread")``."""
    keep = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(keep)
