"""`python3 -m dflash_plot`: the same as the dflash-plot command."""
import sys

from dflash_plot import main

sys.exit(main())
