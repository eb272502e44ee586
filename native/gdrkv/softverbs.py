"""Where libsoftverbs.so is: the software libibverbs built with the package
(native/softverbs/), which lets the rdma transport run across processes on
a host without RDMA hardware:

    os.environ["GDRKV_IBVERBS_LIB"] = gdrkv.softverbs.library_path()

Its limits and strictness are described in native/softverbs/softverbs.h."""
import os

_NAME = "libsoftverbs.so"


def library_path():
    """The absolute path of libsoftverbs.so; RuntimeError when this build
    of gdrkv has none (it had no <infiniband/verbs.h>)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _NAME)
    if not os.path.isfile(path):
        raise RuntimeError(
            f"{_NAME} is not part of this gdrkv build: <infiniband/verbs.h> was missing when "
            "it was built (Debian/Ubuntu: apt-get install libibverbs-dev, then reinstall gdrkv)")
    return path
