# cffi_modules can only be declared here; everything else is in pyproject.toml.
#
# build_ext also builds libsoftverbs.so (native/softverbs/*.c), the software
# libibverbs the rdma transport is tested against, into the gdrkv package
# next to the cffi extension: build/lib*/gdrkv/ for a wheel, native/gdrkv/
# for an in-place or editable build. gdrkv.softverbs.library_path() finds
# it there. Without <infiniband/verbs.h> it is skipped with a notice.
import glob
import os
import sys
import tempfile

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

    def have_verbs_h(self):
        from setuptools.errors import CompileError
        with tempfile.TemporaryDirectory() as tmp:
            probe = os.path.join(tmp, "probe.c")
            with open(probe, "w") as f:
                f.write("#include <infiniband/verbs.h>\nint main(void) { return 0; }\n")
            try:
                self.compiler.compile([probe], output_dir=tmp)
            except CompileError:
                return False
        return True

    def build_softverbs(self):
        if not self.have_verbs_h():
            print("NOTICE: <infiniband/verbs.h> not found (Debian: libibverbs-dev): "
                  "libsoftverbs.so is not built and gdrkv.softverbs is unavailable")
            return
        cflags, ldflags = softverbs_flags()
        sources = sorted(glob.glob(os.path.join("native", "softverbs", "*.c")))
        objects = self.compiler.compile(
            sources, output_dir=os.path.join(self.build_temp, "softverbs"),
            extra_postargs=cflags, depends=glob.glob(os.path.join("native", "softverbs", "*.h")),
            debug=self.debug)
        out = self.softverbs_path()
        os.makedirs(os.path.dirname(out), exist_ok=True)
        self.compiler.link_shared_object(objects, out, libraries=["dl"], extra_postargs=ldflags)

    def get_outputs(self):
        return super().get_outputs() + [self.softverbs_path()]


setup(cffi_modules=["native/build_native.py:ffibuilder"],
      cmdclass={"build_ext": BuildExtWithSoftverbs})
