import enum

from torchvision import unavailable
from torchvision.transforms import functional  # noqa: F401


class InterpolationMode(enum.Enum):
    """torchvision's values: transformers maps PIL's resampling modes to them."""
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__getattr__ = unavailable(__name__)
