"""Plain NumPy functions behind the Python-backend models.

Nothing here imports ``triton_python_backend_utils``: every function is unit-tested without a
server, and the thin ``model.py`` files only translate between Triton tensors and these.
"""
