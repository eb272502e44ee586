# cffi_modules can only be declared here; everything else is in pyproject.toml.
#
# build_ext also builds libsoftverbs.so (native/softverbs/*.c), the software
# libibverbs the rdma transport is tested against, into the gdrkv package
# next to the cffi extension: build/lib*/gdrkv/ for a wheel, native/gdrkv/
# for an in-place or editable build. gdrkv.softverbs.library_path() finds
# it there. Like the transport it needs no rdma-core headers: the verbs ABI
# is declared in native/common/verbs_abi.h.
import glob
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

SOFTVERBS = "libsoftverbs.so"


def softverbs_flags():
    """native/build_native.py's flags, position-independent: a plain shared
    library rather than a Python extension."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
    from build_native import compile_flags
    cflags, ldflags = compile_flags()
    return cflags + ["-fPIC"], ldflags


class BuildExtWithSoftverbs(build_ext):
    def run(self):
        super().run()
        self.build_softverbs()

    def softverbs_path(self):
        # get_ext_fullpath knows the package's directory, in place or not.
        return os.path.join(os.path.dirname(self.get_ext_fullpath("gdrkv._native")), SOFTVERBS)

    def build_softverbs(self):
        cflags, ldflags = softverbs_flags()
        sources = sorted(glob.glob(os.path.join("native", "softverbs", "*.c")))
        objects = self.compiler.compile(
            sources, output_dir=os.path.join(self.build_temp, "softverbs"),
            include_dirs=["native"], extra_postargs=cflags,
            depends=glob.glob(os.path.join("native", "softverbs", "*.h")) +
            [os.path.join("native", "common", "verbs_abi.h")],
            debug=self.debug)
        out = self.softverbs_path()
        os.makedirs(os.path.dirname(out), exist_ok=True)
        self.compiler.link_shared_object(objects, out, libraries=["dl"], extra_postargs=ldflags)

    def get_outputs(self):
        return super().get_outputs() + [self.softverbs_path()]


setup(cffi_modules=["native/build_native.py:ffibuilder"],
      cmdclass={"build_ext": BuildExtWithSoftverbs})
