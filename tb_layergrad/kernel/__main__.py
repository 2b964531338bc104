"""`python -m tb_layergrad.kernel`: build the fused kernel now (e.g. in a Docker image) and print where."""

from tb_layergrad.kernel.fused import main

main()
