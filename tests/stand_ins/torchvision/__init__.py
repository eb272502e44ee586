"""Import-only stand-in for torchvision (see tests/stand_ins/README.md)."""
__version__ = "0.0.0+stand.in"


def unavailable(module):
    """A module __getattr__ whose functions raise when called."""
    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            raise RuntimeError(f"{module}.{name}: torchvision is a test stand-in here")
        return call
    return getattr_


__getattr__ = unavailable(__name__)
