"""Deployment stage: Kubernetes manifests rendered from the repository spec.

``tools deploy k8s`` (``command.py``) calls ``render.render_k8s``; the PromQL lives in ``promql``.
"""
