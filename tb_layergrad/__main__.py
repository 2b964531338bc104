"""`python -m tb_layergrad ...`: the `tb-layergrad` command, where the script is not on PATH."""

import sys

from tb_layergrad.cli import main

if __name__ == "__main__":
    sys.exit(main())
