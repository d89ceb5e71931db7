"""The embedded Triton server: a real tritonserver from the nvidia-pytriton wheel, on loopback.

``backend_dir`` assembles the Python backend and its stub, ``server`` runs and stops the server,
``command`` is ``tools serve``.
"""
