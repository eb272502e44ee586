from torchvision import unavailable

__getattr__ = unavailable(__name__)
