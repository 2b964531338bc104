"""`python -m tb_layergrad.kernel`: build the C++ now (e.g. in a Docker image) and print where: the fused op where
TensorFlow is installed, the loops without TensorFlow (`host_records`), and where JAX is installed the same loops
as the FFI handler its compiled step calls."""

import importlib.util

from tb_layergrad.kernel import host_records

if importlib.util.find_spec("tensorflow") is not None:
    from tb_layergrad.kernel.fused import main

    main()
host_records.main(with_jax=importlib.util.find_spec("jax") is not None)
