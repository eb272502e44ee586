"""Where libsoftverbs.so is: the software libibverbs built with the package
(native/softverbs/), which lets the rdma transport run across processes on
a host without RDMA hardware:

    os.environ["GDRKV_IBVERBS_LIB"] = gdrkv.softverbs.library_path()

Its limits and strictness are described in native/softverbs/softverbs.h."""
import os

_NAME = "libsoftverbs.so"


def library_path():
    """The absolute path of libsoftverbs.so; RuntimeError when this
    installation of gdrkv lacks it (built without setup.py's build_ext)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _NAME)
    if not os.path.isfile(path):
        raise RuntimeError(
            f"{_NAME} is not part of this gdrkv installation: reinstall gdrkv with pip, "
            "whose build_ext step builds it")
    return path
