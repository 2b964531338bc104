"""`python -m tb_layergrad.kernel`: build the C++ now (e.g. in a Docker image) and print where: the fused op where
TensorFlow is installed, and the loops JAX's host callback runs (`host_records`, no TensorFlow needed)."""

import importlib.util

from tb_layergrad.kernel import host_records

if importlib.util.find_spec("tensorflow") is not None:
    from tb_layergrad.kernel.fused import main

    main()
host_records.main()
