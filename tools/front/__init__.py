"""The front: HAProxy in front of tritonserver on every path, and the SLO admission that drives it.

``plan`` reads what the front must know from a model repository, ``haproxy_config`` renders the
one HAProxy configuration every path runs (``tools serve``, both compose files, the Kubernetes
pod), ``admission`` and ``controller`` set each model's in-flight cap through HAProxy's runtime
API, and ``process`` runs HAProxy and the controller beside an embedded tritonserver.
"""
