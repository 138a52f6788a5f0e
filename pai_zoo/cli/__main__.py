"""``python -m pai_zoo.cli``: the ``pai-zoo`` command (also under ``torchrun -m pai_zoo.cli``)."""
import sys

from . import main

sys.exit(main())
