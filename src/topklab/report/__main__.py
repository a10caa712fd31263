"""``python -m topklab.report {tables,figures}``: see :mod:`topklab.report.cli`."""

import sys

from topklab.report.cli import main

sys.exit(main())
