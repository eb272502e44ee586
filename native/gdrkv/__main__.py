"""python -m gdrkv: the gdrkv command line."""
import sys

from .cli import main

sys.exit(main())
