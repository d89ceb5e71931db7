"""The embedded Triton server: a real tritonserver from the nvidia-pytriton wheel, on loopback.

``backend_dir`` assembles the Python backend and its stub, ``server_config`` holds the flags,
``server`` runs, watches and stops the process (through ``tools.process``), ``server_log`` reads
its log, ``health`` probes it, ``command`` is ``tools serve``.
"""
