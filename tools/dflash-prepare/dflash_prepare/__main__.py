"""`python3 -m dflash_prepare`: the same as the dflash-prepare command."""
import sys

from dflash_prepare.cli import main

sys.exit(main())
